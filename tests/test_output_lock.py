"""One run at a time per output (:mod:`cxrground.io.output_lock`): a second run on an output another process is
writing is refused, naming it; the lock goes with its holder, however it ends."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
import time

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
                                "same command: it resumes where it stopped)")
    denied = PermissionError(errno.EACCES, "Permission denied", "/data/ils")
    assert "may not write there" in error_text(denied)


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
