"""Process pools whose workers leave Ctrl-C to the parent (``cxrground.io.workers``)."""

from __future__ import annotations

import os
import signal
import time

from cxrground.io.workers import stop_workers, worker_pool


def _sigint_and_pid() -> tuple[bool, int]:
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN, os.getpid()


def _survives_sigint() -> str:
    os.kill(os.getpid(), signal.SIGINT)  # what a terminal's Ctrl-C sends to every process of the group
    time.sleep(0.2)
    return "finished"


def _sleep(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_workers_ignore_sigint_and_the_parent_keeps_its_handler() -> None:
    before = signal.getsignal(signal.SIGINT)
    for context in ("spawn", None):
        with worker_pool(2, context=context) as pool:
            ignored, pid = pool.submit(_sigint_and_pid).result(timeout=60)
            assert ignored and pid != os.getpid()
            assert pool.submit(_survives_sigint).result(timeout=60) == "finished"
        assert signal.getsignal(signal.SIGINT) is before


def test_stop_workers_ends_the_calls_at_once() -> None:
    pool = worker_pool(1, context=None)
    running = pool.submit(_sleep, 30)
    queued = pool.submit(_sleep, 30)
    time.sleep(0.5)
    started = time.perf_counter()
    stop_workers(pool)
    pool.shutdown(wait=True)
    assert time.perf_counter() - started < 10  # not the 30 s of the calls
    assert running.exception(timeout=10) is not None and (queued.cancelled() or queued.exception(timeout=10))
