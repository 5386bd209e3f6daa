"""Bad inputs (:mod:`cxrground.testing.fuzz`) through ils build, ils predict, ils evaluate, percept build and
percept eval: no traceback, a recorded reason naming the file for each bad input, every good input done."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from cxrground.cli import main
from cxrground.datasets.synthetic import SynthConfig, write_cohort
from cxrground.ils.predictions import load_predictions
from cxrground.ils.schema import load_dataset
from cxrground.testing.fuzz import (
    BAD_BENCHMARK_JSON,
    BAD_PREDICTION_LINES,
    IMAGE_KINDS,
    REPORT_KINDS,
    corrupt_images,
    corrupt_reports,
    corrupt_study_folders,
    wrong_size_mask,
)

N_STUDIES = 24


def _clean(result: Result) -> None:
    """The command ended by itself (exit code, no uncaught exception) and printed no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A fuzzed 24-study cohort (bad images, reports and study folders) and its ILS build: (root, inputs,
    build result)."""
    root = tmp_path_factory.mktemp("fuzz")
    write_cohort(root / "cohort", N_STUDIES, seed=1, config=SynthConfig(width=128), progress=False)
    files = root / "files"
    shutil.copytree(root / "cohort" / "files", files)
    inputs = (corrupt_images(files) + corrupt_reports(files, start=len(IMAGE_KINDS))
              + corrupt_study_folders(files, start=len(IMAGE_KINDS) + len(REPORT_KINDS)))
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(files), "--out", str(root / "ils"),
                                       "--quiet", "--seed", "0"])
    return root, inputs, result


def test_ils_build_records_every_bad_input_and_does_the_rest(corpus):
    root, inputs, result = corpus
    _clean(result)
    assert result.exit_code == 0, result.output
    failures = _lines(root / "ils" / "failures.jsonl")
    units = [json.loads(p.read_text()) for p in (root / "ils" / "units").glob("*.json")]
    for inp in inputs:
        named = [f for f in failures if str(inp.path) in (f["path"], f.get("file"))]
        if inp.bad:
            assert len(named) == 1 and named[0]["reason"], (inp.kind, failures)
        else:
            assert not named, (inp.kind, named)
            [unit] = [u for u in units if u["image_path"] == str(inp.path)]
            assert unit["status"] != "failed", (inp.kind, unit)
    assert len(failures) == sum(i.bad for i in inputs)  # nothing else failed
    assert sum(len(s) for s in load_dataset(root / "ils" / "mimic_ils_instruction_answer.json").values()) > 0


@dataclass
class _EmptyMasks:
    """An ILS model test double: "[SEG]" and an empty native-size mask for every pair."""

    name: str = "empty"

    def predict_batch(self, images, instructions):
        from types import SimpleNamespace

        return [SimpleNamespace(answer="[SEG]", mask=np.zeros(im.shape, bool)) for im in images]


def test_ils_predict_records_every_bad_image_and_predicts_the_rest(corpus, tmp_path):
    from cxrground.models.predict import predict_split

    root, _, _ = corpus
    ils = root / "ils"
    data = load_dataset(ils / "mimic_ils_instruction_answer.json")
    studies = [s for split in data.values() for s in split.values()]
    images = tmp_path / "files"
    shutil.copytree(root / "files", images)
    bad_kinds = [k for k, (_, bad) in IMAGE_KINDS.items() if bad]
    assert len(studies) > len(bad_kinds)
    broken = {}
    for kind, study in zip(bad_kinds, studies, strict=False):
        writer, _ = IMAGE_KINDS[kind]
        target = images / study["image_path"]
        new = writer(target)
        if new != target:  # a kind that changes the suffix: leave garbage under the old name too
            target.write_bytes(new.read_bytes()[:100])
        broken[str(target)] = kind
    out = tmp_path / "pred.jsonl"
    all_counts = [predict_split(_EmptyMasks(), ils, images, split, out, progress=False) for split in data]
    failures = _lines(out.with_name(out.name + ".failures.jsonl"))
    assert sorted(f["path"] for f in failures) == sorted(broken) and all(f["reason"] for f in failures)
    pairs = {p["pair_id"]: s["image_path"] for s in studies for kind in ("positive_pairs", "negative_pairs")
             for p in s["instruction_answer_pairs"][kind]}
    good = {pid for pid, rel in pairs.items() if str(images / rel) not in broken}
    assert set(load_predictions(out)) == good and sum(c["failed"] for c in all_counts) == len(pairs) - len(good)


def test_ils_evaluate_names_file_and_line_of_each_malformed_prediction(corpus, tmp_path):
    root, _, _ = corpus
    ils = root / "ils"
    data = load_dataset(ils / "mimic_ils_instruction_answer.json")
    split = next(name for name, studies in data.items() if studies)
    key, study = next((k, s) for k, s in data[split].items() if s["instruction_answer_pairs"]["positive_pairs"])
    pid = study["instruction_answer_pairs"]["positive_pairs"][0]["pair_id"]
    anatomy = {a["study"]: a for a in _lines(ils / "anatomy.jsonl")}
    hw = (anatomy[key]["height"], anatomy[key]["width"])
    for kind, make in BAD_PREDICTION_LINES.items():
        pred = tmp_path / f"{kind.replace(' ', '_')}.jsonl"
        pred.write_text('{"pair_id": "unrelated", "answer": "x"}\n' + make(pid, hw) + "\n", encoding="utf-8")
        result = CliRunner().invoke(main, ["ils", "evaluate", "--dataset", str(ils), "--predictions", str(pred),
                                           "--split", split, "--bootstrap", "0"])
        _clean(result)
        assert result.exit_code == 1, (kind, result.output)
        assert str(pred) in result.output and "line 2" in result.output, (kind, result.output)


def test_percept_build_records_bad_images_and_masks(corpus, tmp_path):
    root, _, _ = corpus
    ils = tmp_path / "ils"
    shutil.copytree(root / "ils", ils)
    images = tmp_path / "files"
    shutil.copytree(root / "files", images)
    data = load_dataset(ils / "mimic_ils_instruction_answer.json")
    studies = [s for split in data.values() for s in split.values()]
    positive = next(s for s in studies if s["instruction_answer_pairs"]["positive_pairs"])
    mask = wrong_size_mask(ils / "lesion_mask" / positive["instruction_answer_pairs"]["positive_pairs"][0]
                           ["seg_mask_path"])
    unreadable = [s for s in studies if s is not positive][:2]
    for s in unreadable:
        (images / s["image_path"]).write_bytes(b"not an image")
    out = tmp_path / "bench"
    result = CliRunner().invoke(main, ["percept", "build", "--ils", str(ils), "--images", str(images),
                                       "--out", str(out), "--per-lesion", "1,1,1", "--split", "train,val,test"])
    _clean(result)
    assert result.exit_code == 0, result.output
    failures = _lines(out / "failures.jsonl")
    text = json.dumps(failures)
    assert str(mask.path) in text and "HxW" in text  # the wrong-size mask, named with both shapes
    used = {s["dicom_id"] for s in unreadable}
    bench = json.loads((out / "chexpercept.json").read_text())
    assert bench and not used & {c["dicom_id"] for c in bench.values()}  # cases, none from an unreadable image
    validate = CliRunner().invoke(main, ["percept", "validate", str(out)])
    assert validate.exit_code == 0, validate.output


@pytest.mark.parametrize("kind", list(BAD_BENCHMARK_JSON))
def test_percept_eval_names_a_broken_benchmark_file(tmp_path, kind):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "chexpercept.json").write_bytes(BAD_BENCHMARK_JSON[kind])
    result = CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "random",
                                       "--out", str(tmp_path / "run"), "--no-progress"])
    _clean(result)
    assert result.exit_code != 0 and "chexpercept.json" in result.output, result.output


def test_percept_validate_names_a_gigapixel_png(tmp_path, tmp_path_factory):
    from cxrground.testing.fuzz import png_bytes
    from percept_build_helpers import synthetic_bench

    bench = tmp_path / "bench"
    shutil.copytree(synthetic_bench(tmp_path_factory)[0], bench, ignore=shutil.ignore_patterns(".work"))
    victim = sorted(p for p in bench.rglob("*.png") if ".work" not in p.parts)[0]
    victim.write_bytes(png_bytes(20000, 20000))  # the header claims 400 megapixels
    result = CliRunner().invoke(main, ["percept", "validate", str(bench)])
    _clean(result)
    assert result.exit_code == 1 and victim.name in result.output, result.output


# review import: bad inputs the importer must refuse naming the file, with no traceback and nothing half-imported
def _review_import_case(kind: str, ils: Path, files: Path, tmp_path: Path) -> None:
    data_file = ils / "mimic_ils_instruction_answer.json"
    data = json.loads(data_file.read_text())
    study = next(s for split in data.values() for s in split.values()
                 if s["instruction_answer_pairs"].get("positive_pairs"))
    outside = tmp_path / "outside.png"
    outside.write_bytes((files / study["image_path"]).read_bytes())
    if kind == "dataset is a list":
        data = list(data.values())
    elif kind == "study without pairs":
        del study["instruction_answer_pairs"]
    elif kind == "split not an object":
        data[next(iter(data))] = ["x"]
    elif kind == "image path outside the image root":
        study["image_path"] = "../" * 16 + str(outside).lstrip("/")
    elif kind == "mask path outside the dataset":
        shutil.copy(ils / "lesion_mask" / study["instruction_answer_pairs"]["positive_pairs"][0]["seg_mask_path"],
                    tmp_path / "m.png")
        study["instruction_answer_pairs"]["positive_pairs"][0]["seg_mask_path"] = "../../m.png"
    data_file.write_text(json.dumps(data))


REVIEW_IMPORT_KINDS = ["dataset is a list", "study without pairs", "split not an object",
                       "image path outside the image root", "mask path outside the dataset"]


@pytest.mark.parametrize("kind", REVIEW_IMPORT_KINDS)
def test_review_import_refuses_bad_datasets(corpus, tmp_path, kind):
    pytest.importorskip("fastapi")
    from cxrground.review.db import ReviewDB

    root, _inputs, _ = corpus
    ils = tmp_path / "ils"
    shutil.copytree(root / "ils", ils)
    files = root / "files"
    _review_import_case(kind, ils, files, tmp_path)
    db = tmp_path / "r.sqlite"
    ReviewDB.create(db).add_user("a")
    result = CliRunner().invoke(main, ["review", "import", "--db", str(db), "--ils", str(ils), "--images",
                                       str(files), "--per-item", "1"])
    _clean(result)
    assert result.exit_code != 0 and str(ils) in result.output, (kind, result.output)
    assert ReviewDB(db).items() == []
