"""CheXpercept overlap records and attribute answers (CHEXPERCEPT.md §5.6, §4) and the CTR (ILS.md §9.4)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cxrground.anatomy import (
    CTR_NEGATIVE_MAX,
    LUNG_OVERLAP_MIN,
    PERCEPT_ZONE_NAMES,
    REGION_OVERLAP_MIN,
    SUBREGION_NAMES,
    ComponentOverlap,
    EmptyAnatomyError,
    LungOverlap,
    PerceptGeometry,
    RegionOverlap,
    cardiothoracic_ratio,
    comparison_answer_index,
    comparison_index,
    component_overlap,
    ctr_negative_eligible,
    distribution_answer_index,
    distribution_count,
    geometry_lungs,
    negative_subregions,
    percept_geometry,
    positive_subregions,
    positive_zones,
    severity_answer_index,
    severity_index,
    severity_ratio,
    side_sizes,
    sides_with_overlap,
)
from cxrground.errors import MaskError, MaskShapeError

SHAPE = (40, 100)


def rect(rows: tuple[int, int], cols: tuple[int, int], shape: tuple[int, int] = SHAPE) -> np.ndarray:
    """Bool mask with the inclusive row and column ranges set."""
    m = np.zeros(shape, dtype=bool)
    m[rows[0] : rows[1] + 1, cols[0] : cols[1] + 1] = True
    return m


def first_pixels(region: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` pixels of ``region`` in raster order."""
    out = np.zeros_like(region)
    ys, xs = np.nonzero(region)
    out[ys[:n], xs[:n]] = True
    return out


def make_geometry(
    zones: dict[str, np.ndarray] | None = None, subregions: dict[str, np.ndarray] | None = None
) -> PerceptGeometry:
    """Geometry with two 1000-px lungs (rows 0..9 / 10..19, all columns) and only the named regions set."""
    empty = np.zeros(SHAPE, dtype=bool)
    return PerceptGeometry(
        shape=SHAPE,
        kernel=1,
        core=empty,
        lungs={"right lung": rect((0, 9), (0, 99)), "left lung": rect((10, 19), (0, 99))},
        zones={n: (zones or {}).get(n, empty) for n in PERCEPT_ZONE_NAMES},
        halves={},
        peripheral={},
        cpa={},
        subregions={n: (subregions or {}).get(n, empty) for n in SUBREGION_NAMES},
    )


# --- records ---------------------------------------------------------------------------------------

def test_lung_ratio_threshold_is_inclusive_at_one_percent() -> None:
    assert LUNG_OVERLAP_MIN == 0.01
    g = make_geometry()
    rec = component_overlap(rect((0, 0), (0, 9)), g)  # 10 of 1000 right-lung pixels
    assert rec.lung("right") == LungOverlap(ratio=0.01, has_overlap=True, size=10)
    assert rec.lung("left") == LungOverlap(ratio=0.0, has_overlap=False, size=0)
    rec = component_overlap(rect((0, 0), (0, 8)), g)  # 9 px: 0.009
    assert rec.lung("right") == LungOverlap(ratio=0.009, has_overlap=False, size=0)


def test_size_counts_only_the_part_inside_the_lung() -> None:
    g = make_geometry()
    # rows 18..25: 2 rows x 50 = 100 px in the left lung, the rest outside both lungs
    rec = component_overlap(rect((18, 25), (0, 49)), g)
    assert rec.lung("left") == LungOverlap(ratio=0.1, has_overlap=True, size=100)


def test_zone_threshold_is_inclusive_at_one_fifth_and_blocks_promotion() -> None:
    assert REGION_OVERLAP_MIN == 0.2
    upper = rect((0, 4), (0, 9))  # 50 px
    mid = rect((0, 4), (10, 19))  # 50 px
    g = make_geometry(zones={"right upper zone lung": upper, "right mid zone lung": mid})
    comp = first_pixels(upper, 10) | first_pixels(mid, 9)  # 10/50 = 0.2 and 9/50 = 0.18
    rec = component_overlap(comp, g)
    assert rec.zones["right upper zone lung"] == RegionOverlap(0.2, True)
    # a passing entry exists, so the 0.18 zone is not promoted
    assert rec.zones["right mid zone lung"] == RegionOverlap(0.18, False)


