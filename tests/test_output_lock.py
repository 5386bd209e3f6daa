"""One run at a time per output (:mod:`cxrground.io.output_lock`): a second run on an output another process is
writing is refused, naming it; the lock goes with its holder, however it ends."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.cli.common import error_text
from cxrground.io.output_lock import OutputBusyError, lock_path, locks_output, output_lock


def _holder(out, command: str = "holder") -> subprocess.Popen:
    """Another process holding the lock of ``out`` until it is killed (started once it holds it)."""
    code = textwrap.dedent(f"""
        import sys, time
        from cxrground.io.output_lock import output_lock
        with output_lock({str(out)!r}, {command!r}):
            print("held", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_until_the_holder_is_gone(tmp_path):
    out = tmp_path / "out"
    proc = _holder(out)
    try:
        busy = rf"{out} is being written by another run \(pid {proc.pid}, `"
        with pytest.raises(OutputBusyError, match=busy), output_lock(out, "test"):
            pass
        # another name of the same output is the same lock
        (tmp_path / "link").symlink_to(out, target_is_directory=True)
        out.mkdir()
        with pytest.raises(OutputBusyError), output_lock(tmp_path / "link", "test"):
            pass
    finally:
        proc.kill()  # a kill: the operating system releases the lock
        proc.wait()
    assert lock_path(out).exists()  # a killed holder leaves its file, not its lock
    with output_lock(out, "test"):
        assert "test" in lock_path(out).read_text()
    assert not lock_path(out).exists()  # a run that ends removes its file


def test_the_lock_is_reentrant_within_a_process_and_lies_beside_the_output(tmp_path):
    out = tmp_path / "out"
    with output_lock(out, "outer"):
        with output_lock(out, "inner"):
            assert lock_path(out).parent == tmp_path and lock_path(out).name == ".out.cxrground-lock"
        assert lock_path(out).exists()
    assert not lock_path(out).exists()


def test_a_decorated_writer_holds_the_lock_of_its_output_argument(tmp_path):
    seen = []

    @locks_output("writer", "out")
    def write(data: str, out, other: int = 0) -> str:
        seen.append(lock_path(out).exists())
        return data

    assert write("x", tmp_path / "o") == "x" and seen == [True]
    assert write.__name__ == "write"  # documented and introspected as itself


def test_a_busy_output_locked_through_a_stand_in_is_named_as_given(tmp_path):
    stage = tmp_path / "stage"  # what a bucket URL's build locks on this machine
    proc = _holder(stage)
    try:
        @locks_output("writer", "out", lambda out: stage)
        def write(out: str) -> None:
            pass

        with pytest.raises(OutputBusyError, match=r"^s3://bucket/out is being written by another run \(pid"):
            write("s3://bucket/out")
    finally:
        proc.kill()
        proc.wait()


def test_an_output_that_cannot_be_written_fails_before_the_work(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(out))

    monkeypatch.setattr("cxrground.io.output_lock.tempfile.TemporaryFile", refuse)
    with pytest.raises(PermissionError), output_lock(out, "test"):
        pytest.fail("the work ran")
    assert not lock_path(out).exists()


def test_file_system_errors_read_as_one_line_with_what_to_do():
    full = OSError(errno.ENOSPC, "No space left on device", "/data/ils/units/s1.json")
    assert error_text(full) == ("/data/ils/units/s1.json: No space left on device (free some space and rerun the "
                                "command; the batch commands resume where they stopped)")
    denied = PermissionError(errno.EACCES, "Permission denied", "/data/ils")
    assert "may not use that file or folder" in error_text(denied)
    assert error_text(OSError()) == "OSError"  # an error without a message still says something


def test_ils_build_on_an_output_another_run_is_writing_is_refused(tmp_path):
    out = tmp_path / "ils"
    cohort = tmp_path / "cohort"
    assert CliRunner().invoke(main, ["synth", "--out", str(cohort), "--studies", "1", "--quiet"]).exit_code == 0
    proc = _holder(out, "ils build")
    try:
        started = time.monotonic()
        r = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out", str(out), "--quiet"])
        assert r.exit_code == 1 and "is being written by another run" in r.output and "Traceback" not in r.output
        assert time.monotonic() - started < 30 and not (out / "settings.json").exists()
    finally:
        proc.kill()
        proc.wait()


def test_another_thread_is_refused_and_a_rank_other_than_0_takes_no_lock(tmp_path, monkeypatch):
    import threading

    out = tmp_path / "out"
    seen: list[BaseException | None] = []

    def other() -> None:
        try:
            with output_lock(out, "thread"):
                seen.append(None)
        except OutputBusyError as exc:
            seen.append(exc)

    with output_lock(out, "main"):
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
    assert isinstance(seen[0], OutputBusyError) and "another thread of this process" in str(seen[0])
    with output_lock(out, "main"):  # the refused thread left the lock as it was
        pass
    proc = _holder(out)
    try:
        monkeypatch.setenv("RANK", "1")  # a second rank of a torchrun launch: rank 0 holds the lock for the run
        monkeypatch.setenv("WORLD_SIZE", "2")
        with output_lock(out, "rank 1"):
            pass
    finally:
        proc.kill()
        proc.wait()


def test_an_output_whose_parent_cannot_be_written_is_locked_only_through_a_lock_file_there(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr("cxrground.io.output_lock.os.access", lambda *a, **k: False)
    with output_lock(out, "test"):  # no lock file can be made: the run goes on unlocked
        assert not lock_path(out).exists()
    monkeypatch.undo()
    proc = _holder(out)  # a user who can write there holds it
    try:
        monkeypatch.setattr("cxrground.io.output_lock.os.access", lambda *a, **k: False)
        with pytest.raises(OutputBusyError), output_lock(out, "test"):
            pass
    finally:
        proc.kill()
        proc.wait()
    with output_lock(Path("/"), "root"):  # a file-system root: no lock is taken
        assert not Path("/.cxrground-lock").exists()


def _holds(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (its file descriptors in /proc)."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd) == str(path):
                return True
    return False


def test_a_killed_runs_forked_workers_do_not_keep_its_lock(tmp_path):
    out = tmp_path / "out"
    code = textwrap.dedent(f"""
        import multiprocessing, os, time
        from cxrground.io.output_lock import output_lock
        with output_lock({str(out)!r}, "parent"):
            worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
            worker.start()
            print(worker.pid, flush=True)
            os._exit(0)  # as a kill: no clean-up, the lock file stays and the worker lingers
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    worker = int(proc.stdout.readline())
    proc.wait(60)  # the parent is gone; its worker lingers
    try:
        assert lock_path(out).exists()
        # the worker closes its copy right after the fork, when it is first scheduled (on a loaded machine, after
        # its parent has gone): wait for that, then the lock is free although the worker still runs
        deadline = time.time() + 30
        while _holds(worker, lock_path(out)) and time.time() < deadline:
            time.sleep(0.05)
        assert not _holds(worker, lock_path(out))
        with output_lock(out, "next run"):  # the lingering worker holds no copy of the lock
            pass
    finally:
        with contextlib.suppress(OSError):
            os.kill(worker, 9)


def test_a_rank_needs_a_world_of_more_than_one(tmp_path, monkeypatch):
    out = tmp_path / "out"
    proc = _holder(out)
    try:
        monkeypatch.setenv("RANK", "1")
        monkeypatch.delenv("WORLD_SIZE", raising=False)  # a stray RANK outside a launch: locked as usual
        with pytest.raises(OutputBusyError), output_lock(out, "stray rank"):
            pass
    finally:
        proc.kill()
        proc.wait()


def test_a_broken_pipe_is_left_to_click():
    from cxrground.cli.common import clean_errors

    @clean_errors()
    def write() -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        write()
