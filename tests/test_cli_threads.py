"""``--threads`` on every command that runs torch: the value reaches torch (and the ILS build's workers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.ils.build import worker_threads
from cxrground.models.torch_state import use_threads

#: The commands that run torch (segmenter, models, SAM, the ILS agent).
TORCH_COMMANDS = (("anatomy", "zones"), ("anatomy", "fit-zones"), ("anatomy", "fit-normative"),
                  ("segment", "lungs"), ("ils", "build"), ("ils", "predict"), ("ils", "convert-lisa"),
                  ("percept", "build"), ("percept", "eval"), ("serve",), ("anatomy", "pose"), ("segment", "eval-lungs"),
                  ("ils", "export-lisa"), ("detector", "evaluate"))
#: Training commands: one process, whose thread count is part of the training configuration (default 1, or the
#: model's configuration for ``ils train``).
TRAINING_COMMANDS = (("segment", "train-lungs"), ("segment", "train-pose"), ("ils", "train"), ("detector", "train"))


@pytest.fixture
def restore_threads(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    yield torch
    torch.set_num_threads(before)


@pytest.mark.parametrize("path", TORCH_COMMANDS, ids=" ".join)
def test_torch_commands_offer_threads_default_one(path):
    cmd = main
    for name in path:
        cmd = cmd.commands[name]
    opt = {p.name: p for p in cmd.params}.get("threads")
    assert opt is not None, f"{' '.join(path)} has no --threads"
    assert opt.default == 1


@pytest.mark.parametrize("path", TRAINING_COMMANDS, ids=" ".join)
def test_training_commands_offer_threads(path):
    cmd = main
    for name in path:
        cmd = cmd.commands[name]
    opt = {p.name: p for p in cmd.params}.get("threads")
    assert opt is not None, f"{' '.join(path)} has no --threads"
    assert opt.default == (None if path == ("ils", "train") else 1)  # ils train: the model's configuration


def test_threads_reach_torch_and_the_environment(restore_threads, monkeypatch, tmp_path: Path):
    torch = restore_threads
    seen = {}

    def fake_write_zones(*args, **kwargs):
        import os

        seen["torch"], seen["env"] = torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]
        return [], []

    monkeypatch.setattr("cxrground.lesions.zones.write_zones", fake_write_zones)
    monkeypatch.setattr("cxrground.lesions.zones.find_images", lambda root: [])
    res = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(tmp_path), "--out", str(tmp_path / "o"),
                                    "--zone-model", "normative", "--threads", "3"])
    assert res.exit_code == 0, res.output
    assert seen == {"torch": 3, "env": "3"}
    assert worker_threads() == 3  # what each `ils build --workers N` process is given
    res = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(tmp_path), "--out", str(tmp_path / "o"),
                                    "--zone-model", "normative"])
    assert res.exit_code == 0, res.output
    assert seen == {"torch": 1, "env": "1"}  # single-threaded by default


def test_threads_must_be_positive(restore_threads, tmp_path: Path):
    res = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(tmp_path), "--out", str(tmp_path / "o"),
                                    "--threads", "0"])
    assert res.exit_code == 2 and "--threads" in res.output
    with pytest.raises(ValueError, match="at least 1"):
        use_threads(0)


def test_worker_threads_default_and_bad_values(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert worker_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "four")
    assert worker_threads() == 1
