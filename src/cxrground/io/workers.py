"""Process pools whose workers leave Ctrl-C to the parent.

A terminal's Ctrl-C sends SIGINT to the whole process group: each worker of a pool would raise its own
``KeyboardInterrupt`` and print its traceback (from whatever it was doing, importing included) before the parent's
one-line message. The workers of :func:`worker_pool` ignore SIGINT from their first instruction on (they are started
with it ignored, which a new Python process keeps, and the initializer ignores it again); the parent gets the
``KeyboardInterrupt``, and :func:`stop_workers` ends the workers that are still running.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

__all__ = ["stop_workers", "worker_pool"]


def _ignore_sigint(initializer: Callable[..., object] | None, initargs: tuple[Any, ...]) -> None:
    """A worker's set-up: SIGINT ignored, then ``initializer(*initargs)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process while the block runs (only the main thread may change it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _QuietPool(ProcessPoolExecutor):
    """A :class:`ProcessPoolExecutor` that starts its workers (on ``submit``) with SIGINT ignored."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with _sigint_ignored():
            return super().submit(fn, *args, **kwargs)


def worker_pool(workers: int, initializer: Callable[..., object] | None = None, initargs: tuple[Any, ...] = (),
                context: str | None = "spawn") -> ProcessPoolExecutor:
    """A pool of ``workers`` processes that ignore SIGINT, each set up by ``initializer(*initargs)``; ``context``: the
    multiprocessing start method (None: the platform's default)."""
    return _QuietPool(max_workers=workers, mp_context=mp.get_context(context), initializer=_ignore_sigint,
                      initargs=(initializer, initargs))


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued calls of ``pool`` and end its worker processes (on Ctrl-C, or when a call stopped the run):
    workers that ignore SIGINT would otherwise finish their calls before the pool shuts down."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
