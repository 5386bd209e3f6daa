"""Stage-4 attribute QAs (CHEXPERCEPT.md §3.5, §4, §5.6, §9.4) on hand-built lungs, lesions and records."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.anatomy.overlap import ComponentOverlap, LungOverlap, RegionOverlap, component_overlap
from cxrground.anatomy.percept_regions import PERCEPT_ZONE_NAMES, SUBREGION_NAMES, percept_geometry
from cxrground.percept.attributes import attribute_qas, draw_location, negative_coverage, severity_side
from cxrground.percept.schema import SEVERITY_KEY
from cxrground.vocab.percept_templates import (
    COMPARISON,
    COMPARISON_OPTIONS,
    DISTRIBUTION,
    DISTRIBUTION_OPTIONS,
    LOCATION,
    LOCATION_NONE_OPTION,
    SEVERITY,
    format_question,
    severity_options,
    subregion_text,
)

H, W = 90, 100


def lungs() -> tuple[np.ndarray, np.ndarray]:
    """Right lung (image left) cols 10-39, left lung cols 60-89, both rows 0-89: 2,700 px each.

    Zones (§5.2): y0 = 0, h = 90, b1 = 30, b2 = 60 → upper rows 0-30 (31 rows), mid 31-60, base 61-89.
    """
    right = np.zeros((H, W), bool)
    left = np.zeros((H, W), bool)
    right[:, 10:40] = True
    left[:, 60:90] = True
    return right, left


def record(lesion: np.ndarray) -> ComponentOverlap:
    right, left = lungs()
    return component_overlap(lesion, percept_geometry(right, left))


def test_one_zone_and_severity_two_from_masks() -> None:
    right, _ = lungs()
    lesion = right.copy()
    lesion[31:] = False  # exactly the right upper zone: 31×30 = 930 px of 2,700 → ratio 0.344 ≥ 1/3
    res = attribute_qas([record(lesion)], "opacity", np.random.default_rng(0))
    assert res is not None
    dist = res.qa["distribution"]
    assert dist["answer_zones"] == ["right upper zone lung"]
    assert dist["answer_index"] == 1 and dist["answer"] == "1 zone"
    assert dist["question"] == format_question(DISTRIBUTION.format(lesion="opacity"), DISTRIBUTION_OPTIONS)
    sev = res.qa[SEVERITY_KEY]
    assert sev["selected_lung"] == "right lung"  # the only overlapping side
    assert sev["overlap_ratio"] == pytest.approx(930 / 2700)
    assert sev["answer_index"] == 2
    assert sev["question"] == format_question(SEVERITY.format(lung="right lung", lesion="opacity"),
                                              severity_options("right lung"))
    comp = res.qa["comparison"]
    assert comp["answer_index"] == 4 and comp["right_size"] == 930 and comp["left_size"] == 0
    assert comp["right_has_overlap"] and not comp["left_has_overlap"]
    assert comp["question"] == format_question(COMPARISON, COMPARISON_OPTIONS)


def test_four_zones_give_option_four_and_right_larger() -> None:
    right, left = lungs()
    lesion = right.copy()
    lesion[:31] |= left[:31]  # whole right lung (3 zones) + left upper zone = 4 zones
    res = attribute_qas([record(lesion)], "edema", np.random.default_rng(1))
    assert res is not None
    # the question texts, as the reference stores them (the right lung base reads "right lower zone lung")
    assert res.qa["distribution"]["answer_zones"] == ["right upper zone lung", "right mid zone lung",
                                                      "right lower zone lung", "left upper zone lung"]
    assert res.qa["distribution"]["answer_index"] == 4
    assert res.qa["distribution"]["answer"] == "4 zones or more"
    comp = res.qa["comparison"]
    # right 2,700 px ≥ 1.5 × left 930 px → option 3
    assert (comp["right_size"], comp["left_size"], comp["answer_index"]) == (2700, 930, 3)


@pytest.mark.parametrize(("left_px", "expected"), [(26, 4), (27, 3)])
def test_side_threshold_one_percent(left_px: int, expected: int) -> None:
    right, left = lungs()
    lesion = right.copy()
    lesion[31:] = False
    # 27 px of 2,700 = 0.01 exactly (counts); 26 px = 0.0096 (does not) → one side only → 4
    ys, xs = np.nonzero(left)
    lesion[ys[:left_px], xs[:left_px]] = True
    res = attribute_qas([record(lesion)], "opacity", np.random.default_rng(0))
    assert res is not None
    assert res.qa["comparison"]["answer_index"] == expected
    assert res.qa["comparison"]["left_has_overlap"] is (expected == 3)


def rec(right_ratio: float = 0.0, left_ratio: float = 0.0, right_size: int = 0, left_size: int = 0,
        regions: dict[str, float] | None = None) -> ComponentOverlap:
    """A record built by hand: ratios ≥ 0.01 on a lung and ≥ 0.2 on a region count as overlapping."""
    regions = regions or {}
    return ComponentOverlap(
        lungs={"right lung": LungOverlap(right_ratio, right_ratio >= 0.01, right_size if right_ratio >= 0.01 else 0),
               "left lung": LungOverlap(left_ratio, left_ratio >= 0.01, left_size if left_ratio >= 0.01 else 0)},
        zones={z: RegionOverlap(0.0, False) for z in PERCEPT_ZONE_NAMES},
        lung_regions={n: RegionOverlap(regions.get(n, 0.0), regions.get(n, 0.0) >= 0.2) for n in SUBREGION_NAMES})


@pytest.mark.parametrize(("left", "right", "expected"), [
    (150, 100, 2),   # left = 1.5 × right → left larger
    (149, 100, 1),   # max/min = 1.49 < 1.5 → similar
    (100, 150, 3),   # right = 1.5 × left → right larger
    (100, 100, 1),
])
def test_comparison_one_and_a_half_rule(left: int, right: int, expected: int) -> None:
    res = attribute_qas([rec(0.1, 0.1, right, left)], "effusion", np.random.default_rng(0))
    assert res is not None and res.qa["comparison"]["answer_index"] == expected
    assert res.qa["comparison"]["answer"] == COMPARISON_OPTIONS[expected - 1]


@pytest.mark.parametrize(("ratio", "expected"), [(0.33, 1), (1 / 3, 2), (0.66, 2), (2 / 3, 3), (0.9, 3)])
def test_severity_thresholds(ratio: float, expected: int) -> None:
    res = attribute_qas([rec(left_ratio=ratio, left_size=10)], "opacity", np.random.default_rng(0))
    assert res is not None
    assert res.qa[SEVERITY_KEY]["selected_lung"] == "left lung"
    assert res.qa[SEVERITY_KEY]["answer_index"] == expected


def test_severity_sums_components_with_overlap() -> None:
    # two components on the left: 0.2 + 0.15 = 0.35 → option 2; a 0.005 right part does not overlap
    recs = [rec(left_ratio=0.2, left_size=5), rec(right_ratio=0.005, left_ratio=0.15, left_size=5)]
    res = attribute_qas(recs, "opacity", np.random.default_rng(0))
    assert res is not None
    assert res.qa[SEVERITY_KEY]["overlap_ratio"] == pytest.approx(0.35)
    assert res.qa[SEVERITY_KEY]["answer_index"] == 2


def test_severity_side_choice() -> None:
    both = [rec(0.1, 0.2, 5, 5)]
    rng = np.random.default_rng(0)
    # location answers on one side that overlaps → that side
    assert severity_side(both, ["left lateral lung & left mid zone lung"], rng) == "left"
    assert severity_side(both, ["right costophrenic angle"], rng) == "right"
    # answers naming both sides or none → random among the overlapping sides: both occur over seeds
    seen = {severity_side(both, [], np.random.default_rng(s)) for s in range(20)}
    assert seen == {"right", "left"}
    mixed = ["right costophrenic angle", "left costophrenic angle"]
    assert {severity_side(both, mixed, np.random.default_rng(s)) for s in range(20)} == {"right", "left"}
    # a named side that does not overlap → the overlapping one
    only_right = [rec(right_ratio=0.1, right_size=5)]
    assert severity_side(only_right, ["left costophrenic angle"], rng) == "right"
    # no side overlaps → left lung, ratio 0
    res = attribute_qas([rec()], "opacity", np.random.default_rng(0))
    assert res is not None and res.qa[SEVERITY_KEY]["selected_lung"] == "left lung"
    assert res.qa[SEVERITY_KEY]["overlap_ratio"] == 0.0 and res.qa[SEVERITY_KEY]["answer_index"] == 1


def test_location_without_positives_is_none_of_the_above() -> None:
    names, answer, _ = draw_location([rec()], np.random.default_rng(3))
    assert len(names) == 3 and answer == [4]
    res = attribute_qas([rec()], "opacity", np.random.default_rng(3))
    assert res is not None
    loc = res.qa["location"]
    assert loc["answer_options"][-1] == LOCATION_NONE_OPTION and loc["answer"] == LOCATION_NONE_OPTION
    assert loc["question"] == format_question(LOCATION.format(lesion="opacity"), loc["answer_options"])


def test_location_all_positive_tops_up_with_positives() -> None:
    everything = rec(0.5, 0.5, 10, 10, dict.fromkeys(SUBREGION_NAMES, 0.9))
    for seed in range(5):
        names, answer, cover = draw_location([everything], np.random.default_rng(seed))
        assert answer == [1, 2, 3] and len(set(names)) == 3 and cover == 0.0


def test_location_one_positive_with_fixed_rng() -> None:
    target = "left lateral lung & left lung base"
    one = rec(0.0, 0.3, 0, 10, {target: 0.6})
    outcomes = set()
    for seed in range(30):
        names, answer, _ = draw_location([one], np.random.default_rng(seed))
        # k ∈ {0, 1}: either the positive is an option (its index is the answer) or the answer is [4]
        if target in names:
            assert answer == [names.index(target) + 1]
            outcomes.add("shown")
        else:
            assert answer == [4]
            outcomes.add("none")
    assert outcomes == {"shown", "none"}
    res = attribute_qas([one], "opacity", np.random.default_rng(0))
    assert res is not None
    loc = res.qa["location"]
    texts = {subregion_text(n): n for n in SUBREGION_NAMES}
    assert all(t in texts for t in loc["answer_options"][:3])
    assert loc["answer_zones"] == [loc["answer_options"][i - 1] for i in loc["answer_index"] if i < 4]
    assert loc["answer"] == ", ".join(loc["answer_options"][i - 1] for i in loc["answer_index"])


def test_location_is_deterministic_for_a_seed() -> None:
    recs = [rec(0.3, 0.3, 10, 10, {SUBREGION_NAMES[0]: 0.5, SUBREGION_NAMES[12]: 0.7})]
    a = attribute_qas(recs, "opacity", np.random.default_rng(11))
    b = attribute_qas(recs, "opacity", np.random.default_rng(11))
    assert a is not None and b is not None and a.qa == b.qa


def test_negative_coverage_and_strict_switch() -> None:
    partial = "right lateral lung & right mid zone lung"
    # 0.1 < 0.2 → still a negative, but it holds lesion; strict mode (≤ 0.05) never offers it
    recs = [rec(0.2, 0.0, 10, 0, {"right medial lung & right upper zone lung": 0.8, partial: 0.06}),
            rec(0.1, 0.0, 5, 0, {partial: 0.04})]
    assert negative_coverage(recs, partial) == pytest.approx(0.1)
    loose = [draw_location(recs, np.random.default_rng(s)) for s in range(60)]
    strict = [draw_location(recs, np.random.default_rng(s), strict_negatives=True) for s in range(60)]
    assert any(partial in names for names, _, _ in loose)
    assert max(c for _, _, c in loose) == pytest.approx(0.1)
    assert not any(partial in names for names, _, _ in strict)
    assert max(c for _, _, c in strict) <= 0.05


def test_cardiomegaly_has_no_attributes() -> None:
    assert attribute_qas([rec(0.3, 0.3, 5, 5)], "cardiomegaly", np.random.default_rng(0)) is None


def test_severity_is_written_under_the_spec_key_and_read_under_both():
    """CHEXPERCEPT.md §12 names the key ``severity/measurement``; benchmarks with ``severity`` still load."""
    from cxrground.percept.schema import AttributeQA

    lesion, _ = lungs()
    lesion = lesion.copy()
    lesion[31:] = False
    res = attribute_qas([record(lesion)], "opacity", np.random.default_rng(0))
    assert list(res.qa) == ["distribution", "location", "severity/measurement", "comparison"]
    written = AttributeQA.model_validate(res.qa)
    assert written.severity.answer_index == res.qa["severity/measurement"]["answer_index"]
    assert list(written.model_dump(by_alias=True)) == ["distribution", "location", "severity/measurement",
                                                       "comparison"]
    old = {("severity" if k == "severity/measurement" else k): v for k, v in res.qa.items()}
    assert AttributeQA.model_validate(old).severity == written.severity
