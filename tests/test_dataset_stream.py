"""The ILS dataset JSON read as a stream (:func:`cxrground.ils.schema.iter_dataset`, ``read_dataset(splits=...)``):
the same studies and the same checks as the whole-file reader, one split held in memory, and the readers that need
only part of a dataset (``ils gallery``, ``ils predict``, ``ils evaluate``) reading only that part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cxrground.errors import InputError
from cxrground.ils.gallery import render_gallery
from cxrground.ils.layout import DATASET_FILE
from cxrground.ils.predictions import unused_reasons
from cxrground.ils.schema import SPLITS, dataset_splits, iter_dataset, read_dataset


def _pair(key: str, kind: str, i: int) -> dict:
    pair = {"pair_id": f"{key}_{kind}_{i}", "instruction": "Segment the effusion.", "answer": "x", "type": "global",
            "target": "effusion"}
    return {**pair, "seg_mask_path": f"{key}/{key}_effusion_{i}.png"} if kind == "positive" else pair


def _study(key: str, positives: int = 1, negatives: int = 1) -> dict:
    return {"image_path": f"files/{key}.jpg", "score": 0.25,
            "instruction_answer_pairs": {"positive_pairs": [_pair(key, "positive", i) for i in range(positives)],
                                         "negative_pairs": [_pair(key, "negative", i) for i in range(negatives)]}}


def _dataset() -> dict:
    return {"train": {f"s{i}": _study(f"s{i}") for i in range(1, 5)}, "val": {"s10": _study("s10")},
            "test": {"s20": _study("s20", 2, 0), "s21": _study("s21", 0, 3)}}


def _write(path: Path, data: object) -> Path:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2), encoding="utf-8")
    return path


def test_the_stream_gives_the_whole_file_readers_studies(tmp_path):
    file = _write(tmp_path / DATASET_FILE, _dataset())
    whole = read_dataset(file)
    streamed = [(split, key, study) for split, key, study in iter_dataset(tmp_path)]  # a folder names its file
    assert streamed == [(split, key, study) for split in SPLITS for key, study in whole[split].items()]
    assert isinstance(streamed[0][2]["score"], float)  # numbers as floats, not Decimal
    assert read_dataset(file, splits=("test",)) == {"test": whole["test"]}
    assert read_dataset(file, splits=("val", "train")) == {"val": whole["val"], "train": whole["train"]}
    assert [split for split, _k, _s in iter_dataset(file, splits=("test", "val"))] == ["test", "test", "val"]
    assert dataset_splits(file) == list(SPLITS)


def test_a_split_the_file_lacks_is_absent_and_an_empty_one_is_empty(tmp_path):
    file = _write(tmp_path / "d.json", {"train": {"s1": _study("s1")}, "test": {}})
    assert read_dataset(file, splits=("val", "test")) == {"test": {}}
    _write(file, {"train": [], "test": {}})
    with pytest.raises(InputError, match="split train must be a JSON object of studies, got array"):
        read_dataset(file, splits=("train",))


@pytest.mark.parametrize(("content", "words"), [
    ("", "the dataset JSON file is empty"),
    ("  \n ", "the dataset JSON file is empty"),
    ("[1, 2]", "must be a JSON object {split: {study_key: study}}"),
    ('{"train": {"s1": {"image_path": "a.jpg", "instruction', "not valid JSON (parse error: premature EOF)"),
    (b'{"train": {"s1": {"image_path": "a\xff.jpg", "instruction_answer_pairs": {}}}}',
     "not valid JSON (lexical error: invalid bytes in UTF8 string."),
    ('{"train": {"s1": {"image_path": 3, "instruction_answer_pairs": {}}}}',
     "train.s1: image_path must be a string, got int"),
])
def test_a_file_readers_cannot_use_is_named_with_the_reason(tmp_path, content, words):
    file = _write(tmp_path / "d.json", content)
    for read in (lambda: list(iter_dataset(file)), lambda: read_dataset(file, splits=("train",))):
        with pytest.raises(InputError) as info:
            read()
        assert info.value.path == str(file) and words in str(info.value)
        assert "\n" not in str(info.value)


def test_a_missing_file_or_a_folder_is_named(tmp_path):
    with pytest.raises(InputError, match="dataset JSON not found"):
        list(iter_dataset(tmp_path / "nope.json"))
    (tmp_path / "ds" / DATASET_FILE).mkdir(parents=True)
    with pytest.raises(InputError, match="is a folder, not the dataset JSON file"):
        read_dataset(tmp_path / "ds", splits=("test",))


def test_a_broken_study_is_found_when_the_stream_reaches_it(tmp_path):
    data = _dataset()
    del data["test"]["s21"]["instruction_answer_pairs"]["negative_pairs"][1]["answer"]
    file = _write(tmp_path / "d.json", data)
    first = next(iter_dataset(file))
    assert first[:2] == ("train", "s1")
    with pytest.raises(InputError, match=r"test\.s21 negative pair 1 has no 'answer'"):
        read_dataset(file, splits=("test",))
    assert list(read_dataset(file, splits=("train",))["train"]) == ["s1", "s2", "s3", "s4"]  # only train is read


def test_unused_reasons_read_from_a_stream(tmp_path):
    file = _write(tmp_path / "d.json", _dataset())
    studies = ((split, study) for split, _key, study in iter_dataset(file, ()))
    predicted = ["s20_positive_0", "s20_positive_1", "s21_negative_0", "s21_negative_2", "s1_positive_0", "zz"]
    reasons = unused_reasons(studies, predicted, "test", n_scored=3)
    assert reasons == {"past --limit": 1, "pairs of split train": 1, "pair ids not in the dataset": 1}


def test_the_gallery_reads_only_as_far_as_it_shows(build_tiny_ils, tiny_ils_tasks, tmp_path):
    """A study past the ones shown is not read: a broken record there does not stop a --limit gallery, and the
    same record among the shown ones does."""
    ds = build_tiny_ils(tmp_path / "ils")
    task = tiny_ils_tasks[0][0]
    images = Path(task.image_path[: -len(task.relative_image_path)])
    data = json.loads((ds / DATASET_FILE).read_text())
    keys = [(split, key) for split in SPLITS for key in data.get(split, {})]
    assert len(keys) >= 2
    split, last = keys[-1]
    del data[split][last]["image_path"]
    _write(ds / DATASET_FILE, data)
    result = render_gallery(ds, images, tmp_path / "g.html", limit=1)
    assert result.shown == 1 and result.more
    assert "the dataset has more" in (tmp_path / "g.html").read_text()
    with pytest.raises(InputError, match=f"{split}.{last} has no 'image_path'"):
        render_gallery(ds, images, tmp_path / "g2.html", limit=len(keys))


def test_stats_count_a_stream_and_refuse_an_unknown_split(tmp_path):
    from cxrground.ils.card import count_table, stats_text

    _write(tmp_path / DATASET_FILE, _dataset())
    whole = read_dataset(tmp_path / DATASET_FILE)
    assert json.loads(stats_text(tmp_path, as_json=True)) == {
        s: {"studies": len(whole.get(s, {})), **count_table(whole.get(s, {}))} for s in SPLITS}
    _write(tmp_path / DATASET_FILE, {**_dataset(), "holdout": {}})
    with pytest.raises(InputError, match="unknown split 'holdout'"):
        stats_text(tmp_path)
    _write(tmp_path / DATASET_FILE, {"train": {}, "test": "none"})
    with pytest.raises(InputError, match="split test must be a JSON object of studies, got string"):
        stats_text(tmp_path)


def test_a_deep_file_a_byte_order_mark_and_a_twice_named_study_are_refused(tmp_path):
    deep = _write(tmp_path / "deep.json", '{"train": {"s1": ' + "[" * 100_000 + "]" * 100_000 + "}}")
    with pytest.raises(InputError, match="JSON nested too deeply"):
        list(iter_dataset(deep))
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(_dataset()).encode())
    with pytest.raises(InputError, match="byte-order mark"):
        read_dataset(bom, splits=("test",))
    twice = json.dumps(_dataset()).replace('"s21":', '"s20":')  # two studies under one key
    with pytest.raises(InputError, match=r"study test\.s20 appears twice"):
        read_dataset(_write(tmp_path / "twice.json", twice), splits=("test",))
    assert read_dataset(_write(tmp_path / "ok.json", _dataset()), splits=("test",))["test"]  # brackets in strings
