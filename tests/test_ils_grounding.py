"""ILS §9: Algorithm 1 condition by condition, component selection, refinement and the lesion rules."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cxrground.anatomy import ils_location_masks
from cxrground.errors import MaskShapeError
from cxrground.ils.config import IlsConfig, RefineConfig, Thresholds
from cxrground.ils.grounding import (
    CONDITIONS,
    algorithm1,
    box_iou,
    components_touching,
    effusion_base_completion,
    ground_finding,
    grow_region,
    refine_mask,
    refine_noise,
    remove_small_components,
)
from cxrground.ils.spatial.base import Box
from cxrground.reports.findings import Finding
from masks_helpers import rect

SHAPE = (100, 100)
RIGHT = rect(SHAPE, (10, 89), (5, 45))  # image left
LEFT = rect(SHAPE, (10, 89), (55, 95))
NO_OPENING = RefineConfig(opening_kernel=1)


def _finding(lesion: str | None, labels: tuple[str, ...], assertion: str = "present") -> Finding:
    return Finding(entity=lesion or "nodule", sent_idx=1, assertion=assertion, lesion=lesion,
                   reported_location=labels)


def _base_case():
    """A 21×31 anomaly block in the right lung base and a box exactly around it."""
    a = rect(SHAPE, (60, 80), (10, 40))
    box = Box(10, 60, 40, 80, 0.5)
    m_union = ils_location_masks(RIGHT, LEFT)["right lung base"]
    return a, box, m_union


def _measured(a, box, m_union):
    res = algorithm1(a, m_union, RIGHT, LEFT, [box], Thresholds(0, 0, 0, 0, 0), refine_config=NO_OPENING)
    c = res.checks[0]
    return c.iou_anatomy, c.confidence, c.signal, max(box_iou(box, RIGHT), box_iou(box, LEFT))


# --- Algorithm 1 ---------------------------------------------------------------------------------------

def test_algorithm1_all_conditions_pass_at_their_exact_values():
    a, box, m_union = _base_case()
    anat, conf, signal, size = _measured(a, box, m_union)
    assert anat == pytest.approx(558 / 1200) and signal == 1.0 and size == pytest.approx(651 / 3280)
    tau = Thresholds(tau_ano=0.1, tau_anatomy=anat, tau_conf=conf, tau_signal=signal, tau_size=size)
    res = algorithm1(a, m_union, RIGHT, LEFT, [box], tau, refine_config=NO_OPENING)
    check = res.checks[0]
    assert (check.c1, check.c2, check.c3, check.c4) == (True, True, True, True)  # ≥, so equality passes
    assert check.passed and check.selected and check.failed == ()
    assert res.selected == (box,)
    assert np.array_equal(res.mask, a)


@pytest.mark.parametrize("which", range(4))
def test_algorithm1_each_condition_failing_in_turn(which):
    a, box, m_union = _base_case()
    values = list(_measured(a, box, m_union))
    values[which] = np.nextafter(values[which], 2.0)  # just above what the box achieves
    tau = Thresholds(0.1, *values)
    res = algorithm1(a, m_union, RIGHT, LEFT, [box], tau, refine_config=NO_OPENING)
    check = res.checks[0]
    flags = [check.c1, check.c2, check.c3, check.c4]
    assert flags == [i != which for i in range(4)]
    assert check.failed == (CONDITIONS[which],)
    assert not res.mask.any() and res.selected == ()
    assert res.failure_counts() == {CONDITIONS[which]: 1}


def test_algorithm1_c4_accepts_either_lung():
    a = rect(SHAPE, (20, 89), (55, 95))
    box = Box(55, 20, 95, 89, 1.0)
    res = algorithm1(a, LEFT, RIGHT, LEFT, [box], Thresholds(0.1, 0.25, 0.2, 0.2, 0.5))
    assert box_iou(box, RIGHT) == 0 and res.checks[0].c4


def test_algorithm1_takes_whole_components_touching_the_box():
    a = rect(SHAPE, (60, 80), (10, 40)) | rect(SHAPE, (15, 25), (60, 70))
    box = Box(30, 70, 44, 85, 1.0)  # overlaps only a corner of the first block
    tau = Thresholds(0.1, 0.0, 0.0, 0.0, 0.0)
    touched = algorithm1(a, RIGHT, RIGHT, LEFT, [box], tau, refine_config=NO_OPENING).mask
    assert np.array_equal(touched, rect(SHAPE, (60, 80), (10, 40)))  # not clipped to the box
    opened = algorithm1(a, RIGHT, RIGHT, LEFT, [box], tau).mask  # default: A is opened first (5×5 ellipse)
    assert np.array_equal(opened, refine_noise(rect(SHAPE, (60, 80), (10, 40)), 5, 1))
    assert np.array_equal(components_touching(a, box.mask(SHAPE)), touched)


def test_algorithm1_box_without_components_is_not_selected():
    a = rect(SHAPE, (60, 80), (10, 40))
    box = Box(55, 20, 90, 40, 1.0)  # passes every zero threshold but contains no anomaly
    res = algorithm1(a, LEFT, RIGHT, LEFT, [box], Thresholds(0.1, 0.0, 0.0, 0.0, 0.0))
    assert res.checks[0].passed and res.checks[0].failed == ("no_component",) and res.selected == ()


def test_eight_connectivity_joins_diagonal_neighbours():
    a = rect(SHAPE, (20, 29), (10, 19)) | rect(SHAPE, (30, 39), (20, 29))  # touch at one corner
    box = Box(10, 20, 12, 22, 1.0)
    tau = Thresholds(0.1, 0.0, 0.0, 0.0, 0.0)
    eight = algorithm1(a, RIGHT, RIGHT, LEFT, [box], tau, refine_config=NO_OPENING).mask
    four = algorithm1(a, RIGHT, RIGHT, LEFT, [box], tau, refine_config=replace(NO_OPENING, connectivity=4)).mask
    assert int(eight.sum()) == 200 and int(four.sum()) == 100
    assert RefineConfig().connectivity == 8


def test_refine_noise_removes_specks_and_keeps_blocks():
    a = rect(SHAPE, (20, 40), (20, 40))
    a[60, 60] = True
    out = refine_noise(a, 5, 1)
    assert not out[60, 60] and out[30, 30]
    assert np.array_equal(refine_noise(a, 1, 1), a)


def test_min_size_removal():
    m = rect(SHAPE, (10, 11), (10, 11)) | rect(SHAPE, (50, 59), (50, 59))  # 4 and 100 pixels
    assert np.array_equal(remove_small_components(m, 5), rect(SHAPE, (50, 59), (50, 59)))
    assert np.array_equal(remove_small_components(m, 4), m)
    cfg = RefineConfig(opening_kernel=1, growth_passes=0, min_component_fraction=0.0005)  # 5 px at 100×100
    img = np.zeros(SHAPE, np.uint8)
    assert np.array_equal(refine_mask(m, img, np.ones(SHAPE, bool), None, cfg), rect(SHAPE, (50, 59), (50, 59)))


def test_region_growth_follows_similar_intensity_inside_the_lungs():
    img = np.full(SHAPE, 50, np.uint8)
    img[:, 30:] = 150
    img[:, 35:] = 160  # within tolerance of 150
    seed = rect(SHAPE, (40, 60), (30, 33))
    lungs = rect(SHAPE, (0, 99), (0, 36))
    grown = grow_region(seed, img, lungs, tolerance=12.75, passes=2)
    assert grown[50, 35] and not grown[50, 29]  # similar neighbours join, the dark side does not
    assert not grown[:, 37:].any()  # never outside the allowed region
    assert not grown[50, 36] or grown[50, 35]
    once = grow_region(seed, img, lungs, tolerance=12.75, passes=1)
    assert once[50, 34] and not once[50, 35]  # one pass = one pixel


def test_refine_clips_to_the_lungs():
    comp = rect(SHAPE, (40, 60), (35, 60))  # spans the mediastinum between the lungs
    img = np.full(SHAPE, 100, np.uint8)
    out = refine_mask(comp, img, RIGHT | LEFT, RIGHT | LEFT, RefineConfig())
    assert out.any() and not (out & ~(RIGHT | LEFT)).any()


# --- effusion -----------------------------------------------------------------------------------------------

def test_effusion_base_completion_geometry():
    # right lung rows 10..89 (h = 79): base band y >= 89 - 0.25*79 = 69.25, i.e. rows 70..89
    fluid = rect(SHAPE, (75, 80), (30, 40))
    out, sides = effusion_base_completion(fluid, RIGHT, LEFT)
    assert sides == ("right",)
    assert np.array_equal(out, RIGHT & (np.arange(100)[:, None] >= 75))
    assert not (out & LEFT).any()
    # a component above the band: top row within the band decides
    tall = rect(SHAPE, (60, 80), (30, 40))
    out, _ = effusion_base_completion(tall, RIGHT, LEFT)
    assert np.array_equal(out, tall | (RIGHT & (np.arange(100)[:, None] >= 70)))


def test_effusion_completion_sides_and_clipping():
    fluid = rect(SHAPE, (75, 80), (30, 40)) | rect(SHAPE, (80, 85), (60, 70))
    out, sides = effusion_base_completion(fluid, RIGHT, LEFT, sides=("left",))
    assert sides == ("left",) and not (out & RIGHT).any()
    high = rect(SHAPE, (20, 30), (60, 70))  # not at a base
    out, sides = effusion_base_completion(high, RIGHT, LEFT)
    assert sides == () and not out.any()
    out, _ = effusion_base_completion(high | fluid, RIGHT, LEFT, clip=False)
    assert out[25, 65]  # without clipping the high component stays
    out, _ = effusion_base_completion(high | fluid, RIGHT, LEFT, clip=True)
    assert not out[25, 65]


# --- one finding ------------------------------------------------------------------------------------------

def _scene(anomaly_value: float = 0.3):
    img = np.full(SHAPE, 60, np.uint8)
    anomaly = np.zeros(SHAPE, np.float32)
    block = rect(SHAPE, (55, 85), (8, 42))
    anomaly[block] = anomaly_value
    img[block] = 140
    locations = ils_location_masks(RIGHT, LEFT)
    heart = rect(SHAPE, (40, 89), (46, 54))
    return img, anomaly, locations, heart, block, Box(8, 55, 42, 85, 0.9)


def test_ground_finding_lung_lesion_and_thresholds_by_lesion():
    img, anomaly, locations, heart, block, box = _scene()
    r = ground_finding(_finding("pneumonia", ("right lung base",)), img, anomaly, locations, RIGHT, LEFT, heart,
                       [box], IlsConfig())
    assert r.status == "grounded" and r.method == "algorithm1" and r.reason is None and r.grounded
    assert r.selected == (box,) and r.thresholds == IlsConfig().general
    assert np.array_equal(r.mask, block)
    assert r.to_dict()["area"] == int(block.sum())
    # a faint anomaly: only edema's τ_ano = 0.01 sees it
    img, anomaly, locations, heart, block, box = _scene(0.05)
    faint = Box(8, 55, 42, 85, 0.05)
    r = ground_finding(_finding("pneumonia", ("right lung base",)), img, anomaly, locations, RIGHT, LEFT, heart,
                       [faint])
    assert r.status == "empty" and r.reason == "no_box_passed"
    assert set(r.failure_counts()) == {"confidence", "signal"}
    r = ground_finding(_finding("edema", ("right lung base",)), img, anomaly, locations, RIGHT, LEFT, heart,
                       [faint])
    assert r.grounded and r.thresholds == IlsConfig().edema


def test_ground_finding_reasons_and_shape_checks():
    img, anomaly, locations, heart, _block, box = _scene()
    args = (img, anomaly, locations, RIGHT, LEFT, heart)
    assert ground_finding(_finding(None, ("right lung",)), *args, [box]).status == "skipped"
    assert ground_finding(_finding("pneumonia", ("right lung",), "absent"), *args, [box]).status == "absent"
    assert ground_finding(_finding("pneumonia", ("right lung base",)), *args, []).reason == "no_boxes"
    r = ground_finding(_finding("pneumonia", ("heart",)), *args, [box])
    assert r.reason == "no_location_mask"
    r = ground_finding(_finding("pneumonia", ()), *args, [box])
    assert "both lungs" in r.notes[0]
    with pytest.raises(MaskShapeError):
        ground_finding(_finding("pneumonia", ("right lung base",)), img[:-1], anomaly, locations, RIGHT, LEFT, heart,
                       [box])


def test_ground_finding_box_class_rule():
    img, anomaly, locations, heart, _block, _ = _scene()
    box = Box(8, 55, 42, 85, 0.9, "pleural effusion")
    f = _finding("pneumonia", ("right lung base",))
    args = (img, anomaly, locations, RIGHT, LEFT, heart, [box])
    assert ground_finding(f, *args, IlsConfig()).grounded  # paper: any kept box counts
    r = ground_finding(f, *args, replace(IlsConfig(), box_class_must_match=True))
    assert not r.grounded and r.checks[0].failed == ("class",)


def test_ground_finding_effusion_completes_the_base():
    img, anomaly, locations, heart, _, _ = _scene(0.0)
    fluid = rect(SHAPE, (72, 89), (8, 45))
    anomaly[fluid] = 0.4
    box = Box(8, 72, 45, 89, 0.9)
    r = ground_finding(_finding("effusion", ("right lung",)), img, anomaly, locations, RIGHT, LEFT, heart, [box],
                       replace(IlsConfig(), general=Thresholds(0.1, 0.2, 0.2, 0.2, 0.1)))
    assert r.grounded and r.completed_sides == ("right",)
    assert np.array_equal(r.mask, RIGHT & (np.arange(100)[:, None] >= 72))


def test_cardiomegaly_heart_mask_and_ctr_rule_at_exactly_045():
    right = rect(SHAPE, (10, 89), (0, 39))
    left = rect(SHAPE, (10, 89), (60, 99))  # thorax 100 columns wide
    heart = rect(SHAPE, (50, 89), (30, 74))  # 45 columns → CTR = 0.45
    img = np.zeros(SHAPE, np.uint8)
    anomaly = np.zeros(SHAPE, np.float32)
    locations = ils_location_masks(right, left)
    r = ground_finding(_finding("cardiomegaly", ("heart",)), img, anomaly, locations, right, left, heart, [])
    assert r.status == "grounded" and r.method == "heart" and np.array_equal(r.mask, heart)
    assert r.ctr == pytest.approx(0.45) and r.negative_eligible is True
    wider = rect(SHAPE, (50, 89), (30, 75))  # 46 columns → 0.46
    r = ground_finding(_finding("cardiomegaly", ("heart",), "absent"), img, anomaly, locations, right, left, wider, [])
    assert r.status == "absent" and r.ctr == pytest.approx(0.46) and r.negative_eligible is False
    r = ground_finding(_finding("cardiomegaly", ("heart",)), img, anomaly, locations, right, left, None, [])
    assert r.status == "empty" and r.reason == "empty_heart" and r.ctr is None
