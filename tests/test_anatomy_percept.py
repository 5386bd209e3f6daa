"""CheXpercept geometry (CHEXPERCEPT.md §5.1-§5.5) and the §0 scale rule, on hand-built lungs.

Every expected row/column range below is worked out by hand in the comments.
"""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.anatomy import (
    SUBREGION_NAMES,
    SUBREGION_ZONE,
    erosion_kernel_size,
    geometry_lungs,
    largest_component,
    lung_core,
    medial_lateral,
    percept_geometry,
    scale_area,
    scale_factor,
    scale_kernel,
    scale_length,
    vertical_thirds,
)
from cxrground.errors import MaskShapeError
from masks_helpers import rect, rows_of


def cols_of(mask: np.ndarray) -> list[int]:
    return [int(c) for c in np.flatnonzero(mask.any(axis=0))]


def bands(shape: tuple[int, int], *pieces: tuple[tuple[int, int], tuple[int, int]]) -> np.ndarray:
    """Union of rectangles given as ((row0, row1), (col0, col1))."""
    out = np.zeros(shape, dtype=bool)
    for rows, cols in pieces:
        out |= rect(shape, rows, cols)
    return out


# --- §5.2 zones ------------------------------------------------------------------------------------

def test_vertical_thirds_of_a_30_row_lung() -> None:
    # rows 10..39: h = 30, b1 = 10 + 10 = 20, b2 = 10 + 20 = 30
    lung = rect((50, 20), (10, 39), (2, 12))
    z = vertical_thirds(lung)
    assert rows_of(z["upper zone lung"]) == list(range(10, 21))
    assert rows_of(z["mid zone lung"]) == list(range(21, 31))
    assert rows_of(z["lung base"]) == list(range(31, 40))


def test_vertical_thirds_with_floor_division() -> None:
    # rows 5..11: h = 7, b1 = 5 + 7//3 = 7, b2 = 5 + 14//3 = 9
    lung = rect((20, 10), (5, 11), (0, 9))
    z = vertical_thirds(lung)
    assert rows_of(z["upper zone lung"]) == [5, 6, 7]
    assert rows_of(z["mid zone lung"]) == [8, 9]
    assert rows_of(z["lung base"]) == [10, 11]


def test_vertical_thirds_single_row_and_empty() -> None:
    # one row: h = max(1, 1) = 1, b1 = b2 = y0 -> everything is upper
    z = vertical_thirds(rect((10, 10), (4, 4), (1, 8)))
    assert rows_of(z["upper zone lung"]) == [4]
    assert not z["mid zone lung"].any() and not z["lung base"].any()
    z = vertical_thirds(np.zeros((10, 10), dtype=bool))
    assert not any(m.any() for m in z.values())


# --- §5.3 halves -----------------------------------------------------------------------------------

def test_medial_lateral_right_lung_is_on_the_image_left() -> None:
    # right lung cols 3..12: mid_x = int(15 / 2) = 7; medial = x >= 7, lateral = x < 7
    lung = rect((10, 40), (1, 8), (3, 12))
    h = medial_lateral(lung, "right")
    assert cols_of(h["medial"]) == list(range(7, 13))
    assert cols_of(h["lateral"]) == list(range(3, 7))


def test_medial_lateral_left_lung() -> None:
    # left lung cols 20..29: mid_x = int(49 / 2) = 24; medial = x < 24, lateral = x >= 24
    lung = rect((10, 40), (1, 8), (20, 29))
    h = medial_lateral(lung, "left")
    assert cols_of(h["medial"]) == list(range(20, 24))
    assert cols_of(h["lateral"]) == list(range(24, 30))
    with pytest.raises(ValueError):
        medial_lateral(lung, "middle")


# --- §5.4 kernel, core, rim, costophrenic angle ----------------------------------------------------