def test_best_region_promotion() -> None:
    upper = rect((0, 4), (0, 9))
    mid = rect((0, 4), (10, 19))
    g = make_geometry(zones={"right upper zone lung": upper, "right mid zone lung": mid})
    comp = first_pixels(upper, 5) | first_pixels(mid, 9)  # 0.1 and 0.18: none passes
    rec = component_overlap(comp, g)
    assert rec.zones["right upper zone lung"] == RegionOverlap(0.1, False)
    assert rec.zones["right mid zone lung"] == RegionOverlap(0.18, True)
    assert sum(r.has_overlap for r in rec.zones.values()) == 1
    # equal best ratios: the first in canonical order (right upper before right mid) is promoted
    rec = component_overlap(first_pixels(upper, 5) | first_pixels(mid, 5), g)
    assert rec.zones["right upper zone lung"].has_overlap
    assert not rec.zones["right mid zone lung"].has_overlap


def test_no_promotion_when_all_ratios_are_zero() -> None:
    g = make_geometry(zones={"right upper zone lung": rect((0, 4), (0, 9))})
    rec = component_overlap(rect((30, 35), (0, 5)), g)  # outside every region
    assert not any(r.has_overlap for r in rec.zones.values())
    assert rec.lung_regions is not None
    assert not any(r.has_overlap for r in rec.lung_regions.values())


def test_subregion_group_is_promoted_independently_of_zones() -> None:
    zone = rect((0, 4), (0, 9))  # 50 px
    sub_a = rect((0, 1), (0, 9))  # 20 px
    sub_b = rect((2, 4), (0, 9))  # 30 px
    g = make_geometry(
        zones={"right upper zone lung": zone},
        subregions={
            "right lateral lung & right upper zone lung": sub_a,
            "right peripheral lung & right upper zone lung": sub_b,
        },
    )
    comp = rect((0, 0), (0, 2)) | rect((2, 2), (0, 4))  # 3 px of a (0.15), 5 px of b (1/6)
    rec = component_overlap(comp, g)
    assert rec.zones["right upper zone lung"] == RegionOverlap(8 / 50, True)  # promoted
    assert rec.lung_regions is not None
    assert rec.lung_regions["right lateral lung & right upper zone lung"] == RegionOverlap(0.15, False)
    assert rec.lung_regions["right peripheral lung & right upper zone lung"] == RegionOverlap(5 / 30, True)


def test_cardiomegaly_records_omit_lung_regions() -> None:
    g = make_geometry(zones={"left mid zone lung": rect((10, 19), (0, 99))})
    rec = component_overlap(rect((10, 19), (40, 59)), g, cardiomegaly=True)
    assert rec.lung_regions is None
    assert rec.zones["left mid zone lung"] == RegionOverlap(0.2, True)
    d = rec.to_dict()
    assert "lung_regions" not in d
    assert positive_subregions([rec]) == []


def test_record_json_round_trip() -> None:
    g = make_geometry(zones={"right upper zone lung": rect((0, 4), (0, 9))})
    rec = component_overlap(rect((0, 4), (0, 9)), g)
    d = json.loads(json.dumps(rec.to_dict()))
    assert set(d) == {"right lung", "left lung", "zones", "lung_regions"}
    assert d["right lung"] == {"overlap_ratio": 0.05, "has_overlap": True, "size": 50}  # the reference's key
    assert d["zones"]["right upper zone lung"] == {"overlap_ratio": 1.0, "has_overlap": True}
    assert list(d["zones"]) == list(PERCEPT_ZONE_NAMES)
    assert list(d["lung_regions"]) == list(SUBREGION_NAMES)
    assert ComponentOverlap.from_dict(d) == rec
    older = json.loads(json.dumps(d).replace('"overlap_ratio"', '"ratio"'))  # a plan unit cached by an older build
    assert ComponentOverlap.from_dict(older) == rec


def test_component_shape_mismatch() -> None:
    with pytest.raises(MaskShapeError) as info:
        component_overlap(np.zeros((40, 99), dtype=bool), make_geometry())
    assert "(40, 99)" in str(info.value) and "(40, 100)" in str(info.value)


