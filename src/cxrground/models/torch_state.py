"""Training functions change process-wide torch settings (threads, deterministic algorithms) for
reproducibility; :func:`restores_torch_settings` puts them back when the function returns or raises,
so calling a trainer from a notebook or a test leaves the caller's torch as it was."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["restores_torch_settings"]

P = ParamSpec("P")
R = TypeVar("R")


def restores_torch_settings(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator: restore torch's thread count and deterministic-algorithms flag after ``fn``."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        import torch

        threads = torch.get_num_threads()
        deterministic = torch.are_deterministic_algorithms_enabled()
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(deterministic)

    return wrapper
