"""Reference price table for cost logging (CHEXPERCEPT.md §17), USD per 1M tokens."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, NamedTuple

__all__ = ["PRICES", "Price", "cost_usd", "price_of"]


class Price(NamedTuple):
    """USD per 1M tokens: input, cached input, output."""

    input: float
    cached_input: float
    output: float


PRICES: Final[dict[str, Price]] = {
    "gemini-3.1-pro-preview": Price(2.0, 0.2, 12.0),
    "gemini-3.1-flash-lite-preview": Price(0.25, 0.025, 1.5),
    "gpt-5.4": Price(2.5, 0.25, 15.0),
    "gpt-5.4-nano": Price(0.2, 0.02, 1.25),
}


def price_of(model: str) -> Price | None:
    """The entry of ``model`` (exact name, or the last path component, case-insensitive), else None."""
    name = model.strip().lower()
    return PRICES.get(name) or PRICES.get(name.rsplit("/", 1)[-1])


def cost_usd(price: Price, usage: Mapping[str, int]) -> float:
    """Cost of ``usage`` (prompt_tokens incl. cached_tokens, completion_tokens)."""
    cached = usage.get("cached_tokens", 0)
    fresh = max(0, usage.get("prompt_tokens", 0) - cached)
    return (fresh * price.input + cached * price.cached_input + usage.get("completion_tokens", 0) * price.output) / 1e6
