"""The output folder of every export (:mod:`cxrground.io.export_dir`): refused when it holds files unless
``overwrite``; never holding a half-written export; never replaced when it holds files no export writes."""

from __future__ import annotations

import pytest

from cxrground.errors import ConfigError
from cxrground.io.export_dir import check_export_out, export_folder

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
