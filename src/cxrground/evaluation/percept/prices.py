"""Price tables for cost logging, USD per 1M tokens: the reference one (CHEXPERCEPT.md §17) and user files.

:data:`PRICES` is the built-in table. :func:`load_prices` reads a user table (``percept eval --prices
FILE``) and :func:`price_table` merges it over the built-in one (a user row replaces the built-in row of the
same model). Formats, one row per model, prices in USD per 1M tokens (finite, >= 0):

- CSV with a header ``model,input,cached_input,output`` (``cached_input`` may be left out or empty: cached
  input tokens are then billed at the input price);
- JSON, either ``{"MODEL": {"input": .., "cached_input": .., "output": ..}, ...}`` or a list of objects
  ``[{"model": "MODEL", "input": .., ...}, ...]``.

Model names match case-insensitively, on the full name or its last path component (``Qwen/Qwen3.6-27B``
matches a row ``qwen3.6-27b``).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple

from cxrground.errors import InputError

__all__ = ["PRICES", "Price", "cost_usd", "load_prices", "price_of", "price_table"]


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
_FIELDS: Final[tuple[str, ...]] = ("input", "cached_input", "output")


def price_of(model: str, table: Mapping[str, Price] = PRICES) -> Price | None:
    """The entry of ``model`` in ``table`` (exact name, or the last path component, case-insensitive), else None."""
    name = model.strip().lower()
    return table.get(name) or table.get(name.rsplit("/", 1)[-1])


def cost_usd(price: Price, usage: Mapping[str, int]) -> float:
    """Cost of ``usage`` (prompt_tokens incl. cached_tokens, completion_tokens)."""
    cached = usage.get("cached_tokens", 0)
    fresh = max(0, usage.get("prompt_tokens", 0) - cached)
    return (fresh * price.input + cached * price.cached_input + usage.get("completion_tokens", 0) * price.output) / 1e6


def _number(value: Any, what: str, path: Path) -> float:
    if isinstance(value, bool) or value is None:
        raise InputError(f"{what} must be a number, got {value!r}", path)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a number, got {value!r}", path) from None
    if not math.isfinite(number) or number < 0:
        raise InputError(f"{what} must be a finite number >= 0, got {value!r}", path)
    return number


def _row(row: Mapping[str, Any], where: str, path: Path) -> tuple[str, Price]:
    """(lower-case model name, price) of one row."""
    model = row.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InputError(f"{where}: no model name", path)
    unknown = sorted(set(row) - {"model", *_FIELDS})
    if unknown:
        raise InputError(f"{where}: unknown field(s) {', '.join(unknown)} (expected model, {', '.join(_FIELDS)})", path)
    for key in ("input", "output"):
        if row.get(key) in (None, ""):
            raise InputError(f"{where} ({model}): no {key} price", path)
    price_in = _number(row["input"], f"{where} ({model}) input", path)
    cached = row.get("cached_input")
    cached_in = price_in if cached in (None, "") else _number(cached, f"{where} ({model}) cached_input", path)
    return model.strip().lower(), Price(price_in, cached_in, _number(row["output"], f"{where} ({model}) output", path))


def _rows(path: Path, text: str) -> list[tuple[str, Mapping[str, Any]]]:
    """(where, row) of every row of a CSV or JSON price file."""
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is None or "model" not in reader.fieldnames:
            raise InputError(f"the CSV header must be model,{','.join(_FIELDS)}", path)
        return [(f"row {n}", {k: v for k, v in row.items() if k is not None})
                for n, row in enumerate(reader, start=2)]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"price file is not valid JSON ({exc}); use .csv for CSV", path) from None
    if isinstance(data, dict):
        rows = []
        for model, entry in data.items():
            if not isinstance(entry, dict):
                raise InputError(f"entry {model!r} must be an object {{input, cached_input, output}}", path)
            rows.append((f"entry {model!r}", {"model": model, **entry}))
        return rows
    if isinstance(data, list) and all(isinstance(r, dict) for r in data):
        return [(f"item {n}", r) for n, r in enumerate(data)]
    raise InputError("price JSON must be an object {model: {input, cached_input, output}} or a list of objects", path)


def load_prices(path: str | Path) -> dict[str, Price]:
    """The price table in ``path`` (CSV or JSON, see the module docstring); raises :class:`InputError`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError("price file not found", path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the price file ({exc})", path) from None
    table: dict[str, Price] = {}
    for where, row in _rows(path, text):
        model, price = _row(row, where, path)
        if model in table:
            raise InputError(f"{where}: model {model!r} is listed twice", path)
        table[model] = price
    if not table:
        raise InputError("the price file lists no model", path)
    return table


def price_table(path: str | Path | None = None) -> dict[str, Price]:
    """The built-in table, with the rows of the file ``path`` (when given) replacing or adding models."""
    return {**PRICES, **(load_prices(path) if path is not None else {})}
