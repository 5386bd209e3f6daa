"""`segment train-pose --images`: the pose reader trained on a folder of your own films (screened by the current
reader, split by patient or film, checked on the held-out films in the eight poses), through the command line, on
small synthetic films (one epoch: a few seconds)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from cxrground.cli import main
from cxrground.io.image import write_image

N_FILMS = 28


@pytest.fixture(scope="module")
def phantoms() -> list[np.ndarray]:
    """Upright synthetic frontal films, 192 px wide (the shipped reader reads them upright, mirrored as mirrored)."""
    from cxrground.datasets.synthetic import SynthConfig
    from cxrground.datasets.synthetic.study import generate_study

    config = SynthConfig(width=192)
    return [generate_study(0, i, config).image for i in range(N_FILMS)]


def _folder(root: Path, films: list[np.ndarray], n: int, mirrored: int = 0, bad: bool = False) -> Path:
    """``n`` upright films under ``pNN/fNN.png`` (two films per patient folder), ``mirrored`` of them again
    mirrored under ``mir/``, and with ``bad`` three files that are no usable film."""
    for i in range(n):
        write_image(root / f"p{i // 2:02d}" / f"f{i:02d}.png", films[i])
    for i in range(mirrored):
        write_image(root / "mir" / f"m{i:02d}.png", np.ascontiguousarray(films[i][:, ::-1]))
    if bad:
        (root / "broken.png").write_text("not an image", encoding="utf-8")
        (root / "empty.jpg").write_bytes(b"")
        write_image(root / "tiny.png", np.full((20, 20), 128, np.uint8))
    return root


def _train(*args: str) -> tuple[int, str]:
    run = CliRunner().invoke(main, ["segment", "train-pose", "--epochs", "1", "--threads", "1", *args])
    return run.exit_code, run.output


def _sidecar(out: Path) -> dict:
    return json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))


def _failures(out: Path) -> list[dict]:
    text = out.with_name(out.name + ".failures.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def trained(phantoms, tmp_path_factory) -> tuple[Path, Path, str]:
    """(image folder, weights stem, output) of one run on 24 upright films, 3 mirrored copies and 3 bad files,
    screened by the shipped reader."""
    root = tmp_path_factory.mktemp("folder")
    films = _folder(root / "films", phantoms, 24, mirrored=3, bad=True)
    out = root / "weights" / "pose"
    code, output = _train("--images", str(films), "--out", str(out))
    assert code == 0, output
    return films, out, output


def test_folder_training_screens_the_films_and_lists_split_and_screening_in_the_sidecar(trained):
    films, out, output = trained
    meta = _sidecar(out)
    data = meta["data"]
    assert data["images"] == str(films)
    assert data["split"] == {"by": "film", "holdout_fraction": 0.2, "seed": 0}
    assert meta["training"]["recipe"]["epochs"] == 1 and meta["training"]["recipe"]["threads"] == 1
    screened = data["screening"]
    assert screened["weights"] == "pose_net_v1"
    flagged = {f["image"]: f for f in screened["train_flagged"] + screened["heldout_flagged"]}
    # the mirrored copies are read as mirrored; those among the training films are left out of training
    assert set(flagged) == {f"mir/m{i:02d}.png" for i in range(3)}
    assert all(f["correction"] == "mirrored left-right" for f in flagged.values())
    train, held = data["train_images"], data["heldout_images"]
    assert not set(train) & set(flagged)
    readable = sorted(set(train) | set(held) | {f["image"] for f in screened["train_flagged"]})
    assert len(readable) == len(train) + len(held) + len(screened["train_flagged"]) == 27
    assert len(held) == round(27 * 0.2) and not set(train) & set(held)
    assert all(not n.startswith("/") and "films" not in n for n in train + held)  # paths under the folder
    left = len(screened["train_flagged"])
    assert f"{left} of {27 - len(held)} training films read as not upright, left out of training" in output


def test_folder_training_prints_and_records_the_held_out_check_per_pose(trained):
    _, out, output = trained
    check = _sidecar(out)["data"]["heldout_check"]
    held = len(_sidecar(out)["data"]["heldout_images"])
    assert check["films"] == held
    assert [r["stored"] for r in check["poses"]][:1] == ["upright"] and len(check["poses"]) == 8
    assert all(r["films"] == held and 0 <= r["flagged"] <= held for r in check["poses"])
    up = check["poses"][0]
    assert len(check["upright_flagged"]) == up["flagged"]
    assert all(f["screening_flagged"] is False for f in check["upright_flagged"])  # phantoms read upright by it
    assert f"held-out check: {held} held-out films" in output
    assert "| stored | films | flagged | share | right correction |" in output
    assert f"upright films flagged (false alarms): {up['flagged']} of {held}" in output
    assert "mirrored films found:" in output


def test_unreadable_films_go_to_failures_jsonl(trained):
    _, out, output = trained
    failures = {Path(f["path"]).name: f for f in _failures(out)}
    assert set(failures) == {"broken.png", "empty.jpg", "tiny.png"}
    assert all(f["stage"] == "train-pose" and f["reason"] for f in failures.values())
    assert "empty" in failures["empty.jpg"]["reason"] and "too small" in failures["tiny.png"]["reason"]
    assert _sidecar(out)["data"]["left_out"] == {"films": 3, "unreadable": 3, "listed_in": "pose.failures.jsonl"}
    assert "3 left out (3 unreadable" in output


def test_written_weights_load_in_the_reader_and_in_anatomy_pose(trained, tmp_path):
    from cxrground.anatomy.segment.pose_net import PoseReader, pose_reader_record

    films, out, _ = trained
    reader = PoseReader(out.with_suffix(".safetensors"), threads=1).load()
    reading = reader.read(np.full((80, 70), 100, np.uint8))
    assert len(reading.probabilities) == 8 and abs(sum(reading.probabilities) - 1) < 1e-5
    assert pose_reader_record(reader)["sha256"] == _sidecar(out)["sha256"]  # what ils build records of a reader
    run = CliRunner().invoke(main, ["anatomy", "pose", "--images", str(films), "--out", str(tmp_path / "poses"),
                                    "--weights", str(out.with_suffix(".safetensors")), "--no-sheets"])
    assert run.exit_code == 0, run.output
    summary = json.loads((tmp_path / "poses" / "poses.json").read_text(encoding="utf-8"))
    assert summary["weights_name"] == "pose" and summary["films"] == 27


def test_too_few_readable_films_is_a_usage_error_naming_the_folder(phantoms, tmp_path):
    films = _folder(tmp_path / "few", phantoms, 12, bad=True)
    out = tmp_path / "w" / "pose"
    code, output = _train("--images", str(films), "--out", str(out))
    assert code == 2, output
    assert "Usage:" in output and str(films) in output and "12 readable frontal films" in output
    assert "20 at least" in output and "3 left out" in output
    assert not out.with_suffix(".safetensors").exists()
    # a refused run writes nothing: an earlier run's files in OUT stay as they were
    assert not out.with_name("pose.failures.jsonl").exists()


def test_out_below_a_file_is_refused_before_any_film_is_read(phantoms, tmp_path):
    films = _folder(tmp_path / "films", phantoms, 24)
    (tmp_path / "afile").write_text("x")
    code, output = _train("--images", str(films), "--out", str(tmp_path / "afile" / "sub" / "pose"))
    assert code == 2 and "is a file, not a folder" in output and "Traceback" not in output, output


def test_a_dotted_weights_name_is_its_own_model(phantoms, tmp_path):
    """``--out w/pose.a`` and ``w/pose.b`` are two models, and each loads as itself."""
    from cxrground.io.files import model_paths

    assert model_paths("w/pose.v2.safetensors") == (Path("w/pose.v2.safetensors"), Path("w/pose.v2.json"))
    assert model_paths("w/pose.v2") == (Path("w/pose.v2.safetensors"), Path("w/pose.v2.json"))
    assert model_paths("w/pose.failures.jsonl")[0] == Path("w/pose.failures.jsonl.safetensors")


def test_metadata_keeps_frontal_films_and_splits_by_patient(phantoms, tmp_path):
    from cxrground.anatomy.segment.pose_net import shipped_pose_reader

    films = _folder(tmp_path / "films", phantoms, N_FILMS)
    names = sorted(p.relative_to(films).as_posix() for p in films.rglob("*.png"))
    laterals = set(names[3:28:7])  # 4 films
    unlisted = names[-1]
    table = tmp_path / "meta.csv"
    with table.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "view", "patientid"])
        for i, n in enumerate(names):
            if n != unlisted:  # listed by file name or by path under the folder
                w.writerow([n if i % 2 else Path(n).name, "LATERAL" if n in laterals else ("PA", "AP")[i % 2],
                            f"P{i // 3}"])
    out = tmp_path / "w" / "pose"
    code, output = _train("--images", str(films), "--out", str(out), "--metadata", str(table),
                          "--holdout-fraction", "0.25", "--screen-weights", str(shipped_pose_reader().path))
    assert code == 0, output
    data = _sidecar(out)["data"]
    used = set(data["train_images"]) | set(data["heldout_images"]) | {
        f["image"] for f in data["screening"]["train_flagged"]}
    assert used == set(names) - laterals - {unlisted}
    failures = {Path(f["path"]).relative_to(films).as_posix(): f["reason"] for f in _failures(out)}
    assert set(failures) == laterals | {unlisted}
    assert all("LATERAL is not frontal" in failures[n] for n in laterals)
    assert "no view in the metadata table" in failures[unlisted]
    assert data["left_out"] == {"films": 5, "not frontal": 4, "view unknown": 1, "listed_in": "pose.failures.jsonl"}
    assert data["metadata"]["patient_column"] == "patientid" and data["screening"]["weights"] == "pose_net_v1"
    patient = {n: f"P{i // 3}" for i, n in enumerate(names)}
    train_p = {patient[n] for n in data["train_images"]}
    held_p = {patient[n] for n in data["heldout_images"]}
    assert held_p and not train_p & held_p
    n_patients = len({patient[n] for n in data["train_images"] + data["heldout_images"]})
    assert data["split"]["by"] == "patient" and data["split"]["train_patients"] == len(train_p)
    assert data["split"]["heldout_patients"] == len(held_p) == round(n_patients * 0.25)
    assert "split by patient" in output


def test_max_films_and_no_screen(phantoms, tmp_path):
    films = _folder(tmp_path / "films", phantoms, 24, mirrored=3)
    out = tmp_path / "w" / "pose"
    code, output = _train("--images", str(films), "--out", str(out), "--no-screen", "--max-films", "22")
    assert code == 0, output
    data = _sidecar(out)["data"]
    assert data["screening"] is None and "screening: off" in output
    assert len(data["train_images"]) + len(data["heldout_images"]) == 22 and data["max_films"] == 22
    assert _failures(out) == []


def test_the_folder_options_need_images_and_the_sources_are_exclusive(tmp_path):
    films = tmp_path / "films"
    films.mkdir()
    out = str(tmp_path / "pose")
    code, output = _train("--images", str(films), "--pack", str(tmp_path), "--out", out)
    assert code == 2 and "--images and --pack are two sources" in output
    code, output = _train("--holdout-fraction", "0.3", "--out", out)
    assert code == 2 and "--holdout-fraction: only with --images" in output
    code, output = _train("--images", str(films), "--no-screen", "--screen-weights", __file__, "--out", out)
    assert code == 2 and "do not go together" in output


def test_pose_check_summary_counts_flagged_and_right_corrections():
    from cxrground.anatomy.segment.pose_net import POSE_CLASSES
    from cxrground.models.pose_net import pose_check_lines, pose_check_summary

    results = {p: [("a", (0, False), 0.9), ("b", p, 0.1)] for p in POSE_CLASSES}
    summary = pose_check_summary(results)
    assert summary[0] == {"stored": "upright", "turns_ccw": 0, "mirrored": False, "films": 2, "flagged": 0,
                          "flagged_share": 0.0, "right_correction": None}
    assert all(r["flagged"] == 1 and r["right_correction"] == 1 and r["flagged_share"] == 0.5 for r in summary[1:])
    assert pose_check_lines(summary)[2] == "| upright | 2 | 0 | 0.0 % |  |"