def test_erosion_kernel_from_right_lung_rows_t1_t2() -> None:
    # right lung rows 0..9: t1 = 0 + 9//3 = 3, t2 = 0 + 18//3 = 6
    # row 3 has 10 px, row 6 has 7 px, the others 1 px -> w = 8.5, k = int(4.25) = 4
    right = np.zeros((12, 20), dtype=bool)
    right[0:10, 0] = True
    right[3, 0:10] = True
    right[6, 0:7] = True
    assert erosion_kernel_size(right) == 4
    # an empty right lung: 50 px @1024, scaled by the longest side (§0)
    assert erosion_kernel_size(np.zeros((1024, 800), dtype=bool)) == 50
    assert erosion_kernel_size(np.zeros((1500, 2048), dtype=bool)) == 100
    assert erosion_kernel_size(np.zeros((12, 20), dtype=bool)) == 1
    # a one-pixel-wide lung: w = 1, int(0.5) = 0 -> k = max(1, 0) = 1
    thin = np.zeros((12, 20), dtype=bool)
    thin[2:9, 5] = True
    assert erosion_kernel_size(thin) == 1


def test_core_uses_reflected_borders() -> None:
    # right lung fills rows 0..39, cols 0..9 of a 40x40 image (touches top, bottom and left borders).
    # k: t1 = 13, t2 = 26, w = 10 -> k = 5 (offsets -2..2). With reflected borders the rows never shrink
    # and the image-left edge does not erode: core = rows 0..39, cols 0..7 (x + 2 <= 9).
    right = rect((40, 40), (0, 39), (0, 9))
    left = np.zeros((40, 40), dtype=bool)
    core = lung_core(right, left)
    assert rows_of(core) == list(range(40))
    assert cols_of(core) == list(range(8))
    assert int(core.sum()) == 40 * 8


def test_core_size_with_an_explicit_kernel() -> None:
    # a 30 x 60 rectangle eroded by a 4 x 4 square keeps (30 - 3) x (60 - 3) pixels
    right = rect((100, 100), (20, 49), (10, 69))
    core = lung_core(right, np.zeros_like(right), kernel=4)
    assert int(core.sum()) == 27 * 57
    with pytest.raises(MaskShapeError):
        lung_core(right, np.zeros((100, 99), dtype=bool))


def test_even_kernel_is_anchored_like_the_reference_skimage_erosion() -> None:
    # an 8 x 8 square (rows/cols 10..17) eroded by a 4 x 4 square. The reference (scikit-image >= 0.23) pads
    # the even footprint in front, so the square covers offsets -1..2: y - 1 >= 10 and y + 2 <= 17 -> 11..15.
    # scipy's default covers -2..1: y - 2 >= 10 and y + 1 <= 17 -> 12..16.
    right = rect((30, 30), (10, 17), (10, 17))
    none = np.zeros_like(right)
    reference = lung_core(right, none, kernel=4)
    assert rows_of(reference) == cols_of(reference) == list(range(11, 16))
    scipy_default = lung_core(right, none, kernel=4, anchor="scipy")
    assert rows_of(scipy_default) == cols_of(scipy_default) == list(range(12, 17))
    # an odd square has a centre: both anchorings agree (offsets -2..2 -> 12..15)
    assert np.array_equal(lung_core(right, none, kernel=5), lung_core(right, none, kernel=5, anchor="scipy"))
    assert rows_of(lung_core(right, none, kernel=5)) == list(range(12, 16))
    with pytest.raises(ValueError, match="anchor"):
        lung_core(right, none, kernel=4, anchor="centre")


def test_largest_component_prefers_the_bigger_one_and_is_8_connected() -> None:
    m = np.zeros((10, 10), dtype=bool)
    m[0, 0] = m[1, 1] = m[2, 2] = True  # a diagonal: one 8-connected component of 3
    m[5:7, 5] = True  # 2 px
    out = largest_component(m)
    assert int(out.sum()) == 3 and out[1, 1]
    assert not largest_component(np.zeros((4, 4), dtype=bool)).any()


SHAPE = (100, 100)
RIGHT = rect(SHAPE, (20, 79), (10, 39))  # 60 x 30
LEFT = rect(SHAPE, (20, 79), (60, 89))  # 60 x 30


