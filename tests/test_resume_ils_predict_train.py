"""Resume safety of ``ils predict`` (same checkpoint, dataset and split; failures kept current) and ``ils train``
(unreadable training images recorded; a resume with another set of usable pairs refused)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.datasets.synthetic import write_cohort
from cxrground.datasets.synthetic.config import SynthConfig
from cxrground.errors import ConfigError, OptionError

torch = pytest.importorskip("torch")

from cxrground.cli import main  # noqa: E402
from cxrground.ils.predictions import load_predictions  # noqa: E402
from cxrground.models import baseline  # noqa: E402
from cxrground.models.baseline.data import load_pairs  # noqa: E402
from cxrground.models.predict import PredictRequest, predict_request  # noqa: E402

TINY = {"size": "32", "channels": "8,16", "cond_hidden": "16", "head_hidden": "16", "batch_size": "8",
        "warmup_steps": "2", "anatomy": "none"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 6-study cohort, its ILS dataset (ils/) and one built from the impressions (ils_imp/), a 1-epoch checkpoint."""
    root = tmp_path_factory.mktemp("resume-ils")
    write_cohort(root / "cohort", 6, seed=0, config=SynthConfig(width=128), progress=False)
    for name, extra in (("ils", []), ("ils_imp", ["--sections", "impression"])):
        result = CliRunner().invoke(main, ["ils", "build", "--images", str(root / "cohort" / "files"), "--out",
                                           str(root / name), "--quiet", "--seed", "0", "--synthesizer",
                                           "pseudo-normal", *extra])
        assert result.exit_code == 0, result.output
    baseline.train(root / "ils", root / "ck", images=root / "cohort" / "files", overrides={**TINY, "epochs": "1"},
                   progress=False, log=None)
    return root


def _predict(tiny: Path, out: Path, dataset: str = "ils", split: str = "train", images: Path | None = None) -> str:
    return predict_request(PredictRequest(checkpoint=tiny / "ck", dataset=tiny / dataset,
                                          images=images or tiny / "cohort" / "files", split=split, out=out),
                           progress=False)


def _corrupt_copy(tiny: Path, dest: Path, split: str = "train") -> str:
    """A copy of the cohort's files/ under ``dest`` with the first ``split`` study's image truncated; its path."""
    shutil.copytree(tiny / "cohort" / "files", dest)
    rel = load_pairs(tiny / "ils", split)[0].image_path
    (dest / rel).write_bytes((dest / rel).read_bytes()[:300])
    return rel


