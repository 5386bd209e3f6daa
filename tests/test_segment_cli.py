"""``cxrground segment`` commands (run through the command group itself)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cxrground.cli.segment_cmds import COMMANDS, segment
from cxrground.datasets.synthetic import SynthConfig, generate_study
from cxrground.io.image import write_image
from cxrground.io.masks import read_mask_png, write_mask_png


@pytest.fixture(scope="module")
def study_files(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("seg-cli")
    study = generate_study(0, 2, SynthConfig(width=256))
    files = {"image": write_image(tmp / "image.png", study.image)}
    for name, mask in study.anatomy_masks.items():
        files[name] = write_mask_png(tmp / f"{name}.png", mask)
    return files


def test_commands_list():
    assert [c.name for c in COMMANDS] == ["segment"]
    assert set(segment.commands) == {"lungs", "train-lungs", "eval-lungs", "train-pose"}


def test_lungs_with_given_masks(study_files, tmp_path: Path):
    out = tmp_path / "given"
    res = CliRunner().invoke(segment, ["lungs", "--image", str(study_files["image"]), "--out-dir", str(out),
                                       "--backend", "given", "--right", str(study_files["right_lung"]),
                                       "--left", str(study_files["left_lung"])])
    assert res.exit_code == 0, res.output
    assert "CTR = " in res.output and "ESTIMATE" in res.output
    for name in ("right_lung.png", "left_lung.png", "heart.png", "overlay.png", "masks.json"):
        assert (out / name).is_file()
    record = json.loads((out / "masks.json").read_text())
    assert record["heart_source"] == "estimate" and 0.3 < record["ctr"] < 0.7
    assert np.array_equal(read_mask_png(out / "right_lung.png"), read_mask_png(study_files["right_lung"]))

    res = CliRunner().invoke(segment, ["lungs", "--image", str(study_files["image"]), "--out-dir", str(out),
                                       "--backend", "given"])
    assert res.exit_code != 0 and "--right" in res.output


def test_lungs_with_the_unet(study_files, tmp_path: Path):
    pytest.importorskip("torch")
    out = tmp_path / "unet"
    res = CliRunner().invoke(segment, ["lungs", "--image", str(study_files["image"]), "--out-dir", str(out)])
    assert res.exit_code == 0, res.output
    assert "heart: ESTIMATE" in res.output
    record = json.loads((out / "masks.json").read_text())
    assert record["backend"] == "unet" and record["provenance"]["weights_sha256"]
    assert "--threads" in CliRunner().invoke(segment, ["lungs", "--help"]).output
    assert read_mask_png(out / "heart.png").shape == tuple(record["shape"])


def test_missing_backend_pieces_are_click_errors(study_files, tmp_path: Path):
    res = CliRunner().invoke(segment, ["lungs", "--image", str(study_files["image"]), "--out-dir", str(tmp_path),
                                       "--backend", "hybridgnet", "--weights", str(tmp_path / "none.pt")])
    assert res.exit_code == 1 and "not found" in res.output


def test_train_lungs_help():
    res = CliRunner().invoke(segment, ["train-lungs", "--help"])
    assert res.exit_code == 0 and "--epochs" in res.output and "shippable" in res.output


def test_eval_lungs_refuses_weights_without_a_sidecar(tmp_path: Path):
    res = CliRunner().invoke(segment, ["eval-lungs", str(tmp_path / "none.safetensors")])
    assert res.exit_code == 2 and "does not exist" in res.output
    lone = tmp_path / "lone.safetensors"
    lone.write_bytes(b"")
    res = CliRunner().invoke(segment, ["eval-lungs", str(lone)])
    assert res.exit_code == 1 and "lone.json" in res.output and "not found" in res.output


def test_lungs_refuses_a_lateral_film_naming_it(study_files, tmp_path: Path):
    """A DICOM whose header says lateral is refused, as `anatomy zones` refuses it; an AP SUPINE one is read."""
    from cxrground.io.dicom import write_dicom
    from cxrground.io.image import read_image

    pixels = read_image(study_files["image"]).pixels
    lateral = write_dicom(tmp_path / "side.dcm", pixels, view="LL") or tmp_path / "side.dcm"
    res = CliRunner().invoke(segment, ["lungs", "--image", str(lateral), "--out-dir", str(tmp_path / "side"),
                                       "--backend", "given", "--right", str(study_files["right_lung"]),
                                       "--left", str(study_files["left_lung"])])
    assert res.exit_code != 0 and "side.dcm" in res.output and "LL is not frontal" in res.output
    assert not (tmp_path / "side" / "masks.json").exists()
    frontal = write_dicom(tmp_path / "ap.dcm", pixels, view="AP SUPINE") or tmp_path / "ap.dcm"
    res = CliRunner().invoke(segment, ["lungs", "--image", str(frontal), "--out-dir", str(tmp_path / "ap"),
                                       "--backend", "given", "--right", str(study_files["right_lung"]),
                                       "--left", str(study_files["left_lung"])])
    assert res.exit_code == 0, res.output
