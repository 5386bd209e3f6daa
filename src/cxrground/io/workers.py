"""Process pools whose workers leave Ctrl-C to the parent.

A terminal's Ctrl-C sends SIGINT to the whole process group: each worker of a pool would raise its own
``KeyboardInterrupt`` and print its traceback (from whatever it was doing, importing included) before the parent's
one-line message. The workers of :func:`worker_pool` ignore SIGINT from their first instruction on (they are started
with it ignored, which a new Python process keeps, and the initializer ignores it again); the parent gets the
``KeyboardInterrupt``, and :func:`stop_workers` ends the workers that are still running.

Workers also end when their parent process ends, however it ends (``kill -9`` included), instead of living on as
orphans: on Linux the kernel sends them SIGKILL when their parent dies (``prctl(PR_SET_PDEATHSIG)``, set by the
worker's set-up), and everywhere a daemon thread of each worker looks every :data:`PARENT_POLL_S` seconds whether
its parent changed (:func:`exit_with_parent`). The parent is the process (on Linux: the thread) that started the
worker, so a pool is used from the thread that made it.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

__all__ = ["PARENT_POLL_S", "exit_with_parent", "stop_workers", "worker_pool"]

#: How often (seconds) a worker's watch thread looks whether its parent process is still there.
PARENT_POLL_S = 1.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc: ask the process itself
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but another user's (a reused pid)
        return True
    return True


def _set_pdeathsig() -> bool:
    """Ask the Linux kernel to send this process SIGKILL when its parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int, creator: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent or not _alive(creator):  # re-parented, or the process behind a fork server died
            os._exit(1)


def exit_with_parent(creator: int, pdeathsig: bool = True) -> None:
    """Make this process end when its parent ends: SIGKILL from the kernel on Linux (``pdeathsig``), and a daemon
    thread that exits the process once its parent changed or ``creator`` ended (every :data:`PARENT_POLL_S` s).
    ``creator``: the pid of the process that asked for this one (the parent, or for a fork server's child the
    process behind it); the process exits at once when that one is already gone (killed while this one started)."""
    parent = os.getppid()
    if pdeathsig:
        _set_pdeathsig()
    if not _alive(creator) or os.getppid() != parent:  # the parent died before the above took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent, creator), daemon=True, name="cxrground-parent-watch").start()


def _set_up_worker(creator: int, initializer: Callable[..., object] | None, initargs: tuple[Any, ...]) -> None:
    """A worker's set-up: SIGINT ignored, ended with its parent (:func:`exit_with_parent`), then
    ``initializer(*initargs)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(creator)
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
    """A pool of ``workers`` processes that ignore SIGINT and end with this process, each set up by
    ``initializer(*initargs)``; ``context``: the multiprocessing start method (None: the platform's default)."""
    return _QuietPool(max_workers=workers, mp_context=mp.get_context(context), initializer=_set_up_worker,
                      initargs=(os.getpid(), initializer, initargs))


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued calls of ``pool`` and end its worker processes (on Ctrl-C, or when a call stopped the run):
    workers that ignore SIGINT would otherwise finish their calls before the pool shuts down."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
