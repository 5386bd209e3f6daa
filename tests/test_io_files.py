"""The shared file helpers: atomic writes (one temp-name scheme, old file kept on failure) and hashes."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from cxrground.io import files
from cxrground.io.files import (
    atomic_path,
    atomic_write_bytes,
    atomic_write_text,
    finite_json,
    sha256_bytes,
    sha256_file,
    sha256_json,
    temp_path,
)


def test_temp_path_is_a_hidden_sibling_named_by_pid(tmp_path: Path):
    target = tmp_path / "sub" / "card.md"
    assert temp_path(target) == tmp_path / "sub" / f".card.md.{os.getpid()}.tmp"


@pytest.mark.parametrize("fsync", [False, True])
def test_atomic_write_creates_folders_replaces_and_leaves_no_temp(tmp_path: Path, fsync: bool):
    target = tmp_path / "a" / "b" / "x.json"
    assert atomic_write_text(target, "first\n", fsync=fsync) == target
    atomic_write_text(target, "é second\n", fsync=fsync)
    assert target.read_bytes() == "é second\n".encode()
    atomic_write_bytes(target, b"\x00\x01", fsync=fsync)
    assert target.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.json"]


def test_text_is_written_without_newline_translation(tmp_path: Path):
    atomic_write_text(tmp_path / "t.txt", "a\nb\r\n", encoding="latin-1")
    assert (tmp_path / "t.txt").read_bytes() == b"a\nb\r\n"


def test_a_failing_writer_keeps_the_old_file_and_removes_the_temp(tmp_path: Path):
    target = tmp_path / "weights.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="killed"), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["weights.bin"]


def test_a_failing_rename_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    target = tmp_path / "unit.json"
    target.write_text("old")

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(files.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk gone"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["unit.json"]


def test_atomic_path_hands_a_path_to_streaming_writers(tmp_path: Path):
    target = tmp_path / "model.safetensors"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and not tmp.exists()
        with tmp.open("wb") as fh:
            fh.write(b"abc")
        assert not target.exists()
    assert target.read_bytes() == b"abc"


def test_hashes_agree_with_hashlib(tmp_path: Path):
    data = os.urandom(3 << 20)  # more than one read chunk
    (tmp_path / "blob").write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert sha256_file(tmp_path / "blob") == want == sha256_bytes(data)


def test_sha256_json_is_the_canonical_json_digest():
    value = {"b": [1, 2.5, "é"], "a": {"y": None, "x": True}}
    want = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
    assert sha256_json(value) == want
    assert sha256_json({"a": {"x": True, "y": None}, "b": [1, 2.5, "é"]}) == want
    assert sha256_json({"a": 1}) != sha256_json({"a": 2})
    with pytest.raises(TypeError):
        sha256_json({"p": Path("x")})
    assert sha256_json({"p": Path("x")}, default=str) == sha256_json({"p": "x"})


def test_finite_json_writes_nan_and_infinities_as_null():
    import json
    import math

    value = {"a": float("nan"), "b": [1.5, float("inf"), {"c": -math.inf}], "d": (2, "x"), "e": None}
    assert finite_json(value) == {"a": None, "b": [1.5, None, {"c": None}], "d": [2, "x"], "e": None}
    json.dumps(finite_json(value), allow_nan=False)  # standard JSON
