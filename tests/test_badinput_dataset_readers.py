"""Every reader of an ILS dataset file goes through the shared check (:func:`cxrground.ils.schema.read_dataset`):
a truncated or empty file, a record without a field its readers need, a field of another type, a folder where the
file should be each give ``Error: FILE: reason`` naming the record, exit status 1 and no traceback; the same for the
other files these commands read (percept build's anatomy JSONL and review CSV, a benchmark file)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cxrground.cli import main
from cxrground.errors import InputError
from cxrground.ils.layout import DATASET_FILE
from cxrground.ils.schema import structure_problems

N_STUDIES = 4
#: The tiny baseline of tests/test_models_baseline.py (trains in about a second).
TINY = {"size": "32", "channels": "8,16", "cond_hidden": "16", "head_hidden": "16", "batch_size": "8",
        "warmup_steps": "2", "epochs": "1"}


def _run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _refused(result: Result, *words: str) -> str:
    """The command failed as the CLI's input errors do (exit 1, no traceback) and its message holds ``words``."""
    text = result.output
    assert result.exit_code == 1, text
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in text, text
    for word in words:
        assert word in text, text
    return text


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """A small synthetic cohort, its ILS dataset, a tiny baseline checkpoint trained on it and a review database."""
    root = tmp_path_factory.mktemp("readers")
    images = root / "cohort" / "files"
    r = _run("synth", "--out", root / "cohort", "--studies", N_STUDIES, "--seed", "2", "--quiet")
    assert r.exit_code == 0, r.output
    r = _run("ils", "build", "--images", images, "--out", root / "ils", "--seed", "0", "--quiet")
    assert r.exit_code == 0, r.output
    paths = {"root": root, "ils": root / "ils", "images": images, "db": root / "review.sqlite"}
    r = _run("review", "add-user", "ann", "--db", paths["db"])
    assert r.exit_code == 0, r.output
    pytest.importorskip("torch")
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    r = _run("ils", "train", "--model", "baseline", "--dataset", paths["ils"], "--images", images, "--out",
             root / "ckpt", "--quiet", *sets)
    assert r.exit_code == 0, r.output
    paths["ckpt"] = root / "ckpt"
    return paths


def _first_positive(data: dict) -> tuple[str, str, dict]:
    """(split, study key, study) of the first study with a positive pair."""
    for split, studies in data.items():
        for key, study in studies.items():
            if study["instruction_answer_pairs"]["positive_pairs"]:
                return split, key, study
    raise AssertionError("no positive pair in the test dataset")


#: Broken dataset files: kind -> (what to do to the JSON, words the error must hold besides the file).
def _truncated(data: dict) -> str:
    return json.dumps(data)[:300]


def _no_field(data: dict) -> dict:
    _, _, study = _first_positive(data)
    del study["instruction_answer_pairs"]["positive_pairs"][0]["instruction"]
    return data


def _wrong_type(data: dict) -> dict:
    _, _, study = _first_positive(data)
    study["instruction_answer_pairs"]["positive_pairs"][0]["target"] = 5
    return data


def _location_type(data: dict) -> dict:
    _, _, study = _first_positive(data)
    study["instruction_answer_pairs"]["positive_pairs"][0]["grounded_location"] = "left lung"
    return data


KINDS = {
    "truncated": (_truncated, ("not valid JSON",)),
    "empty": (lambda data: "", ("is empty",)),
    "directory": (None, ("is a folder, not the dataset JSON file",)),
    "no_field": (_no_field, ("positive pair 0 has no 'instruction'",)),
    "wrong_type": (_wrong_type, ("positive pair 0: target must be a string, got int",)),
    "location_type": (_location_type, ("positive pair 0: grounded_location must be a list of location labels",)),
}


def _broken_copy(ils: Path, dest: Path, kind: str) -> Path:
    """A copy of the dataset folder whose JSON file is broken the ``kind`` way."""
    shutil.copytree(ils, dest)
    file = dest / DATASET_FILE
    change = KINDS[kind][0]
    data = json.loads(file.read_text())
    file.unlink()
    if change is None:
        file.mkdir()
        return dest
    broken = change(data)
    file.write_text(broken if isinstance(broken, str) else json.dumps(broken))
    return dest