def test_predict_refuses_predictions_for_another_dataset_or_split(tiny, tmp_path):
    out = tmp_path / "pred.jsonl"
    assert "0 already there" in _predict(tiny, out)
    before = out.read_bytes()
    side = json.loads((tmp_path / "pred.jsonl.checkpoint.json").read_text())
    assert side["split"] == "train" and len(side["dataset_sha256"]) == 64
    with pytest.raises(OptionError, match="another dataset"):  # pair ids repeat between datasets
        _predict(tiny, out, dataset="ils_imp")
    with pytest.raises(OptionError, match="another split"):
        _predict(tiny, out, split="test")
    assert out.read_bytes() == before
    assert "0 written" in _predict(tiny, out)  # the same source resumes
    # a record that does not name the dataset (or no record at all) cannot vouch for the predictions
    (tmp_path / "pred.jsonl.checkpoint.json").write_text(json.dumps({k: side[k] for k in ("checkpoint",
                                                                                         "fingerprint")}))
    with pytest.raises(OptionError, match="unrecorded dataset"):
        _predict(tiny, out)
    (tmp_path / "pred.jsonl.checkpoint.json").unlink()
    with pytest.raises(OptionError, match="unknown source"):
        _predict(tiny, out)
    # through the command line: a usage error naming the file, no traceback
    r = CliRunner().invoke(main, ["ils", "predict", "--checkpoint", str(tiny / "ck"), "--dataset",
                                  str(tiny / "ils_imp"), "--images", str(tiny / "cohort" / "files"), "--split",
                                  "train", "--out", str(tmp_path / "p2.jsonl"), "--quiet"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["ils", "predict", "--checkpoint", str(tiny / "ck"), "--dataset",
                                  str(tiny / "ils"), "--images", str(tiny / "cohort" / "files"), "--split",
                                  "train", "--out", str(tmp_path / "p2.jsonl"), "--quiet"])
    assert r.exit_code != 0 and "another dataset" in r.output and "Traceback" not in r.output


def test_a_refusal_names_exactly_the_files_of_the_predictions_that_exist(tiny, tmp_path):
    out = tmp_path / "pred_test.jsonl"
    _predict(tiny, out, split="test")
    side, failures, films = (tmp_path / f"pred_test.jsonl.{n}" for n in ("checkpoint.json", "failures.jsonl",
                                                                          "films.jsonl"))
    assert side.is_file() and films.is_file() and not failures.exists()
    with pytest.raises(OptionError) as refused:
        _predict(tiny, out, split="val")
    assert f"delete {out}, {side} and {films} to predict afresh" in str(refused.value)
    assert "failures" not in str(refused.value)
    failures.write_text("")
    with pytest.raises(OptionError) as refused:
        _predict(tiny, out, split="val")
    assert f"delete {out}, {side}, {failures} and {films} to predict afresh" in str(refused.value)
    for path in (out, side, failures, films):  # following the advice leaves nothing of the other split
        path.unlink()
    assert "0 already there" in _predict(tiny, out, split="val")


def test_predict_forgets_failures_of_pairs_that_now_succeed_under_another_image_root(tiny, tmp_path):
    bad = tmp_path / "bad"
    _corrupt_copy(tiny, bad)
    out = tmp_path / "pred.jsonl"
    failures = tmp_path / "pred.jsonl.failures.jsonl"
    _predict(tiny, out, images=bad)
    assert len(failures.read_text().splitlines()) == 1
    _predict(tiny, out)  # the same files under another root: the failed pairs are predicted now
    assert failures.read_text() == ""
    assert len(load_predictions(out)) == len(load_pairs(tiny / "ils", "train"))


def test_predict_says_when_kept_predictions_came_from_another_image_root(tiny, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny / "cohort" / "files", copy)
    out = tmp_path / "pred.jsonl"
    first = _predict(tiny, out)
    assert "note:" not in first
    again = _predict(tiny, out)  # the same root: nothing to say
    assert "note:" not in again
    moved = _predict(tiny, out, images=copy)
    assert f"made from the films under {(tiny / 'cohort' / 'files').resolve()}" in moved
    assert str(copy.resolve()) in moved and "each film is compared" in moved
    assert "0 written" in moved and "changed since" not in moved  # the copies hold the same films
    record = json.loads((tmp_path / "pred.jsonl.checkpoint.json").read_text())
    assert record["images"] == str(copy.resolve())  # the kept predictions are vouched for by the films' content


def test_predict_predicts_again_the_pairs_of_a_film_changed_since(tiny, tmp_path):
    images = tmp_path / "images"
    shutil.copytree(tiny / "cohort" / "files", images)
    out = tmp_path / "pred.jsonl"
    _predict(tiny, out, images=images)
    before = load_predictions(out)
    ledger = [json.loads(line) for line in (tmp_path / "pred.jsonl.films.jsonl").read_text().splitlines()]
    pairs = load_pairs(tiny / "ils", "train")
    assert sorted(rec["film"] for rec in ledger) == sorted({p.image_path for p in pairs})
    # one film replaced in place by another film (the next study's), one film gone
    rel, other, gone = sorted({p.image_path for p in pairs})[:3]
    shutil.copyfile(images / other, images / rel)
    (images / gone).unlink()
    said = _predict(tiny, out, images=images)
    n_rel = sum(p.image_path == rel for p in pairs)
    n_gone = sum(p.image_path == gone for p in pairs)
    assert f"{n_rel} written, {len(pairs) - n_rel} already there" in said
    assert "1 film(s) changed since their pairs were predicted: predicted again" in said
    assert "1 film(s) with kept predictions are not under" in said
    after = load_predictions(out)  # one line per pair (a duplicate would be refused), the others untouched
    assert set(after) == set(before)
    changed = {p.pair_id for p in pairs if p.image_path == rel}
    assert all(after[k].rle == before[k].rle for k in after if k not in changed)
    assert n_gone and all(k in after for k in (p.pair_id for p in pairs if p.image_path == gone))
    assert "0 written" in _predict(tiny, out, images=images)  # the new film is recorded


def test_predictions_of_an_earlier_version_say_their_films_are_not_compared(tiny, tmp_path):
    out = tmp_path / "pred.jsonl"
    _predict(tiny, out)
    (tmp_path / "pred.jsonl.films.jsonl").unlink()  # as written before films were recorded
    copy = tmp_path / "copy"
    shutil.copytree(tiny / "cohort" / "files", copy)
    said = _predict(tiny, out, images=copy)
    assert "they are not compared" in said and "were not recorded when predicted" in said
    side = tmp_path / "pred.jsonl.checkpoint.json"
    assert f"delete {out} and {side} to predict afresh from these" in said  # the files there, no other
    record = json.loads((tmp_path / "pred.jsonl.checkpoint.json").read_text())
    assert record["images"] == str((tiny / "cohort" / "files").resolve())  # still where the kept ones came from


def test_a_failed_run_still_says_where_kept_predictions_came_from(tiny, tmp_path, monkeypatch):
    out = tmp_path / "pred.jsonl"
    _predict(tiny, out)
    copy = tmp_path / "copy"
    shutil.copytree(tiny / "cohort" / "files", copy)

    def fail(*args, **kwargs):
        raise ConfigError("the model cannot be loaded")

    monkeypatch.setattr("cxrground.models.predict.load_model", fail)
    r = CliRunner().invoke(main, ["ils", "predict", "--checkpoint", str(tiny / "ck"), "--dataset", str(tiny / "ils"),
                                  "--images", str(copy), "--split", "train", "--out", str(out), "--quiet"])
    assert r.exit_code == 1 and "the model cannot be loaded" in r.output
    assert "were made from the films under" in r.output and "Traceback" not in r.output


def _train(tiny: Path, out: Path, images: Path, **kwargs) -> Path:
    return baseline.train(tiny / "ils", out, images=images, overrides={**TINY, "epochs": "2"}, progress=False,
                          log=None, **kwargs)


def test_train_records_unreadable_images_and_refuses_a_resume_with_other_usable_pairs(tiny, tmp_path):
    images = tmp_path / "images"
    rel = _corrupt_copy(tiny, images)
    out = _train(tiny, tmp_path / "ck", images, stop_after_epoch=1)
    lines = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [(f["path"], f["stage"], f["split"]) for f in lines] == [(str(images / rel), "train-images", "train")]
    data = json.loads((out / "checkpoint.json").read_text())["data"]
    n_train = len(load_pairs(tiny / "ils", "train"))
    assert data["failures"] == 1 and data["pairs_left_out"] > 0
    assert data["train"]["pairs"] == n_train and data["train"]["used"] == n_train - data["pairs_left_out"]
    shutil.copy2(tiny / "cohort" / "files" / rel, images / rel)  # the image is readable now: other pairs
    with pytest.raises(ConfigError, match="usable pairs differ"):
        _train(tiny, out, images)
    _train(tiny, out, images, resume=False)  # starting over is allowed
    assert (out / "failures.jsonl").read_text() == ""
    assert json.loads((out / "checkpoint.json").read_text())["data"]["failures"] == 0