def test_rectangle_lungs_kernel_and_core() -> None:
    # ry0 = 20, ry1 = 79: t1 = 20 + 59//3 = 39, t2 = 20 + 118//3 = 59; both rows 30 px -> k = 15 (±7)
    g = percept_geometry(RIGHT, LEFT)
    assert g.kernel == 15
    expected = bands(SHAPE, ((27, 72), (17, 32)), ((27, 72), (67, 82)))
    assert np.array_equal(g.core, expected)


def test_rectangle_right_peripheral_and_cpa() -> None:
    # right core c = rows 27..72, cols 17..32; top = (x 17, y 27), bot = (x 17, y 72)
    # rows 20..27 keep x <= 17; rows 28..71 keep x < 17; rows 72..79 keep x <= 17
    g = percept_geometry(RIGHT, LEFT)
    rim = bands(SHAPE, ((20, 27), (10, 17)), ((28, 71), (10, 16)), ((72, 79), (10, 17)))
    assert np.array_equal(g.peripheral["right peripheral lung"], rim)
    assert int(rim.sum()) == 64 + 308 + 64
    # CPA: clear rows y < 20 + int(0.75 * 59) = 20 + 44 = 64
    cpa = bands(SHAPE, ((64, 71), (10, 16)), ((72, 79), (10, 17)))
    assert np.array_equal(g.cpa["right costophrenic angle"], cpa)


def test_rectangle_left_peripheral_uses_the_left_tie_rules() -> None:
    # left core c = rows 27..72, cols 67..82; top: min y 27, tie -> max x = 82;
    # bot: max y 72, tie -> min x = 67 (same rule on both sides)
    # rows 20..27 keep x >= 82; rows 28..71 keep x > 82; rows 72..79 keep x >= 67
    g = percept_geometry(RIGHT, LEFT)
    rim = bands(SHAPE, ((20, 27), (82, 89)), ((28, 71), (83, 89)), ((72, 79), (67, 89)))
    assert np.array_equal(g.peripheral["left peripheral lung"], rim)
    cpa = bands(SHAPE, ((64, 71), (83, 89)), ((72, 79), (67, 89)))
    assert np.array_equal(g.cpa["left costophrenic angle"], cpa)


def test_peripheral_follows_the_core_row_by_row() -> None:
    # right lung: rows 20..49 cols 10..39 and rows 50..79 cols 9..39 (wider at the bottom, laterally)
    # t1 = 39 (30 px), t2 = 59 (31 px): w = 30.5, k = int(15.25) = 15 (offsets ±7)
    # core: rows 27..56 cols 17..32 (window reaches the narrow part), rows 57..72 cols 16..32
    right = bands(SHAPE, ((20, 49), (10, 39)), ((50, 79), (9, 39)))
    g = percept_geometry(right, LEFT)
    assert g.kernel == 15
    # top = (17, 27), bot = (16, 72)
    rim = bands(
        SHAPE,
        ((20, 27), (10, 17)),  # apex band: x <= top.x
        ((28, 49), (10, 16)),  # rows with core min x 17: x < 17
        ((50, 56), (9, 16)),
        ((57, 71), (9, 15)),  # rows with core min x 16: x < 16
        ((72, 79), (9, 16)),  # base band: x <= bot.x
    )
    assert np.array_equal(g.peripheral["right peripheral lung"], rim)


def test_empty_core_falls_back_to_the_whole_lung() -> None:
    # k = 15 from the right lung; the 3-px-wide left lung erodes away completely
    left = rect(SHAPE, (20, 79), (60, 62))
    g = percept_geometry(RIGHT, left)
    assert not (g.core & left).any()
    assert np.array_equal(g.peripheral["left peripheral lung"], left)
    # CPA keeps rows >= 64
    assert np.array_equal(g.cpa["left costophrenic angle"], rect(SHAPE, (64, 79), (60, 62)))


