"""``cxrground.ils.pairs.IlsPairs``: an ``ils build`` folder as a map-style dataset that a torch DataLoader batches
as it is (masks, instructions, answers, splits, negatives), the same in worker processes and run after run."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from cxrground.errors import InputError
from cxrground.ils.frames import export_dataset
from cxrground.ils.pairs import ITEM_KEYS, IlsPairs
from cxrground.ils.schema import load_dataset
from cxrground.io.image import read_image
from cxrground.io.masks import read_mask_png


@pytest.fixture(scope="module")
def built(build_tiny_ils, tiny_ils_tasks, tmp_path_factory) -> tuple[Path, Path]:
    """(dataset folder, image root) of the tiny build."""
    out = build_tiny_ils(tmp_path_factory.mktemp("pairs") / "ils")
    tasks, _ = tiny_ils_tasks
    first = tasks[0]
    root = Path(first.image_path[: -len(first.relative_image_path)])
    return out, root


def _all_pairs(dataset: Path, splits: tuple[str, ...]) -> list[tuple[str, str, dict, bool]]:
    data = load_dataset(dataset)
    return [(split, key, pair, positive) for split in splits for key, study in data.get(split, {}).items()
            for kind, positive in (("positive_pairs", True), ("negative_pairs", False))
            for pair in study["instruction_answer_pairs"][kind]]


def test_items_hold_the_film_the_mask_and_the_pair_in_file_order(built) -> None:
    dataset, images = built
    splits = ("train", "val", "test")
    pairs = IlsPairs(dataset, images, splits=splits)
    expected = _all_pairs(dataset, splits)
    assert len(pairs) == len(expected) and any(p for *_, p in expected) and not all(p for *_, p in expected)
    data = load_dataset(dataset)
    for i, (split, key, pair, positive) in enumerate(expected):
        item = pairs[i]
        assert set(item) == set(ITEM_KEYS)
        assert (item["split"], item["study_key"], item["pair_id"]) == (split, key, pair["pair_id"])
        assert (item["instruction"], item["answer"], item["positive"]) == (pair["instruction"], pair["answer"],
                                                                           positive)
        film = read_image(images / data[split][key]["image_path"])
        assert np.array_equal(item["image"], film.pixels) and item["image"].flags.writeable
        if positive:
            assert np.array_equal(item["mask"], read_mask_png(dataset / "lesion_mask" / pair["seg_mask_path"],
                                                              film.shape))
            assert item["mask"].any()
        else:  # a negative: an empty mask of the film's size, never None
            assert item["mask"].shape == film.shape and not item["mask"].any()
        assert all(v is not None for v in item.values())


def test_splits_positives_and_negatives_are_chosen(built) -> None:
    dataset, images = built
    train = IlsPairs(dataset, images)  # the train split by default
    assert {train[i]["split"] for i in range(len(train))} == {"train"}
    positives = IlsPairs(dataset, images, negatives=False)
    negatives = IlsPairs(dataset, images, positives=False)
    assert len(positives) + len(negatives) == len(train)
    assert all(p.positive for p in positives.pairs) and not any(p.positive for p in negatives.pairs)
    with pytest.raises(InputError, match="has no split nope"):
        IlsPairs(dataset, images, splits="nope")


def test_a_torch_dataloader_batches_them_the_same_with_workers_and_run_after_run(built) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    dataset, images = built
    pairs = IlsPairs(dataset, images, splits=("train", "val", "test"), size=64)
    assert len(pickle.dumps(pairs)) < 100_000  # what each worker process gets

    def epoch(workers: int) -> list[tuple[list[str], bytes, bytes]]:
        loader = DataLoader(pairs, batch_size=3, shuffle=True, num_workers=workers,
                            generator=torch.Generator().manual_seed(0))
        return [(batch["pair_id"], batch["mask"].numpy().tobytes(), batch["image"].numpy().tobytes())
                for batch in loader]

    first = epoch(0)
    batch = next(iter(DataLoader(pairs, batch_size=3)))
    assert tuple(batch["image"].shape) == (3, 64, 64) and batch["mask"].dtype == torch.bool
    assert tuple(batch["box"].shape) == (3, 6) and batch["positive"].dtype == torch.bool
    assert sum(len(ids) for ids, _, _ in first) == len(pairs)
    assert epoch(2) == first
    assert epoch(0) == first


def test_the_letterbox_keeps_the_mask_on_the_film(built) -> None:
    dataset, images = built
    native = IlsPairs(dataset, images, splits=("train", "val", "test"), negatives=False)
    square = IlsPairs(dataset, images, splits=("train", "val", "test"), negatives=False, size=128)
    item, small = native[0], square[0]
    src_h, src_w, rh, rw, oy, ox = small["box"].tolist()
    assert (src_h, src_w) == item["mask"].shape and max(rh, rw) == 128
    inside = small["mask"][oy:oy + rh, ox:ox + rw]
    assert small["mask"].sum() == inside.sum() > 0  # nothing on the padding
    share = item["mask"].mean()
    assert abs(inside.mean() - share) < 0.05


def test_a_released_frame_export_reads_on_the_native_grid(built, tmp_path) -> None:
    dataset, images = built
    released = tmp_path / "released"
    export_dataset(dataset, released, frame="released", size=64)
    native = IlsPairs(dataset, images, splits=("train", "val", "test"), negatives=False)
    mapped = IlsPairs(released, images, splits=("train", "val", "test"), negatives=False)
    assert len(mapped) == len(native)
    a, b = native[0], mapped[0]
    assert a["mask"].shape == b["mask"].shape == a["image"].shape
    assert (a["mask"] & b["mask"]).sum() / max(1, (a["mask"] | b["mask"]).sum()) > 0.7


def test_a_missing_film_is_named_and_check_lists_it(built, tmp_path) -> None:
    dataset, _ = built
    pairs = IlsPairs(dataset, tmp_path / "no-films")
    with pytest.raises(InputError) as err:
        pairs[0]
    assert "no-films" in str(err.value)
    failures = pairs.check()
    studies = {p.image_path for p in pairs.pairs}
    assert len(failures) == len(studies) and all("no-films" in f.path for f in failures)


def test_a_dataset_file_that_is_no_dataset_is_named(tmp_path) -> None:
    bad = tmp_path / "mimic_ils_instruction_answer.json"
    bad.write_text(json.dumps({"train": [1, 2]}), encoding="utf-8")
    with pytest.raises(InputError) as err:
        IlsPairs(tmp_path)
    assert "mimic_ils_instruction_answer.json" in str(err.value)