def test_real_geometry_overlap_on_rectangle_lungs() -> None:
    # right lung rows 20..79 cols 10..39 (1800 px): h = 60, b1 = 40, b2 = 60; mid_x = 24
    shape = (100, 100)
    right, left = rect((20, 79), (10, 39), shape), rect((20, 79), (60, 89), shape)
    g = percept_geometry(right, left)
    # the medial upper sub-region (rows 20..40, cols 24..39 = 336 px) fully covered
    comp = rect((20, 40), (24, 39), shape)
    rec = component_overlap(comp, g)
    assert rec.lung("right") == LungOverlap(336 / 1800, True, 336)
    assert rec.zones["right upper zone lung"].ratio == 336 / 630  # upper zone = 21 rows x 30
    assert rec.lung_regions is not None
    assert rec.lung_regions["right medial lung & right upper zone lung"] == RegionOverlap(1.0, True)
    assert positive_subregions([rec]) == ["right medial lung & right upper zone lung"]
    assert positive_zones([rec]) == ["right upper zone lung"]


# --- attribute answers -----------------------------------------------------------------------------

def record(
    right: tuple[float, bool, int] = (0.0, False, 0),
    left: tuple[float, bool, int] = (0.0, False, 0),
    positive: tuple[str, ...] = (),
    cardiomegaly: bool = False,
) -> ComponentOverlap:
    """Hand-made record: lung entries and the listed positive sub-regions (ratio 0.5)."""
    regions = None
    if not cardiomegaly:
        regions = {n: RegionOverlap(0.5 if n in positive else 0.0, n in positive) for n in SUBREGION_NAMES}
    return ComponentOverlap(
        lungs={"right lung": LungOverlap(*right), "left lung": LungOverlap(*left)},
        zones={n: RegionOverlap(0.0, False) for n in PERCEPT_ZONE_NAMES},
        lung_regions=regions,
    )


def test_positive_regions_zones_and_distribution() -> None:
    r1 = record(positive=("right lateral lung & right upper zone lung",))
    r2 = record(
        positive=(
            "left costophrenic angle",
            "right peripheral lung & right upper zone lung",
            "left medial lung & left lung base",
        )
    )
    assert positive_subregions([r1, r2]) == [
        "right lateral lung & right upper zone lung",
        "right peripheral lung & right upper zone lung",
        "left medial lung & left lung base",
        "left costophrenic angle",
    ]
    assert len(negative_subregions([r1, r2])) == 16
    # two right-upper regions -> one zone; CPA and left medial base -> left lung base
    assert positive_zones([r1, r2]) == ["right upper zone lung", "left lung base"]
    assert distribution_count([r1, r2]) == 2
    r3 = record(positive=("right costophrenic angle", "left lateral lung & left mid zone lung"))
    assert distribution_count([r1, r2, r3]) == 4
    assert distribution_count([]) == 0


def test_distribution_answer_index() -> None:
    assert [distribution_answer_index(n) for n in range(7)] == [4, 1, 2, 3, 4, 4, 4]


def test_severity_ratio_sums_overlapping_components_only() -> None:
    r1 = record(right=(0.25, True, 250))
    r2 = record(right=(0.005, False, 0), left=(0.3, True, 300))
    r3 = record(right=(0.1, True, 100))
    assert severity_ratio([r1, r2, r3], "right") == pytest.approx(0.35)
    assert severity_ratio([r1, r2, r3], "left") == 0.3
    assert severity_answer_index([r1, r2, r3], "right") == 2
    assert severity_answer_index([r1, r2], "right") == 1
    assert sides_with_overlap([r1, r2]) == ["right", "left"]
    assert sides_with_overlap([r1]) == ["right"]
    with pytest.raises(ValueError):
        severity_ratio([r1], "middle")


def test_severity_thresholds_at_one_third_and_two_thirds() -> None:
    assert severity_index(0.0) == 1
    assert severity_index(0.3333) == 1
    assert severity_index(1 / 3) == 2  # exactly 1/3 is not below 1/3
    assert severity_index(100 / 300) == 2
    assert severity_index(0.6666) == 2
    assert severity_index(2 / 3) == 3
    assert severity_index(200 / 300) == 3
    assert severity_index(1.0) == 3