def test_empty_right_lung_uses_k_50_at_1024_and_empty_regions() -> None:
    g = percept_geometry(np.zeros(SHAPE, dtype=bool), LEFT)
    assert g.kernel == 5  # 50 px @1024 on a 100-px image (§0)
    assert not g.peripheral["right peripheral lung"].any()
    assert not any(g.subregions[n].any() for n in SUBREGION_NAMES if n.startswith("right"))
    rim = g.peripheral["left peripheral lung"]
    assert rim.any() and not (rim & ~LEFT).any() and rim.sum() < LEFT.sum()  # the 30-px lung has a 5 x 5 core
    big = (1024, 1024)
    left = rect(big, (200, 799), (600, 629))  # 30 px wide: no 50 x 50 core -> the whole lung is peripheral
    g = percept_geometry(np.zeros(big, dtype=bool), left)
    assert g.kernel == 50 and np.array_equal(g.peripheral["left peripheral lung"], left)


# --- §5.5 sub-regions ------------------------------------------------------------------------------

EXPECTED_NAMES = [
    "right medial lung & right upper zone lung",
    "right medial lung & right mid zone lung",
    "right medial lung & right lung base",
    "right lateral lung & right upper zone lung",
    "right lateral lung & right mid zone lung",
    "right lateral lung & right lung base",
    "right peripheral lung & right upper zone lung",
    "right peripheral lung & right mid zone lung",
    "right peripheral lung & right lung base",
    "right costophrenic angle",
    "left medial lung & left upper zone lung",
    "left medial lung & left mid zone lung",
    "left medial lung & left lung base",
    "left lateral lung & left upper zone lung",
    "left lateral lung & left mid zone lung",
    "left lateral lung & left lung base",
    "left peripheral lung & left upper zone lung",
    "left peripheral lung & left mid zone lung",
    "left peripheral lung & left lung base",
    "left costophrenic angle",
]


def test_twenty_subregion_names_verbatim() -> None:
    assert list(SUBREGION_NAMES) == EXPECTED_NAMES
    g = percept_geometry(RIGHT, LEFT)
    assert list(g.subregions) == EXPECTED_NAMES
    assert set(g.zones) == {
        "right upper zone lung", "right mid zone lung", "right lung base",
        "left upper zone lung", "left mid zone lung", "left lung base",
    }
    assert set(g.halves) == {
        "right medial lung", "right lateral lung", "left medial lung", "left lateral lung",
    }
    assert set(g.peripheral) == {"right peripheral lung", "left peripheral lung"}
    assert set(g.cpa) == {"right costophrenic angle", "left costophrenic angle"}


def test_subregion_to_zone_mapping() -> None:
    assert SUBREGION_ZONE["right medial lung & right upper zone lung"] == "right upper zone lung"
    assert SUBREGION_ZONE["left lateral lung & left mid zone lung"] == "left mid zone lung"
    assert SUBREGION_ZONE["left peripheral lung & left lung base"] == "left lung base"
    assert SUBREGION_ZONE["right costophrenic angle"] == "right lung base"
    assert SUBREGION_ZONE["left costophrenic angle"] == "left lung base"
    assert len(SUBREGION_ZONE) == 20


def test_subregion_masks_are_region_and_zone() -> None:
    g = percept_geometry(RIGHT, LEFT)
    # right lung rows 20..79: h = 60, b1 = 40, b2 = 60; cols 10..39: mid_x = 24, medial = cols 24..39
    medial_upper = g.subregions["right medial lung & right upper zone lung"]
    assert np.array_equal(medial_upper, rect(SHAPE, (20, 40), (24, 39)))
    # peripheral (see the rectangle rim test) ∧ base rows 61..79: rows 61..71 x 10..16, rows 72..79 x 10..17
    periph_base = g.subregions["right peripheral lung & right lung base"]
    assert np.array_equal(periph_base, bands(SHAPE, ((61, 71), (10, 16)), ((72, 79), (10, 17))))
    # left lung cols 60..89: mid_x = int(149/2) = 74, lateral = cols 74..89
    lateral_mid = g.subregions["left lateral lung & left mid zone lung"]
    assert np.array_equal(lateral_mid, rect(SHAPE, (41, 60), (74, 89)))
    assert g.subregions["left costophrenic angle"] is g.cpa["left costophrenic angle"]
    assert g.region("right lung base") is g.zones["right lung base"]
    with pytest.raises(KeyError):
        g.region("right middle lobe")


