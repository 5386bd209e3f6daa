"""Process pools whose workers leave Ctrl-C to the parent (``cxrground.io.workers``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cxrground.io.workers import PARENT_POLL_S, stop_workers, worker_pool


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


_POOL_PARENT = """
import os, sys, time
from cxrground.io.workers import worker_pool

if __name__ == "__main__":
    pool = worker_pool(2, context=None if sys.argv[1] == "default" else sys.argv[1])
    for f in [pool.submit(os.getpid) for _ in range(4)]:
        f.result(timeout=60)
    busy = [pool.submit(time.sleep, 60) for _ in range(2)]  # the workers are busy when the parent dies
    print(*pool._processes, flush=True)
    time.sleep(60)
"""

_SLOW_START_PARENT = """
import os, sys, time
from cxrground.io.workers import worker_pool

if __name__ == "__mp_main__":  # a worker importing this: still starting when its parent is killed
    time.sleep(3)
if __name__ == "__main__":
    pool = worker_pool(2, context="spawn")
    busy = [pool.submit(time.sleep, 60) for _ in range(2)]
    print(*pool._processes, flush=True)
    time.sleep(60)
"""

_WATCHED_PARENT = """
import subprocess, sys, time
code = ("import os, time; from cxrground.io.workers import exit_with_parent; "
        "exit_with_parent(os.getppid(), pdeathsig=False); print('ready', flush=True); time.sleep(60)")
child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
print(child.pid, flush=True)
time.sleep(60)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for a reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _kill_parent_and_wait(script: str, tmp_path, *args: str, within: float = 8.0, reap: bool = True) -> list[int]:
    """Run ``script`` as a parent process, read the pids it prints, kill -9 it and return the pids still running
    after ``within`` seconds (polled); ``reap=False`` leaves the killed parent a zombie meanwhile (as an init that
    does not reap does)."""
    path = tmp_path / "parent.py"
    path.write_text(script, encoding="utf-8")
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    parent = subprocess.Popen([sys.executable, str(path), *args], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert pids and all(_running(p) for p in pids)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        if reap:
            parent.wait(timeout=10)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if _running(p)]
    for p in left:  # do not leave them behind when the test fails
        os.kill(p, signal.SIGKILL)
    parent.wait(timeout=10)
    return left


def test_pool_workers_end_when_their_parent_is_killed(tmp_path) -> None:
    for context in ("spawn", "default"):
        assert _kill_parent_and_wait(_POOL_PARENT, tmp_path, context) == [], context


def test_workers_still_starting_when_their_parent_is_killed_end_too(tmp_path) -> None:
    """The parent dies (and stays an unreaped zombie) before the workers' set-up runs: they end once it runs."""
    assert _kill_parent_and_wait(_SLOW_START_PARENT, tmp_path, within=10.0, reap=False) == []


def test_the_watch_thread_ends_a_child_without_pdeathsig(tmp_path) -> None:
    """The portable fallback alone (no prctl): a child whose parent is killed exits within a few polls."""
    assert _kill_parent_and_wait(_WATCHED_PARENT, tmp_path, within=5 * PARENT_POLL_S + 3) == []
