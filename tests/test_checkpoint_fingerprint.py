"""The checkpoint fingerprint that guards `ils predict` resumes and `percept eval`'s response cache: other weights of
the same size are another checkpoint; durations recorded by training are not part of it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cxrground.models.base import checkpoint_fingerprint


def _checkpoint(folder: Path, weights: bytes, seconds: float = 1.5) -> Path:
    folder.mkdir()
    (folder / "checkpoint.json").write_text(json.dumps({"model": "baseline", "history": [
        {"epoch": 1, "loss": 0.5, "seconds": seconds}], "training": {"train_seconds": seconds * 3}}))
    (folder / "weights.safetensors").write_bytes(weights)
    return folder


def test_other_weights_of_the_same_size_are_another_checkpoint(tmp_path) -> None:
    rng = np.random.default_rng(0)
    small = rng.bytes(4096)
    a = _checkpoint(tmp_path / "a", small)
    b = _checkpoint(tmp_path / "b", small[:-1] + bytes([small[-1] ^ 1]))
    assert checkpoint_fingerprint(a) != checkpoint_fingerprint(b)
    big = bytearray(rng.bytes(20 * 2**20))  # sampled, not read whole: a fine-tune changes every block
    c = _checkpoint(tmp_path / "c", bytes(big))
    big[len(big) // 2 : len(big) // 2 + 2**20] = rng.bytes(2**20)
    d = _checkpoint(tmp_path / "d", bytes(big))
    assert checkpoint_fingerprint(c) != checkpoint_fingerprint(d)


def test_identical_trainings_have_one_fingerprint_whatever_they_took(tmp_path) -> None:
    weights = np.random.default_rng(1).bytes(4096)
    a = _checkpoint(tmp_path / "a", weights, seconds=1.5)
    b = _checkpoint(tmp_path / "b", weights, seconds=7.25)  # only the durations differ
    assert checkpoint_fingerprint(a) == checkpoint_fingerprint(b)
    (b / "predictions.jsonl").write_text("{}\n")  # files written beside the weights do not count
    (a / "train_state.pt").write_bytes(b"resume state, with durations 1.5")  # nor the resume state
    (b / "train_state.pt").write_bytes(b"resume state, with durations 7.25")
    assert checkpoint_fingerprint(a) == checkpoint_fingerprint(b)
    info = json.loads((b / "checkpoint.json").read_text())
    info["history"][0]["loss"] = 0.4  # what training made does count
    (b / "checkpoint.json").write_text(json.dumps(info))
    assert checkpoint_fingerprint(a) != checkpoint_fingerprint(b)


def test_weights_in_other_formats_and_listed_files_count(tmp_path) -> None:
    folder = _checkpoint(tmp_path / "a", b"unchanged")
    before = checkpoint_fingerprint(folder)
    np.savez(folder / "head.npz", frac=np.array([0.3]))  # a plug-in backend's NumPy weights
    with_npz = checkpoint_fingerprint(folder)
    np.savez(folder / "head.npz", frac=np.array([0.05]))  # retrained
    assert len({before, with_npz, checkpoint_fingerprint(folder)}) == 3
    info = json.loads((folder / "checkpoint.json").read_text())
    (folder / "parts").mkdir()
    (folder / "parts" / "model.weights").write_bytes(b"v1")  # no weight suffix, in a subfolder: listed
    (folder / "checkpoint.json").write_text(json.dumps({**info, "weight_files": ["parts/model.weights"]}))
    listed = checkpoint_fingerprint(folder)
    (folder / "parts" / "model.weights").write_bytes(b"v2")
    assert checkpoint_fingerprint(folder) != listed
    (folder / "parts" / "model.weights").unlink()  # a listed file gone is another checkpoint, not an error
    assert checkpoint_fingerprint(folder) not in (listed, before)