def test_geometry_is_read_only_and_checks_shapes() -> None:
    g = percept_geometry(RIGHT, LEFT)
    with pytest.raises(ValueError):
        g.zones["right lung base"][0, 0] = True
    with pytest.raises(TypeError):
        g.zones["extra"] = g.core  # type: ignore[index]
    with pytest.raises(MaskShapeError) as info:
        percept_geometry(RIGHT, np.zeros((100, 90), dtype=bool))
    assert "(100, 100)" in str(info.value) and "(100, 90)" in str(info.value)


# --- §5.1 geometry lungs ---------------------------------------------------------------------------

def test_geometry_lungs_intersects_and_merges_touching_lesion_components() -> None:
    shape = (40, 40)
    hyb_r, hyb_l = rect(shape, (10, 29), (5, 14)), rect(shape, (10, 29), (25, 34))
    cxas_r, cxas_l = rect(shape, (12, 31), (5, 14)), rect(shape, (10, 29), (26, 34))
    touching = rect(shape, (25, 35), (10, 12))  # overlaps right rows 25..29
    far = rect(shape, (0, 2), (30, 32))  # touches nothing
    adjacent = rect(shape, (5, 9), (27, 28))  # ends on the row just above the left lung: no shared pixel
    lesion = touching | far | adjacent
    right, left = geometry_lungs(hyb_r, hyb_l, cxas_r, cxas_l, lesion)
    assert np.array_equal(right, rect(shape, (12, 29), (5, 14)) | touching)
    assert np.array_equal(left, rect(shape, (10, 29), (26, 34)))
    # without CXAS masks the HybridGNet lungs are used as they are
    right, left = geometry_lungs(hyb_r, hyb_l)
    assert np.array_equal(right, hyb_r) and np.array_equal(left, hyb_l)


def test_geometry_lungs_merges_4_connected_lesion_pieces_like_the_reference() -> None:
    shape = (40, 40)
    r, lft = rect(shape, (10, 29), (5, 14)), rect(shape, (10, 29), (25, 34))
    touching = rect(shape, (27, 33), (8, 11))  # overlaps the right lung on rows 27..29
    corner = rect(shape, (34, 36), (12, 14))  # meets ``touching`` only at a corner (33, 11) / (34, 12)
    lesion = touching | corner
    right, left = geometry_lungs(r, lft, lesion=lesion)
    assert np.array_equal(right, r | touching) and np.array_equal(left, lft)  # the corner piece is its own
    right8, _ = geometry_lungs(r, lft, lesion=lesion, connectivity=8)
    assert np.array_equal(right8, r | touching | corner)
    with pytest.raises(ValueError, match="connectivity"):
        geometry_lungs(r, lft, lesion=lesion, connectivity=6)


def test_geometry_lungs_merges_a_heart_into_both_lungs() -> None:
    shape = (40, 40)
    r, lft = rect(shape, (10, 29), (5, 14)), rect(shape, (10, 29), (25, 34))
    heart = rect(shape, (20, 32), (13, 26))  # overlaps both lungs
    right, left = geometry_lungs(r, lft, lesion=heart)
    assert np.array_equal(right, r | heart)
    assert np.array_equal(left, lft | heart)


def test_geometry_lungs_shape_mismatch_names_both() -> None:
    with pytest.raises(MaskShapeError) as info:
        geometry_lungs(np.zeros((20, 20), bool), np.zeros((20, 20), bool), np.zeros((20, 21), bool))
    assert "(20, 20)" in str(info.value) and "(20, 21)" in str(info.value)


# --- §0 scale rule ---------------------------------------------------------------------------------

def test_scale_rule() -> None:
    assert scale_factor(2048) == 2.0
    assert scale_factor(1024) == 1.0
    assert scale_length(50, 512) == 25.0
    assert scale_area(1000, 512) == 250.0  # s² = 1/4
    assert scale_kernel(32, 512) == 16
    assert scale_kernel(5, 512) == 3  # 2.5 rounds up
    assert scale_kernel(15, 3000) == 44  # 15 * 2.9296875 = 43.95
    assert scale_kernel(1, 256) == 1  # 0.25 -> at least 1
    with pytest.raises(ValueError):
        scale_factor(0)