#: The readers, each as the command line that makes it read the dataset ``ds``.
READERS = {
    "ils evaluate": lambda ds, p, tmp: ["ils", "evaluate", "--dataset", ds, "--predictions", tmp / "p.jsonl",
                                        "--split", "all", "--bootstrap", "0"],
    "ils train": lambda ds, p, tmp: ["ils", "train", "--model", "baseline", "--dataset", ds, "--images", p["images"],
                                     "--out", tmp / "ck", "--quiet",
                                     *[a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]],
    "ils predict": lambda ds, p, tmp: ["ils", "predict", "--checkpoint", p["ckpt"], "--dataset", ds, "--images",
                                       p["images"], "--split", "train", "--out", tmp / "pred.jsonl", "--quiet"],
    "percept build": lambda ds, p, tmp: ["percept", "build", "--ils", ds, "--images", p["images"], "--out",
                                         tmp / "bench", "--split", "all"],
    "ils gallery": lambda ds, p, tmp: ["ils", "gallery", ds, "--images", p["images"], "--html", tmp / "g.html"],
    "review import": lambda ds, p, tmp: ["review", "import", "--db", tmp / "db.sqlite", "--ils", ds, "--images",
                                         p["images"], "--per-item", "1"],
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("reader", list(READERS))
def test_every_dataset_reader_names_the_file_and_the_record(built, tmp_path, reader, kind):
    ds = _broken_copy(built["ils"], tmp_path / "ds", kind)
    (tmp_path / "p.jsonl").write_text('{"pair_id": "x", "answer": "[SEG]"}\n')
    shutil.copy(built["db"], tmp_path / "db.sqlite")
    result = _run(*READERS[reader](ds, built, tmp_path))
    _refused(result, f"Error: {ds / DATASET_FILE}: ", *KINDS[kind][1])


@pytest.mark.parametrize("kind", ["truncated", "directory", "no_field"])
def test_review_export_card_checks_the_dataset(built, tmp_path, kind):
    ds = _broken_copy(built["ils"], tmp_path / "ds", kind)
    result = _run("review", "export", "--db", built["db"], "--out", tmp_path / "d.csv", "--card", ds)
    _refused(result, f"Error: {ds / DATASET_FILE}: ")


def test_the_readers_of_a_dataset_folder_take_its_json_file_too(built, tmp_path):
    from cxrground.review.db import ReviewDB

    ds = tmp_path / "ds"
    shutil.copytree(built["ils"], ds)
    file = ds / DATASET_FILE
    stats = _run("ils", "stats", file, "--json")
    assert stats.exit_code == 0, stats.output
    assert stats.output == _run("ils", "stats", ds, "--json").output
    assert _run("ils", "stats", file).output == _run("ils", "stats", ds).output  # the folder's card
    gallery = _run("ils", "gallery", file, "--images", built["images"], "--limit", "1")
    assert gallery.exit_code == 0, gallery.output
    assert f"wrote {ds / 'gallery.html'} (1 studies" in gallery.output  # beside the JSON, masks read from there
    db = tmp_path / "db.sqlite"
    shutil.copy(built["db"], db)
    imported = _run("review", "import", "--db", db, "--ils", file, "--images", built["images"], "--per-item", "1")
    assert imported.exit_code == 0, imported.output
    assert {item.source for item in ReviewDB(db).items()} == {str(ds.resolve())}  # the folder, as --ils DIR gives
    exported = _run("review", "export", "--db", db, "--out", tmp_path / "d.csv", "--card", file)
    assert exported.exit_code == 0, exported.output
    assert f"{ds / 'card.md'}: review section updated" in exported.output and (ds / "review.json").is_file()
    for args in (["ils", "stats"], ["ils", "gallery", "--images", built["images"]],
                 ["review", "import", "--db", db, "--images", built["images"], "--ils"],
                 ["review", "export", "--db", db, "--out", tmp_path / "d.csv", "--card"]):
        missing = _run(*args, tmp_path / "nowhere")  # neither a folder nor a file: still a usage error
        assert missing.exit_code == 2 and "does not exist" in missing.output, missing.output


def test_percept_build_refuses_targets_outside_the_lesions(built, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(built["ils"], ds)
    data = json.loads((ds / DATASET_FILE).read_text())
    split, key, study = _first_positive(data)
    study["instruction_answer_pairs"]["positive_pairs"][0]["target"] = "tumour"
    (ds / DATASET_FILE).write_text(json.dumps(data))
    result = _run("percept", "build", "--ils", ds, "--images", built["images"], "--out", tmp_path / "bench",
                  "--split", "all")
    _refused(result, str(ds / DATASET_FILE), f"{split}.{key} positive pair 0: target 'tumour' is not one of")


def test_lisa_samples_go_through_the_shared_check(built, tmp_path):
    pytest.importorskip("torch")
    from cxrground.models.lisa.training import load_samples

    ds = _broken_copy(built["ils"], tmp_path / "ds", "no_field")
    with pytest.raises(InputError, match="positive pair 0 has no 'instruction'") as caught:
        load_samples(ds, built["images"], "train")
    assert caught.value.path == str(ds / DATASET_FILE)
    samples, failures = load_samples(built["ils"], built["images"], "train")
    assert samples and not failures
    data = json.loads((built["ils"] / DATASET_FILE).read_text())
    positives = {p["pair_id"] for study in data["train"].values()
                 for p in study["instruction_answer_pairs"]["positive_pairs"]}
    assert {s.pair_id for s in samples if s.mask is not None} == positives  # masks by polarity, not by `seg`


def test_structure_check_accepts_absent_optional_fields_and_refuses_wrong_ones():
    study = {"image_path": "a.jpg", "instruction_answer_pairs": {"positive_pairs": [], "negative_pairs": [
        {"pair_id": "s1_negative_0", "instruction": "i.", "answer": "a", "type": "basic", "target": "edema"}]}}
    assert structure_problems({"train": {"s1": study}}) == []
    study["instruction_answer_pairs"]["negative_pairs"][0]["location"] = ["left lung", 3]
    study["section_content"] = None  # null: as absent
    study["dicom_id"] = 7
    assert structure_problems({"train": {"s1": study}}) == [
        "train.s1: dicom_id must be a string, got number",
        "train.s1 negative pair 0: location must be a list of location labels, got array"]


# --- the other files these commands read --------------------------------------------------------------------


@pytest.mark.parametrize(("content", "words"), [
    (b"[1, 2]\n", ("line 1: not an anatomy record: expected a JSON object, got list",)),
    (b'{"study": "s1", "right_lung": 5, "left_lung": "x.png"}\n', ("line 1: not an anatomy record: right_lung must",)),
    (b'{"study": "s1", "right_lung": "a.png", "left_lung": "b.png", "height": "512"}\n', ("height and width",)),
    (b'{"study": "s1", ', ("line 1: not valid JSON",)),
    (b"\xff\xfe{", ("anatomy file is not UTF-8",)),
])
def test_percept_build_names_a_malformed_anatomy_file(built, tmp_path, content, words):
    anatomy = tmp_path / "anatomy.jsonl"
    anatomy.write_bytes(content)
    result = _run("percept", "build", "--ils", built["ils"], "--images", built["images"], "--out", tmp_path / "b",
                  "--split", "all", "--anatomy", anatomy)
    _refused(result, f"Error: {anatomy}: ", *words)


def test_percept_build_names_a_review_csv_that_is_not_utf8(built, tmp_path):
    review = tmp_path / "decisions.csv"
    review.write_bytes(b"\xff\xfekey_id,decision,reviewer\n")
    result = _run("percept", "build", "--ils", built["ils"], "--images", built["images"], "--out", tmp_path / "b",
                  "--split", "all", "--review", review)
    _refused(result, f"Error: {review}: review CSV is not UTF-8")


@pytest.mark.parametrize("command", ["eval", "gallery", "export", "review import"])
def test_a_benchmark_file_that_is_a_folder_is_named(built, tmp_path, command):
    bench = tmp_path / "bench"
    (bench / "chexpercept.json").mkdir(parents=True)
    shutil.copy(built["db"], tmp_path / "db.sqlite")
    args = {"eval": ["percept", "eval", "--bench", bench, "--model", "random", "--out", tmp_path / "run",
                     "--no-progress"],
            "gallery": ["percept", "gallery", bench, "--out", tmp_path / "g.html"],
            "export": ["percept", "export", bench, tmp_path / "exp", "--no-validate"],
            "review import": ["review", "import", "--db", tmp_path / "db.sqlite", "--bench", bench, "--per-item", "1"]}
    _refused(_run(*args[command]), f"Error: {bench / 'chexpercept.json'}: is a folder, not the benchmark file")


def test_the_evaluation_api_goes_through_the_shared_check(built, tmp_path):
    from cxrground.evaluation.ils.dataset import evaluate_dataset

    ds = _broken_copy(built["ils"], tmp_path / "ds", "wrong_type")
    (tmp_path / "p.jsonl").write_text('{"pair_id": "x", "answer": "[SEG]"}\n')
    with pytest.raises(InputError, match="positive pair 0: target must be a string") as caught:
        evaluate_dataset(ds, tmp_path / "p.jsonl", split="all", n_boot=0)
    assert caught.value.path == str(ds / DATASET_FILE)


def test_a_checkpoint_description_that_is_a_folder_is_named(built, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(built["ckpt"], ckpt)
    (ckpt / "checkpoint.json").unlink()
    (ckpt / "checkpoint.json").mkdir()
    result = _run("ils", "predict", "--checkpoint", ckpt, "--dataset", built["ils"], "--images", built["images"],
                  "--split", "train", "--out", tmp_path / "pred.jsonl", "--quiet")
    _refused(result, str(ckpt / "checkpoint.json"), "is a folder")
