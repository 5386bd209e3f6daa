"""ILS location-label masks (cxrground.anatomy.ils_locations) on hand-built lungs."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.anatomy import ils_location_masks, location_union, lung_zone_bands
from cxrground.errors import MaskShapeError
from cxrground.vocab.locations import ILS_LOCATION_LABELS
from masks_helpers import rect, rows_of


def test_bands_of_a_rectangle_lung_have_the_exact_row_ranges() -> None:
    # rows 10..40: y0 = 10, h = y1 - y0 = 30
    # apical: y <= 10 + 0.22*30 = 16.6 -> rows 10..16; upper: y <= 20 -> 10..20
    # mid: 20 < y <= 30 -> 21..30; base: y > 30 -> 31..40
    lung = rect((50, 30), (10, 40), (5, 24))
    bands = lung_zone_bands(lung)
    assert rows_of(bands["apical zone lung"]) == list(range(10, 17))
    assert rows_of(bands["upper zone lung"]) == list(range(10, 21))
    assert rows_of(bands["mid zone lung"]) == list(range(21, 31))
    assert rows_of(bands["lung base"]) == list(range(31, 41))
    # bands keep the lung's columns
    assert int(bands["mid zone lung"].sum()) == 10 * 20


def test_apical_is_inside_upper_and_upper_mid_base_partition_the_lung() -> None:
    lung = rect((64, 32), (3, 57), (2, 20))
    bands = lung_zone_bands(lung)
    assert not (bands["apical zone lung"] & ~bands["upper zone lung"]).any()
    parts = [bands["upper zone lung"], bands["mid zone lung"], bands["lung base"]]
    assert sum(int(p.sum()) for p in parts) == int(lung.sum())
    assert np.array_equal(parts[0] | parts[1] | parts[2], lung)


def test_empty_lung_gives_empty_bands() -> None:
    bands = lung_zone_bands(np.zeros((20, 20), dtype=bool))
    assert set(bands) == {"apical zone lung", "upper zone lung", "mid zone lung", "lung base"}
    assert not any(b.any() for b in bands.values())


def test_location_masks_cover_all_labels_and_sides() -> None:
    shape = (50, 60)
    right = rect(shape, (10, 40), (5, 24))
    left = rect(shape, (12, 42), (35, 54))
    masks = ils_location_masks(right, left)
    assert set(masks) == {*ILS_LOCATION_LABELS, "lung"}
    assert np.array_equal(masks["right lung"], right)
    assert np.array_equal(masks["left lung"], left)
    assert np.array_equal(masks["lung"], right | left)
    # left lung rows 12..42: h = 30, base y > 12 + 20 = 32 -> rows 33..42, columns of the left lung only
    assert rows_of(masks["left lung base"]) == list(range(33, 43))
    assert not (masks["left lung base"] & right).any()
    assert rows_of(masks["right apical zone lung"]) == list(range(10, 17))


def test_empty_left_lung_gives_empty_left_labels() -> None:
    shape = (30, 30)
    masks = ils_location_masks(rect(shape, (2, 20), (1, 10)), np.zeros(shape, dtype=bool))
    assert not any(masks[lab].any() for lab in ILS_LOCATION_LABELS if lab.startswith("left"))
    assert masks["right mid zone lung"].any()


def test_shape_mismatch_names_both_shapes() -> None:
    with pytest.raises(MaskShapeError) as info:
        ils_location_masks(np.zeros((50, 60), dtype=bool), np.zeros((50, 61), dtype=bool))
    msg = str(info.value)
    assert "(50, 60)" in msg and "(50, 61)" in msg


def test_location_union_ors_labels_and_rejects_unknown_ones() -> None:
    shape = (50, 60)
    masks = ils_location_masks(rect(shape, (10, 40), (5, 24)), rect(shape, (12, 42), (35, 54)))
    union = location_union(masks, ["right lung base", "left upper zone lung"])
    assert np.array_equal(union, masks["right lung base"] | masks["left upper zone lung"])
    with pytest.raises(KeyError, match="middle lobe"):
        location_union(masks, ["right middle lobe"])
    with pytest.raises(ValueError):
        location_union(masks, [])
