"""The output folder of every export (:mod:`cxrground.io.export_dir`): refused when it holds files unless
``overwrite``; never holding a half-written export; never replaced when it holds files no export writes."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cxrground.errors import ConfigError
from cxrground.io.export_dir import check_export_out, export_folder
from cxrground.io.output_lock import OutputBusyError

NAMES = ("data", "README.md")


def test_a_complete_export_replaces_the_earlier_one_and_a_failed_one_changes_nothing(tmp_path):
    out = tmp_path / "deep" / "out"
    with export_folder(out, False, NAMES, "test") as stage:
        assert stage.parent == out.parent and not any(stage.iterdir()) and not out.exists()
        (stage / "data").mkdir()
        (stage / "data" / "old").write_text("1")
    assert (out / "data" / "old").read_text() == "1"
    with pytest.raises(RuntimeError), export_folder(out, True, NAMES, "test") as stage:
        (stage / "README.md").write_text("half")
        raise RuntimeError("killed")
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]
    assert [p.name for p in out.iterdir()] == ["data"]
    with export_folder(out, True, NAMES, "test") as stage:
        (stage / "README.md").write_text("new")
    assert [p.name for p in out.iterdir()] == ["README.md"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]


def test_refusals_name_the_folder_and_keep_what_is_not_an_export(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("mine")
    with pytest.raises(ConfigError, match=rf"{out} is not empty.*--overwrite"):
        check_export_out(out, False, NAMES, "test")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"not part of a test export \(notes.txt\)"):
        check_export_out(out, True, NAMES, "test")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a folder"):
        check_export_out(tmp_path / "file", True, NAMES, "test")
    with export_folder(tmp_path / "empty", False, NAMES, "test") as stage:  # an empty or new folder needs nothing
        (stage / "data").mkdir()
    assert (tmp_path / "empty" / "data").is_dir()


def _unmovable(monkeypatch, folder, code: int = errno.EBUSY) -> None:
    """Make ``folder`` fail to be renamed as a mount point does (``code``)."""
    rename = Path.rename

    def refuse(self, target):
        if self == folder:
            raise OSError(code, os.strerror(code), str(self))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", refuse)


def test_an_empty_out_that_cannot_be_renamed_is_filled_in_place(tmp_path, monkeypatch):
    out = tmp_path / "mnt"
    out.mkdir()
    _unmovable(monkeypatch, out)
    with export_folder(out, False, NAMES, "test") as stage:
        (stage / "data").mkdir()
        (stage / "data" / "part").write_text("1")
        (stage / "README.md").write_text("card")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "data"]
    assert (out / "data" / "part").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]  # no staging folder, no lock file left


def test_a_failed_move_into_place_removes_the_staging_folder_and_names_out(tmp_path, monkeypatch):
    out = tmp_path / "mnt"
    out.mkdir()
    (out / "README.md").write_text("earlier")
    _unmovable(monkeypatch, out, errno.EPERM)
    with pytest.raises(ConfigError, match=rf"cannot replace {out}: Operation not permitted"), \
            export_folder(out, True, NAMES, "test") as stage:
        (stage / "README.md").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]
    assert (out / "README.md").read_text() == "earlier"

    def no_move(src, dst):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM), dst)

    (out / "README.md").unlink()
    monkeypatch.setattr(shutil, "move", no_move)
    with pytest.raises(ConfigError, match=rf"cannot write {out}: it cannot be replaced.*nor filled in place"), \
            export_folder(out, False, NAMES, "test") as stage:
        (stage / "README.md").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"] and not any(out.iterdir())


def test_an_unwritable_parent_or_a_linked_out_is_refused_naming_out(tmp_path, monkeypatch):
    target = tmp_path / "real"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    with pytest.raises(ConfigError, match=rf"{link} is a symbolic link \(to {target}\)"):
        check_export_out(link, False, NAMES, "test")
    parent = tmp_path / "locked"
    parent.mkdir()
    out = parent / "out"
    mkdir = Path.mkdir

    def refuse(self, *args, **kwargs):  # a parent folder this user may not write in (root may write any)
        if self.parent == parent and self.name != "out":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(ConfigError, match=rf"cannot write {out}: Permission denied \(in {parent}\)") as info, \
            export_folder(out, False, NAMES, "test"):
        pass
    assert ".export." not in str(info.value)
    assert not any(parent.iterdir())


def test_a_second_export_to_the_same_out_meanwhile_is_refused_naming_the_first(tmp_path):
    out = tmp_path / "out"
    code = textwrap.dedent(f"""
        import time
        from cxrground.io.export_dir import export_folder
        with export_folder({str(out)!r}, False, ("data",), "test") as stage:
            print("staged", flush=True)
            time.sleep(60)
    """)
    first = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "staged"
        with pytest.raises(OutputBusyError, match=rf"{out} is being written by another run \(pid {first.pid}, "), \
                export_folder(out, False, NAMES, "test"):
            pass
    finally:
        first.kill()
        first.wait()
    with export_folder(out, False, NAMES, "test") as stage:  # the lock goes with its holder
        (stage / "data").mkdir()
    assert (out / "data").is_dir()
