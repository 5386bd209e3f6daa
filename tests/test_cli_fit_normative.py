"""``anatomy fit-normative`` rebuilds ``normative_v1`` through the lungs it was fitted through (its sidecar's
``segmenter``), not through the package's default lung U-Net; ``--lungs`` names others, a missing file is a usage
error naming it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from cxrground.anatomy.segment.builtin import DEFAULT_WEIGHTS, default_weights_path, lung_weights
from cxrground.cli import main
from cxrground.lesions.normative_fit import LUNGS

ROOT = Path(__file__).resolve().parents[1]
SIDECAR = ROOT / "src" / "cxrground" / "lesions" / "weights" / "normative_v1.json"


def test_default_lungs_are_those_of_the_shipped_model():
    shipped = json.loads(SIDECAR.read_text(encoding="utf-8"))["segmenter"]
    option = {p.name: p for p in main.commands["anatomy"].commands["fit-normative"].params}["lungs"]
    assert option.default == LUNGS == shipped != DEFAULT_WEIGHTS
    assert lung_weights(option.default).is_file()


def test_lung_weights_by_name_or_path(tmp_path):
    assert lung_weights(DEFAULT_WEIGHTS) == default_weights_path()
    assert lung_weights("lung_unet_v1").parent == default_weights_path().parent
    assert lung_weights(str(tmp_path / "mine.safetensors")) == tmp_path / "mine.safetensors"
    assert lung_weights(tmp_path / "mine") == tmp_path / "mine"


def test_unknown_lungs_are_refused_before_the_fit(tmp_path):
    out = tmp_path / "out"
    done = CliRunner().invoke(main, ["anatomy", "fit-normative", "--out", str(out), "--lungs", "lung_unet_v0",
                                     "--pack", str(tmp_path / "no-pack")])
    assert done.exit_code == 2, done.output
    assert "--lungs" in done.output and "no lung U-Net weights at" in done.output
    assert "lung_unet_v0.safetensors" in done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)
    assert not out.exists()
