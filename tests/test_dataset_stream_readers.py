"""Commands that read a whole finished ILS dataset (the exports, ``ils train``'s pairs, the review card's counts,
``percept build`` and its candidate masks) read it as a stream (:func:`cxrground.ils.schema.iter_dataset`): the
file is never loaded whole, a top level readers cannot use is refused before anything is written, and a broken
study anywhere refuses the export and leaves ``--out`` as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cxrground.ils.schema as schema
from cxrground.errors import InputError
from cxrground.ils.export_coco import ANNOTATION_DIR, PAIRS_FILE, export_coco
from cxrground.ils.frames import export_dataset
from cxrground.ils.layout import DATASET_FILE
from cxrground.ils.schema import SPLITS, read_dataset
from cxrground.models.baseline.data import load_pairs


def _refuse(path):
    raise AssertionError(f"the whole dataset file was loaded: {path}")


@pytest.fixture
def no_whole_read(monkeypatch):
    """Loading a dataset file whole fails the test."""
    monkeypatch.setattr(schema, "load_dataset", _refuse)


@pytest.fixture
def tiny(build_tiny_ils, tmp_path):
    """A tiny built dataset folder and its dataset as a dict (read before the whole-file reader is refused)."""
    ds = build_tiny_ils(tmp_path / "ils")
    return ds, read_dataset(ds / DATASET_FILE)


def _pairs(data: dict, split: str | None = None) -> list[dict]:
    return [p for name in SPLITS if split in (None, name) for s in data.get(name, {}).values()
            for kind in ("positive_pairs", "negative_pairs") for p in s["instruction_answer_pairs"].get(kind, [])]


def test_exports_and_train_pairs_stream_the_file(tiny, tmp_path, no_whole_read):
    ds, data = tiny
    counts = export_coco(ds, tmp_path / "coco")
    lines = [json.loads(line) for line in (tmp_path / "coco" / PAIRS_FILE).read_text().splitlines()]
    assert [line["pair_id"] for line in lines] == [p["pair_id"] for p in _pairs(data)]  # every pair, in file order
    assert counts["pairs"] == len(lines)
    assert counts["images"] == sum(len(data.get(s, {})) for s in SPLITS)
    written = sorted(p.name for p in (tmp_path / "coco" / ANNOTATION_DIR).iterdir())
    assert written == sorted(f"instances_{s}.json" for s in SPLITS if data.get(s))
    native = export_dataset(ds, tmp_path / "native", frame="native")
    assert native["studies"] == counts["images"]
    assert native["masks"] == len({p["seg_mask_path"] for p in _pairs(data) if p.get("seg_mask_path")})
    for split in SPLITS:
        assert [p.pair_id for p in load_pairs(ds, split)] == [p["pair_id"] for p in _pairs(data, split)]


def test_hf_export_streams_the_file(tiny, tiny_ils_tasks, tmp_path, no_whole_read):
    pytest.importorskip("datasets")
    from cxrground.ils.export_hf import export_hf

    ds, data = tiny
    task = tiny_ils_tasks[0][0]
    images = Path(task.image_path[: -len(task.relative_image_path)])
    result = export_hf(ds, images, tmp_path / "hf")
    assert result["rows"] == len(_pairs(data))
    assert {s: v["num_examples"] for s, v in result["splits"].items() if v["num_examples"]} == \
        {s: len(_pairs(data, s)) for s in SPLITS if _pairs(data, s)}


def test_review_card_counts_stream_the_file(tiny, no_whole_read):
    from cxrground.percept.cases import key_id
    from cxrground.review.export import _pair_counts

    ds, data = tiny
    totals, keys = _pair_counts(ds / DATASET_FILE)
    assert totals == {s: len(_pairs(data, s)) for s in SPLITS}
    assert keys == {key_id(p["target"], p["pair_id"]) for p in _pairs(data)}


def test_an_unknown_split_is_refused_before_anything_is_written(tiny, tmp_path):
    ds, data = tiny
    (ds / DATASET_FILE).write_text(json.dumps({**data, "holdout": {}}), encoding="utf-8")
    for export in (lambda out: export_coco(ds, out), lambda out: export_dataset(ds, out, frame="native")):
        with pytest.raises(InputError, match="unknown split 'holdout'"):
            export(tmp_path / "out")
        assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match="unknown split 'holdout'"):
        load_pairs(ds, "train")


def test_a_broken_last_study_refuses_the_export_and_leaves_out_as_it_was(tiny, tmp_path):
    ds, data = tiny
    split = [s for s in SPLITS if data.get(s)][-1]
    last = list(data[split])[-1]
    out = tmp_path / "coco"
    export_coco(ds, out)
    before = sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file())
    del data[split][last]["instruction_answer_pairs"]
    (ds / DATASET_FILE).write_text(json.dumps(data), encoding="utf-8")
    for export in (lambda: export_coco(ds, out, overwrite=True),
                   lambda: export_dataset(ds, out, frame="native", overwrite=True)):
        with pytest.raises(InputError, match=f"{split}.{last}"):
            export()
        assert sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file()) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["coco", "ils"]  # no staging folder left


def test_percept_reads_only_the_splits_it_draws_from(tiny, monkeypatch):
    """A broken study in a split ``percept build`` does not draw from does not stop it; its error message lists
    the dataset's splits with their studies."""
    from cxrground.errors import ConfigError
    from cxrground.percept import build as percept_build
    from cxrground.percept.options import BuildOptions

    ds, data = tiny
    drawn = next(s for s in SPLITS if data.get(s))
    other = next(s for s in SPLITS if s != drawn)
    data[other] = {"broken": {"image_path": 3}}
    (ds / DATASET_FILE).write_text(json.dumps(data), encoding="utf-8")
    with monkeypatch.context() as m:
        m.setattr(schema, "load_dataset", _refuse)
        with pytest.raises(ConfigError, match="--images"):  # past the dataset read: the image folder is checked
            percept_build.build_benchmark(BuildOptions(ils=str(ds), images=str(ds / "no-films"), splits=(drawn,)),
                                          ds.parent / "bench", progress=False)
    data[other] = {}
    (ds / DATASET_FILE).write_text(json.dumps(data), encoding="utf-8")
    opts = BuildOptions(ils=str(ds), images="unused", splits=("nosuch",))
    with pytest.raises(ConfigError, match=rf"--split nosuch: no study .* its splits: {drawn} \({len(data[drawn])} "):
        percept_build._check_settings(opts, read_dataset(ds / DATASET_FILE, splits=("nosuch",)), ds / DATASET_FILE)