def test_severity_from_a_real_component() -> None:
    # a 300-px right lung with a 100-px component: ratio 1/3 -> option 2
    g = make_geometry()
    g2 = PerceptGeometry(
        shape=g.shape, kernel=1, core=g.core,
        lungs={"right lung": rect((0, 2), (0, 99)), "left lung": g.lungs["left lung"]},
        zones=g.zones, halves={}, peripheral={}, cpa={}, subregions=g.subregions,
    )
    rec = component_overlap(rect((0, 0), (0, 99)), g2)
    assert rec.lung("right").ratio == 1 / 3
    assert severity_answer_index([rec], "right") == 2


def test_comparison_index_boundaries() -> None:
    assert comparison_index(150, 100) == 2  # left = 1.5 x right
    assert comparison_index(149, 100) == 1  # 1.49 < 1.5
    assert comparison_index(100, 150) == 3
    assert comparison_index(100, 149) == 1
    assert comparison_index(100, 100) == 1
    assert comparison_index(100, 0) == 4
    assert comparison_index(0, 100) == 4
    assert comparison_index(0, 0) == 4


def test_comparison_over_records() -> None:
    both = [record(right=(0.1, True, 100)), record(left=(0.2, True, 150))]
    assert side_sizes(both) == {"right lung": 100, "left lung": 150}
    assert comparison_answer_index(both) == 2
    similar = [record(right=(0.1, True, 100), left=(0.1, True, 120))]
    assert comparison_answer_index(similar) == 1
    right_larger = [record(right=(0.3, True, 300)), record(right=(0.01, True, 10), left=(0.2, True, 200))]
    assert comparison_answer_index(right_larger) == 3  # 310 >= 1.5 * 200
    one_side = [record(right=(0.3, True, 300), left=(0.005, False, 0))]
    assert comparison_answer_index(one_side) == 4
    assert comparison_answer_index([]) == 4


# --- geometry lungs feed the overlap ---------------------------------------------------------------

def test_lesion_touching_a_lung_counts_as_lung_for_ratios() -> None:
    shape = (40, 40)
    hyb_r, hyb_l = rect((10, 29), (5, 14), shape), rect((10, 29), (25, 34), shape)
    lesion = rect((25, 34), (8, 11), shape)  # 20 px inside, 20 px below the right lung
    right, left = geometry_lungs(hyb_r, hyb_l, lesion=lesion)
    assert int(right.sum()) == 200 + 20
    g = percept_geometry(right, left)
    rec = component_overlap(lesion, g)
    assert rec.lung("right") == LungOverlap(40 / 220, True, 40)


# --- cardiothoracic ratio --------------------------------------------------------------------------

def test_ctr_on_hand_built_masks() -> None:
    shape = (60, 100)
    right, left = rect((10, 50), (10, 39), shape), rect((10, 50), (60, 89), shape)  # lungs span x 10..89
    heart = rect((30, 55), (40, 59), shape)  # 20 px wide
    assert cardiothoracic_ratio(heart, right, left) == 20 / 80
    wide = rect((30, 55), (30, 65), shape)  # 36 px: 0.45
    ctr = cardiothoracic_ratio(wide, right, left)
    assert ctr == 0.45 and ctr_negative_eligible(ctr)
    wider = rect((30, 55), (30, 66), shape)  # 37 px: 0.4625
    assert not ctr_negative_eligible(cardiothoracic_ratio(wider, right, left))
    assert CTR_NEGATIVE_MAX == 0.45
    # one lung only: extent of that lung (30 px)
    assert cardiothoracic_ratio(heart, right, np.zeros(shape, dtype=bool)) == 20 / 30


def test_ctr_errors() -> None:
    shape = (60, 100)
    right, left = rect((10, 50), (10, 39), shape), rect((10, 50), (60, 89), shape)
    empty = np.zeros(shape, dtype=bool)
    with pytest.raises(EmptyAnatomyError, match="heart"):
        cardiothoracic_ratio(empty, right, left)
    with pytest.raises(MaskError, match="lung"):
        cardiothoracic_ratio(rect((30, 55), (40, 59), shape), empty, empty)
    with pytest.raises(MaskShapeError) as info:
        cardiothoracic_ratio(np.zeros((60, 99), dtype=bool), right, left)
    assert "(60, 99)" in str(info.value) and "(60, 100)" in str(info.value)
