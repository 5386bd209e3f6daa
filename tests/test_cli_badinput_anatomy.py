"""Bad input to ``anatomy``, ``detector``, ``synth-info`` and ``scan``: a clear error naming the file and the reason
(never a traceback), and batch jobs that record what failed and finish the rest."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from PIL import Image

from cxrground.cli import main
from cxrground.datasets.folder import scan_folder
from cxrground.datasets.synthetic import SynthConfig, load_truth, write_cohort
from cxrground.errors import ConfigError, InputError
from cxrground.ils.detector.vindr import read_annotations, read_patients
from cxrground.lesions.normative import NormativeModel
from cxrground.lesions.zone_classifier import ZoneClassifier


@pytest.fixture(scope="module")
def cohort3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("badinput") / "cohort"
    write_cohort(out, 3, seed=4, config=SynthConfig(width=128), progress=False)
    return out


def _copy(cohort: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(cohort, tmp_path / "cohort"))


def _run(args: list[str]) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _clean_error(res: Result, *words: str, code: int = 1) -> None:
    """The command failed with ``code``, a message holding ``words`` and no Python traceback."""
    assert res.exit_code == code, (res.output, res.exception)
    assert isinstance(res.exception, SystemExit), repr(res.exception)  # click's error display, not a crash
    for word in words:
        assert word in res.output, res.output


# --- anatomy zones: where it writes, what it reads ------------------------------------------------------------

def test_zones_refuses_an_output_folder_inside_the_image_folder(tmp_path):
    from cxrground.io.image import check_out_folder

    films = tmp_path / "films"
    films.mkdir()
    (films / "a.png").write_bytes(b"not a png")  # the old code read it (a failure) and wrote into the folder
    res = _run(["anatomy", "zones", "--images", films, "--out", films, "--no-overlays"])
    _clean_error(res, "is the image folder", str(films))
    res = _run(["anatomy", "zones", "--images", films, "--out", films / "zones" / "run1", "--no-overlays"])
    _clean_error(res, "lies inside the image folder", str(films))
    assert sorted(p.name for p in films.rglob("*")) == ["a.png"]  # nothing written, nothing to read back later
    check_out_folder(tmp_path / "zones", films)  # beside it is fine
    check_out_folder(films.parent, films)  # and so is the folder that holds it (overlays/ is not under films/)
    with pytest.raises(ConfigError, match="image folder"):
        check_out_folder(films / ".." / "films" / "x", films)


@pytest.mark.parametrize("command", ["zones", "pose"])
def test_failures_of_zones_and_pose_name_the_film_by_its_absolute_path(tmp_path, monkeypatch, command):
    films = tmp_path / "films"
    films.mkdir()
    (films / "garbage.png").write_bytes(b"not a png")
    monkeypatch.chdir(tmp_path)
    res = _run(["anatomy", command, "--images", "films", "--out", "out"] + (["--no-overlays"] if command == "zones"
                                                                          else []))
    assert "Traceback" not in res.output, res.output
    failures = [json.loads(line) for line in (tmp_path / "out" / "failures.jsonl").read_text().splitlines()]
    assert [f["path"] for f in failures] == [str(films / "garbage.png")]


def test_model_files_that_are_not_models_name_the_file(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"junk\n")
    (tmp_path / "junk.json").write_text("notjson")
    with pytest.raises(InputError, match=r"junk\.json: sidecar of the normative model junk\.npz is not JSON"):
        NormativeModel.load(junk)
    with pytest.raises(InputError, match=r"junk\.json: sidecar of the zone classifier"):
        ZoneClassifier.load(junk)
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="not a JSON object"):
        NormativeModel.load(junk)
    (tmp_path / "junk.json").unlink()
    with pytest.raises(InputError, match=r"junk\.npz: not a normative model file"):
        NormativeModel.load(junk)
    arr = tmp_path / "arr3d.npy"
    np.save(arr, np.zeros((2, 3, 4), np.float32))
    with pytest.raises(InputError, match=r"arr3d\.npy: not a normative model file: one array, not an \.npz"):
        NormativeModel.load(arr)
    partial = tmp_path / "partial.npz"
    np.savez(partial, median=np.zeros((2, 3, 4)))
    with pytest.raises(InputError, match=r"partial\.npz: .*no scale, zone_threshold"):
        NormativeModel.load(partial)
    flat = tmp_path / "flat.npz"
    np.savez(flat, median=np.zeros((3, 4)), scale=np.ones((3, 4)), zone_threshold=np.float32(1))
    with pytest.raises(InputError, match=r"flat\.npz: not a normative model file \(normative statistics"):
        NormativeModel.load(flat)
    films = tmp_path / "films"
    films.mkdir()
    for model in (arr, junk):
        res = _run(["anatomy", "zones", "--images", films, "--out", tmp_path / "out", "--normative", model])
        _clean_error(res, "Error:", model.name)


def test_anatomy_show_refuses_a_bad_width_or_a_non_image_out(tmp_path):
    Image.fromarray(np.zeros((40, 40), np.uint8)).save(tmp_path / "film.png")
    mask = np.zeros((40, 40), np.uint8)
    mask[5:35, 4:18] = 255
    Image.fromarray(mask).save(tmp_path / "right.png")
    Image.fromarray(mask[:, ::-1].copy()).save(tmp_path / "left.png")
    base = ["anatomy", "show", "--image", tmp_path / "film.png", "--right", tmp_path / "right.png",
            "--left", tmp_path / "left.png"]
    for width in ("0", "-5"):
        _clean_error(_run([*base, "--out", tmp_path / "s.png", "--width", width]), "--width", code=2)
    _clean_error(_run([*base, "--out", tmp_path / "s.txt"]), "s.txt", ".png", code=2)
    assert not (tmp_path / "s.txt").exists() and not (tmp_path / "s.png").exists()
    res = _run([*base, "--out", tmp_path / "s.png", "--width", "64"])
    assert res.exit_code == 0 and (tmp_path / "s.png").is_file(), res.output


# --- the synthetic cohort and its VinDr export ----------------------------------------------------------------

def test_export_synthetic_records_a_missing_film_and_exports_the_rest(cohort3, tmp_path):
    full = _run(["detector", "export-synthetic", "--cohort", cohort3, "--out", tmp_path / "full"])
    assert full.exit_code == 0 and "0 failed" in full.output, full.output
    cohort = _copy(cohort3, tmp_path)
    gone = load_truth(cohort)[1]
    (cohort / gone.image_path).unlink()
    res = _run(["detector", "export-synthetic", "--cohort", cohort, "--out", tmp_path / "vindr"])
    assert res.exit_code == 0, res.output
    assert "on 2 films" in res.output and "1 failed" in res.output and gone.image_path in res.output
    failures = [json.loads(line) for line in (tmp_path / "vindr" / "failures.jsonl").read_text().splitlines()]
    assert [f["path"] for f in failures] == [str(cohort / gone.image_path)] and "not found" in failures[0]["reason"]
    rows = list(csv.DictReader((tmp_path / "vindr" / "train.csv").open()))
    assert rows and gone.dicom_id not in {r["image_id"] for r in rows}
    assert gone.dicom_id not in (tmp_path / "vindr" / "patients.csv").read_text()
    kept = [r for r in csv.DictReader((tmp_path / "full" / "train.csv").open()) if r["image_id"] != gone.dicom_id]
    assert rows == kept  # the other films' boxes do not change


def test_export_synthetic_refuses_a_folder_of_real_annotations(cohort3, tmp_path):
    vindr = tmp_path / "vindr"
    vindr.mkdir()
    (vindr / "train.csv").write_text("image_id,class_name\nabc,No finding\n")
    _clean_error(_run(["detector", "export-synthetic", "--cohort", cohort3, "--out", vindr]), str(vindr),
                 "train.csv", "new or empty folder")
    assert (vindr / "train.csv").read_text() == "image_id,class_name\nabc,No finding\n"
    (vindr / "test.csv").write_text("x\n")
    _clean_error(_run(["detector", "export-synthetic", "--cohort", cohort3, "--out", vindr]), "test.csv")
    again = tmp_path / "again"  # a rerun into its own export replaces it
    for _ in range(2):
        res = _run(["detector", "export-synthetic", "--cohort", cohort3, "--out", again])
        assert res.exit_code == 0, res.output


def test_a_folder_that_is_not_a_cohort_or_a_corrupt_truth_record_names_the_file(cohort3, tmp_path):
    films = tmp_path / "films"
    films.mkdir()
    _clean_error(_run(["detector", "export-synthetic", "--cohort", films, "--out", tmp_path / "o1"]),
                 str(films), "not a synthetic cohort")
    cohort = _copy(cohort3, tmp_path)
    bad = sorted((cohort / "truth").glob("s*.json"))[0]
    bad.write_text("{broken")
    for args in (["detector", "export-synthetic", "--cohort", cohort, "--out", tmp_path / "o2"],
                 ["synth-info", cohort]):
        _clean_error(_run(args), str(bad), "truth record is not JSON")
    bad.write_text(json.dumps({"synthetic": True}))
    with pytest.raises(InputError, match=rf"{bad.name}: not a synthetic truth record"):
        load_truth(cohort)
    bad.write_text("[1, 2]")
    _clean_error(_run(["synth-info", cohort]), str(bad), "not a synthetic truth record")


# --- detector train -------------------------------------------------------------------------------------------

def test_annotations_that_are_not_utf8_csv_name_the_file(tmp_path):
    good = b"image_id,class_name,x_min,y_min,x_max,y_max,rad_id\na,No finding,,,,,R1\n"
    truncated = tmp_path / "train.csv.gz"
    truncated.write_bytes(gzip.compress(good)[:-12])
    latin = tmp_path / "latin1.csv"
    latin.write_bytes(good.replace(b"No finding", "Aortic enlargement é".encode("latin-1")))
    for path in (truncated, latin):
        with pytest.raises(InputError, match=rf"{path.name}: annotations file is not a UTF-8 CSV"):
            read_annotations(path)
    zipped = tmp_path / "ok.csv.gz"
    zipped.write_bytes(gzip.compress(good))
    assert read_annotations(zipped)[1] == {"a": {"R1"}}
    patients = tmp_path / "patients.csv"
    patients.write_bytes("image_id,patient_id\na,é\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"patients\.csv: patients file is not a UTF-8 CSV"):
        read_patients(patients)
    patients.write_text("image_id,patient_id\na,p1\nb\n")
    with pytest.raises(InputError, match=r"patients\.csv: line 3: empty image_id or patient_id"):
        read_patients(patients)


def _hide_ultralytics(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setitem(sys.modules, "ultralytics", None)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name.split(".")[0] == "ultralytics" else real(name, *a, **k))


def test_train_without_ultralytics_stops_before_preparing_the_data(cohort3, tmp_path, monkeypatch):
    _hide_ultralytics(monkeypatch)
    ann = tmp_path / "train.csv"
    ann.write_text("image_id,class_name,x_min,y_min,x_max,y_max,rad_id\na,ILD,1,1,9,9,R1\n")
    res = _run(["detector", "train", "--annotations", ann, "--images", cohort3 / "files", "--out", tmp_path / "out",
                "--imgsz", "64", "--device", "cpu"])
    _clean_error(res, "needs the 'ultralytics' package", "pip install ultralytics")
    assert not (tmp_path / "out" / "data").exists()


def test_train_without_images_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr("cxrground.ils.detector.train.check_ultralytics", lambda: None)
    ann = tmp_path / "train.csv"
    ann.write_text("image_id,class_name,x_min,y_min,x_max,y_max,rad_id\na,ILD,1,1,9,9,R1\n")
    (tmp_path / "films").mkdir()
    res = _run(["detector", "train", "--annotations", ann, "--images", tmp_path / "films", "--out", tmp_path / "out",
                "--imgsz", "64"])
    _clean_error(res, "the train and val splits need images")
    assert "no image file" in (tmp_path / "out" / "data" / "failures.jsonl").read_text()


# --- scan --index -------------------------------------------------------------------------------------------------

def _film(path: Path) -> None:
    Image.fromarray(np.full((8, 8), 128, np.uint8)).save(path)


def test_index_rows_of_the_wrong_json_type_are_failures_at_their_file_line(tmp_path):
    img = tmp_path / "flat"
    img.mkdir()
    _film(img / "a.png")
    index = tmp_path / "index.jsonl"
    index.write_text("\n".join([json.dumps({"image": "a.png", "study_id": "1", "report_path": ["x"]}),
                                "[1, 2, 3]", "", json.dumps({"image": "a.png", "study_id": 2, "report": "ok."}),
                                json.dumps({"image": {"p": 1}, "study_id": "3", "report": "ok."}), "7"]) + "\n")
    studies, failures = scan_folder(img, index=index)
    assert [s.study_id for s in studies] == ["s2"]
    got = {f.path: f.reason for f in failures}
    assert set(got) == {f"{index}:1", f"{index}:2", f"{index}:5", f"{index}:6"}
    assert "'report_path' is a JSON array" in got[f"{index}:1"] and "row is a JSON array" in got[f"{index}:2"]
    assert "'image' is a JSON object" in got[f"{index}:5"] and "row is a JSON number" in got[f"{index}:6"]
    res = _run(["scan", "--images", img, "--index", index])
    assert res.exit_code == 0 and "Traceback" not in res.output and "4 failures" in res.output, res.output


def test_csv_index_failures_name_the_file_line(tmp_path):
    img = tmp_path / "flat"
    img.mkdir()
    _film(img / "a.png")
    _film(img / "c.png")
    index = tmp_path / "index.csv"
    index.write_text('image,study_id,report\na.png,1,ok.\n\nnothere.png,2,ok.\nb.png,,ok.\nc.png,4,"two\nlines"\n'
                     ",5,ok.\n")
    studies, failures = scan_folder(img, index=index)
    assert [s.study_id for s in studies] == ["s1", "s4"]
    assert [f.path for f in failures] == [str(img / "nothere.png"), f"{index}:5", f"{index}:8"]
    assert f"{index}:4" in failures[0].reason
    latin = tmp_path / "latin1.csv"
    latin.write_bytes("image,study_id,report\na.png,1,é\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"latin1\.csv: index is not a UTF-8 CSV"):
        scan_folder(img, index=latin)
    _clean_error(_run(["scan", "--images", img, "--index", latin]), str(latin), "not a UTF-8 CSV")


def test_scan_check_reads_every_film_and_report_as_the_build_does(tmp_path):
    img = tmp_path / "flat"
    img.mkdir()
    for name in ("a.png", "b.png", "c.png"):
        _film(img / name)
    good = (img / "a.png").read_bytes()
    (img / "cut.png").write_bytes(good[: len(good) // 2])  # truncated
    (img / "text.png").write_text("not an image")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "1.txt").write_text("FINDINGS: Small left effusion.")
    (reports / "2.txt").write_text("")
    (reports / "3.txt").write_text("  \n ")
    rows = [("a.png", "1", "reports/1.txt"), ("b.png", "2", "reports/2.txt"), ("c.png", "3", "reports/3.txt"),
            ("cut.png", "4", "reports/1.txt"), ("text.png", "5", "reports/1.txt")]
    index = tmp_path / "index.csv"
    index.write_text("image,study_id,report_path\n" + "".join(f"{i},{s},{tmp_path / r}\n" for i, s, r in rows))
    plain = _run(["scan", "--images", img, "--index", index])
    assert plain.exit_code == 0 and "5 studies (5 images), 0 failures" in plain.output, plain.output
    res = _run(["scan", "--images", img, "--index", index, "--check"])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "1 study (1 image), 4 failures" in res.output, res.output
    for named in (reports / "2.txt", reports / "3.txt", img / "cut.png", img / "text.png"):
        assert f"failed: {named}:" in res.output, res.output
    bad = index.with_name("bad.csv")  # no usable study at all: exit 1, as the batch commands do
    bad.write_text("image,study_id,report_path\n" + "".join(f"{i},{s},{tmp_path / r}\n" for i, s, r in rows[3:]))
    none = _run(["scan", "--images", img, "--index", bad, "--check"])
    assert none.exit_code == 1 and "no usable study under" in none.output and "all 2 found failed" in none.output
