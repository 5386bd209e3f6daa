"""``ils train --model lisa`` on unreadable images (tiny random LISA on the CPU): a truncated, a text-as-image and a
missing image are recorded in ``CKPT/failures.jsonl`` (the baseline's record shape) and counted in
``checkpoint.json`` while the rest trains; a split with no readable image is a clear error; a resume whose usable
pairs changed is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from cxrground.errors import ConfigError, InputError  # noqa: E402
from cxrground.ils.layout import DATASET_FILE  # noqa: E402
from cxrground.models.lisa.training import RESUME_FILE, load_samples, train  # noqa: E402
from ils_helpers import tiny_ils  # noqa: E402

TINY = {"tiny": "true", "max_steps": "1", "batch_size": "4", "micro_batch_size": "2", "max_length": "512",
        "threads": "1"}


@pytest.fixture(scope="module")
def ils(tmp_path_factory) -> Path:
    """A 6-study cohort (5 train studies, 1 test study) and its ILS dataset."""
    return tiny_ils(tmp_path_factory.mktemp("lisa-failures"), 6)


def _studies(ils: Path, split: str) -> list[tuple[str, int]]:
    """``(image_path, number of pairs)`` of every study of ``split``, in file order."""
    data = json.loads((ils / "ils" / DATASET_FILE).read_text())
    return [(s["image_path"], sum(len(v) for v in s["instruction_answer_pairs"].values()))
            for s in data.get(split, {}).values()]


def _images(ils: Path, dest: Path) -> Path:
    shutil.copytree(ils / "cohort" / "files", dest)
    return dest


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:300])


def _train(ils: Path, out: Path, images: Path, **kwargs) -> Path:
    return train(ils / "ils", out, images=images, seed=0, overrides=TINY, progress=False, **kwargs)


def test_unreadable_images_are_recorded_and_the_rest_trains(ils, tmp_path):
    images = _images(ils, tmp_path / "images")
    train_studies, test_studies = _studies(ils, "train"), _studies(ils, "test")
    (truncated, n_truncated), (missing, n_missing) = train_studies[0], train_studies[2]
    text, n_text = test_studies[0]
    _truncate(images / truncated)
    (images / missing).unlink()
    (images / text).write_text("not an image\n")
    said: list[str] = []
    out = _train(ils, tmp_path / "ck", images, val_split="test", log=said.append)
    lines = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [(f["path"], f["stage"], f["error"], f["split"]) for f in lines] == [
        (str(images / truncated), "train-images", "ImageReadError", "train"),
        (str(images / missing), "train-images", "ImageReadError", "train"),
        (str(images / text), "train-images", "ImageReadError", "test")]
    assert "truncated or corrupt" in lines[0]["reason"] and lines[1]["reason"] == "file not found"
    assert "not a recognised image format" in lines[2]["reason"]
    info = json.loads((out / "checkpoint.json").read_text())
    assert info["step"] == 1
    n_train = sum(n for _, n in train_studies)
    data = info["data"]
    assert data["train"]["pairs"] == n_train and data["train"]["failed_images"] == 2
    assert data["train"]["used"] == n_train - n_truncated - n_missing == info["train_pairs"]
    assert data["test"] == {**data["test"], "pairs": n_text, "used": 0, "failed_images": 1}
    assert data["failures"] == 3 and data["pairs_left_out"] == n_truncated + n_missing + n_text
    assert said == [f"3 unreadable images: {data['pairs_left_out']} pairs left out; see {out / 'failures.jsonl'}"]


def test_a_split_without_a_readable_image_is_a_clear_error(ils, tmp_path):
    images = _images(ils, tmp_path / "images")
    studies = _studies(ils, "train")
    for rel, _ in studies:
        _truncate(images / rel)
    (images / studies[0][0]).unlink()
    out = tmp_path / "ck"
    with pytest.raises(InputError) as caught:
        _train(ils, out, images, val_split=None)
    message = str(caught.value)
    assert caught.value.path == str(ils / "ils" / DATASET_FILE)
    assert f"no pair of split 'train' has a readable image ({len(studies)} unreadable" in message
    assert f"the first {images / studies[0][0]}: file not found" in message and str(out / "failures.jsonl") in message
    assert len((out / "failures.jsonl").read_text().splitlines()) == len(studies)
    assert not (out / "checkpoint.json").exists()


def test_a_resume_with_other_usable_pairs_is_refused(ils, tmp_path):
    images = _images(ils, tmp_path / "images")
    rel, n_pairs = _studies(ils, "train")[1]
    n_train = sum(n for _, n in _studies(ils, "train"))
    (images / rel).rename(tmp_path / "kept.jpg")
    out = _train(ils, tmp_path / "ck", images, val_split=None)
    assert (out / RESUME_FILE).is_file()
    recorded = (out / "failures.jsonl").read_bytes()
    assert _train(ils, out, images, val_split=None) == out  # the same usable pairs: resumes (nothing left to do)
    (tmp_path / "kept.jpg").rename(images / rel)  # the image is back: more usable pairs than the checkpoint's
    with pytest.raises(ConfigError, match=rf"cannot resume {out}: the usable pairs differ from the checkpoint's "
                                          rf"\(train: {n_train} of {n_train} pairs usable now, "
                                          rf"{n_train - n_pairs} of {n_train} then"):
        _train(ils, out, images, val_split=None)
    assert (out / "failures.jsonl").read_bytes() == recorded  # a refused resume leaves the checkpoint as it was
    _truncate(images / rel)  # unreadable again, for another reason: the same usable pairs resume
    assert _train(ils, out, images, val_split=None) == out
    shutil.copytree(ils / "cohort" / "files", images, dirs_exist_ok=True)
    _train(ils, out, images, val_split=None, resume=False)  # starting over is allowed
    assert (out / "failures.jsonl").read_text() == ""
    assert json.loads((out / "checkpoint.json").read_text())["data"]["failures"] == 0


def test_a_validation_limit_reads_only_the_images_it_needs(ils, tmp_path, monkeypatch):
    from cxrground.models.lisa import training

    images = _images(ils, tmp_path / "images")
    studies = _studies(ils, "train")
    _truncate(images / studies[0][0])
    read: list[Path] = []
    real = training.image_failure
    monkeypatch.setattr(training, "image_failure", lambda p: read.append(p) or real(p))
    samples, failures = load_samples(ils / "ils", images, "train", limit=studies[1][1] + 1)
    assert [f.path for f in failures] == [str(images / studies[0][0])]
    assert [s.image for s in samples] == [images / studies[1][0]] * studies[1][1] + [images / studies[2][0]]
    assert read == [images / rel for rel, _ in studies[:3]]


def test_a_zero2_resume_with_other_usable_pairs_is_refused(ils, tmp_path, monkeypatch):
    pytest.importorskip("deepspeed")
    from cxrground.models.lisa.zero import RESUME_DIR, STATE_FILE
    from test_models_lisa_zero import _one_process_env

    _one_process_env(monkeypatch)  # a one-process DeepSpeed run in this process (gloo on the CPU)
    images = _images(ils, tmp_path / "images")
    rel, n_pairs = _studies(ils, "train")[1]
    n_train = sum(n for _, n in _studies(ils, "train"))
    (images / rel).unlink()
    zero = {**TINY, "distributed": "deepspeed"}
    out = train(ils / "ils", tmp_path / "ck", images=images, seed=0, overrides=zero, val_split=None, progress=False)
    state = json.loads(next((out / RESUME_DIR).glob(f"step_*/{STATE_FILE}")).read_text())
    assert state["data"] == json.loads((out / "checkpoint.json").read_text())["data"]
    assert state["data"]["train"]["used"] == n_train - n_pairs
    shutil.copy2(ils / "cohort" / "files" / rel, images / rel)
    with pytest.raises(ConfigError, match=rf"cannot resume {out}: the usable pairs differ .*train: {n_train} of "
                                          rf"{n_train} pairs usable now, {n_train - n_pairs} of {n_train} then"):
        train(ils / "ils", out, images=images, seed=0, overrides=zero, val_split=None, progress=False)
