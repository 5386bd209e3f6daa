"""Training functions change process-wide torch settings (threads, deterministic algorithms) for
reproducibility; :func:`restores_torch_settings` puts them back when the function returns or raises,
so calling a trainer from a notebook or a test leaves the caller's torch as it was. :func:`use_threads` sets the
thread count of a whole command (the CLI's ``--threads``)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["restores_torch_settings", "use_threads"]

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


def use_threads(threads: int) -> None:
    """Make torch (and OpenMP) use ``threads`` intra-op threads in this process and in the worker processes it
    starts: ``OMP_NUM_THREADS`` is set (torch reads it when first imported; spawned workers inherit it) and, when
    torch is already imported, :func:`torch.set_num_threads` too. torch is not imported here."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    os.environ["OMP_NUM_THREADS"] = str(int(threads))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(int(threads))