def test_gallery_and_review_import_read_a_released_frame_export(tiny, tiny_ils_tasks, tmp_path):
    """The export `ils build` points to (masks 512x512, the released frame) is shown and imported whole, its masks
    mapped back onto each film as the native dataset's are."""
    import numpy as np

    from cxrground.ils.gallery import render_gallery
    from cxrground.io.masks import decode_rle
    from cxrground.review.importers import ils_items

    ds, data = tiny
    task = tiny_ils_tasks[0][0]
    images = Path(task.image_path[: -len(task.relative_image_path)])
    released = tmp_path / "released"
    export_dataset(ds, released, frame="released")
    n_studies = sum(len(data.get(s, {})) for s in SPLITS)
    result = render_gallery(released, images, tmp_path / "g.html", limit=n_studies)
    assert result.shown == n_studies and not result.failed and not result.more
    failures: list = []
    native_items = {i["key"]: i for i in ils_items(ds, images)}
    items = {i["key"]: i for i in ils_items(released, images, failures=failures)}
    assert not failures and items.keys() == native_items.keys()
    positives = [k for k, i in items.items() if i["positive"]]
    assert positives
    for key in positives:
        shape = (items[key]["height"], items[key]["width"])
        a, b = decode_rle(items[key]["mask"], shape), decode_rle(native_items[key]["mask"], shape)
        assert (a & b).sum() / max(1, (a | b).sum()) > 0.9 or not b.any()
    assert all(np.asarray(decode_rle(items[k]["mask"])).shape == (items[k]["height"], items[k]["width"])
               for k in positives)


def test_evaluating_another_splits_predictions_is_refused_with_the_reason(tiny, tmp_path):
    from cxrground.evaluation.ils.dataset import evaluate_dataset
    from cxrground.ils.predictions import PredictionWriter

    ds, data = tiny
    key, study = next(iter(data["train"].items()))
    del data["train"][key]
    data["test"] = {key: study}
    (ds / DATASET_FILE).write_text(json.dumps(data), encoding="utf-8")
    test_pairs = _pairs(data, "test")
    preds = tmp_path / "pred_test.jsonl"
    with PredictionWriter(preds) as writer:
        for p in test_pairs:
            writer.write(p["pair_id"], p["answer"], None, p["instruction"])
    n_train = len(_pairs(data, "train"))
    with pytest.raises(InputError, match=rf"none of the {n_train} pairs of split train has a prediction here "
                                         rf"\({len(test_pairs)} pairs of split test\)") as err:
        evaluate_dataset(ds, preds, split="train", n_boot=10)
    assert err.value.path == str(preds)
    assert evaluate_dataset(ds, preds, split="test", n_boot=10)["n_pairs"] == len(test_pairs)
    with PredictionWriter(tmp_path / "empty.jsonl"):
        pass
    assert len(evaluate_dataset(ds, tmp_path / "empty.jsonl", split="train", n_boot=10)["missing"]) == n_train
