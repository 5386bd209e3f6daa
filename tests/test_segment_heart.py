"""The heart estimate from lung masks: placement on hand-built lungs, agreement with phantom hearts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cxrground.anatomy import cardiothoracic_ratio
from cxrground.anatomy.ctr import EmptyAnatomyError
from cxrground.anatomy.segment.heart import HeartEstimateParams, estimate_heart, score_heart_estimates
from cxrground.datasets.synthetic import SynthConfig, generate_study
from cxrground.errors import MaskShapeError


def _hand_lungs(h: int = 200, w: int = 240, heart_half: float = 30.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two lung fields from a thorax minus a mediastinum band and an elliptic heart biased to image right."""
    yy, xx = np.mgrid[:h, :w].astype(float)
    thorax = ((xx - 120) / 100) ** 2 + ((yy - 170) / 150) ** 2 <= 1.0
    thorax &= (yy >= 20) & (yy <= 175)
    mediastinum = np.abs(xx - 120) < 10
    heart = (((xx - 128) / heart_half) ** 2 + ((yy - 140) / 40) ** 2 <= 1.0) & (yy <= 180)
    cavity = thorax & ~mediastinum & ~heart
    return cavity & (xx < 120), cavity & (xx > 120), heart


def test_heart_lies_between_the_lungs_in_the_lower_half():
    right, left, true_heart = _hand_lungs()
    heart = estimate_heart(right, left)
    assert heart.any()
    assert not (heart & (right | left)).any()
    ys, xs = np.nonzero(heart)
    r_cols, l_cols = np.nonzero(right)[1], np.nonzero(left)[1]
    assert r_cols.mean() < xs.mean() < l_cols.mean()
    lung_rows = np.nonzero(right | left)[0]
    assert ys.min() > lung_rows.min() + 0.3 * (lung_rows.max() - lung_rows.min())
    assert xs.mean() > 120  # biased to the patient's left (image right), like the true heart
    dice = 2 * (heart & true_heart).sum() / (heart.sum() + true_heart.sum())
    assert dice > 0.75


def test_wider_heart_gives_wider_estimate():
    ctrs = []
    for half in (24.0, 32.0, 40.0):
        right, left, _ = _hand_lungs(heart_half=half)
        ctrs.append(cardiothoracic_ratio(estimate_heart(right, left), right, left))
    assert ctrs[0] < ctrs[1] < ctrs[2]


def test_errors():
    right, left, _ = _hand_lungs()
    with pytest.raises(EmptyAnatomyError):
        estimate_heart(np.zeros_like(right), left)
    with pytest.raises(MaskShapeError):
        estimate_heart(right, left[:, :-1])


def test_estimate_matches_phantom_hearts():
    cfg = SynthConfig(width=256, prevalence={"cardiomegaly": 1.0})
    cases = []
    for i in range(3):
        s = generate_study(5, i, cfg)
        m = s.anatomy_masks
        cases.append((m["right_lung"], m["left_lung"], m["heart"]))
    score = score_heart_estimates(cases)
    assert score.n == 3
    # the phantoms' hearts are ellipses reaching up to the hila; the estimate starts lower, at the cardiac
    # silhouette of real films, so the overlap is high but not complete; the width (CTR) is exact
    assert score.dice_mean > 0.8
    assert score.ctr_mae < 0.02
    assert score_heart_estimates(cases, HeartEstimateParams(top_fraction=0.75)).dice_mean < score.dice_mean - 0.05


def _retrocardiac_lungs(h: int = 240, w: int = 260) -> tuple[np.ndarray, np.ndarray]:
    """Lungs as the U-Net draws them on real films: each includes the lung behind the heart, domed bases (the
    left dome lower), a mediastinum band between them."""
    yy, xx = np.mgrid[:h, :w].astype(float)
    right = (xx > 20) & (xx < 122) & (yy > 20) & (yy < 190 - 25 * np.exp(-((xx - 70) / 40) ** 2))
    left = (xx > 138) & (xx < 240) & (yy > 20) & (yy < 205 - 25 * np.exp(-((xx - 190) / 40) ** 2))
    return right, left


@pytest.mark.parametrize("borders", [(90.0, 200.0), (30.0, 235.0), (121.0, 139.0)])
def test_outline_stays_in_the_thorax_and_on_the_diaphragm(borders):
    from cxrground.anatomy.segment.heart import _hull_mask, diaphragm_line

    right, left = _retrocardiac_lungs()
    heart = estimate_heart(right, left, seen_borders=borders)
    assert heart.any()
    ys, xs = np.nonzero(heart)
    floor = diaphragm_line(right, left)
    assert (ys <= floor[xs] + 1).all()  # nothing below the hemidiaphragm line
    assert not (heart & ~_hull_mask(right | left)).any()  # nothing outside the thorax
    lung_rows = np.flatnonzero((right | left).any(axis=1))
    # the top is the cardiac silhouette, below the upper third of the lungs (carina, aortic knob)
    assert ys.min() > lung_rows[0] + 0.4 * (lung_rows[-1] - lung_rows[0])
    mid = 130.0
    assert mid - xs.min() <= 0.9 * (xs.max() - mid) + 2  # a right reach beyond the left one is capped


def test_apex_is_rounded_not_cut():
    right, left = _retrocardiac_lungs()
    heart = estimate_heart(right, left, seen_borders=(95.0, 205.0))
    ys, _ = np.nonzero(heart)
    widths = np.bincount(ys, minlength=heart.shape[0])
    # the widest row lies above the bottom, and the outline narrows towards the diaphragm
    assert np.argmax(widths) < ys.max() - 5
    assert widths[ys.max()] < 0.8 * widths.max()


def test_radiological_ctr_is_mrd_plus_mld_over_the_widest_thoracic_row():
    from cxrground.anatomy.ctr import internal_thoracic_diameter
    from cxrground.anatomy.segment.heart_image import radiological_ctr

    right, left = _retrocardiac_lungs()
    assert internal_thoracic_diameter(right, left) == 239 - 21 + 1  # lateral edges 21 and 239, same row
    # seen rows [y, x_right_border, x_left_border] about a midline at 130: MRD 30 and MLD 60 at their 90th pct
    rows = np.array([[150 + i, 130 - 20 - i, 130 + 40 + 2 * i] for i in range(11)], dtype=float)
    ctr, info = radiological_ctr(rows, 130.0, right, left)
    assert info["mrd_px"] == 29.0 and info["mld_px"] == 58.0
    assert ctr == pytest.approx((29 + 58) / 219)
    # a right reach beyond 0.9 x the left one is opacified lung: capped
    wide = rows.copy()
    wide[:, 1] = 20.0
    ctr_wide, info = radiological_ctr(wide, 130.0, right, left)
    assert info["mrd_px"] == pytest.approx(0.9 * 58.0) and ctr_wide < (110 + 58) / 219
    assert radiological_ctr(rows[:3], 130.0, right, left)[0] is None


def _row_profile(core: np.ndarray) -> np.ndarray:
    """A blurred cardiac row profile running outward from the midline: a brighter spine, the heart, then lung."""
    from scipy import ndimage

    prof = 0.2 + 0.5 * core
    prof[:10] += 0.2
    return ndimage.gaussian_filter1d(prof, 3)


@pytest.mark.parametrize("shape", ["step", "rounded"])
def test_steepest_border_sits_on_the_silhouette_edge(shape):
    from cxrground.anatomy.segment.heart_image import SeenHeartParams, _border_distance

    x, radius = np.arange(200, dtype=float), 80
    core = (x < radius).astype(float) if shape == "step" else np.sqrt(np.clip(1 - (x / radius) ** 2, 0, 1))
    prof = _row_profile(core)
    soft, air = float(np.median(prof[:6])), 0.2
    level = _border_distance(prof, air, soft, SeenHeartParams(border="level"), window=10)
    steep = _border_distance(prof, air, soft, SeenHeartParams(border="steepest"), window=10)
    assert abs(steep - radius) <= 2
    if shape == "rounded":  # a level crossing lies inside a body whose brightness fades towards its edge
        assert level <= radius - 5
    else:
        assert abs(level - radius) <= 2


def _low_left_lungs(h: int = 300, w: int = 260, drop: float = 65.0, right_drop: float = 0.0
                    ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_retrocardiac_lungs` with the left lung running ``drop`` pixels lower than its partner (as a left lung
    that runs below the diaphragm into the abdomen on a supine film, or beside a right lung whose base is lost); the
    right lung ``right_drop`` pixels lower."""
    yy, xx = np.mgrid[:h, :w].astype(float)
    right = (xx > 20) & (xx < 122) & (yy > 20) & (yy < 190 + right_drop - 25 * np.exp(-((xx - 70) / 40) ** 2))
    left = (xx > 138) & (xx < 240) & (yy > 20) & (yy < 205 + drop - 25 * np.exp(-((xx - 190) / 40) ** 2))
    return right, left


def test_heart_right_half_stays_above_the_right_lung_base_when_the_left_lung_runs_low():
    from cxrground.anatomy.segment.heart import diaphragm_line, floor_drop, floor_warning

    right, left = _low_left_lungs()
    base_r = int(np.flatnonzero(right.any(axis=1))[-1])
    heart = estimate_heart(right, left, seen_borders=(90.0, 200.0))
    ys, xs = np.nonzero(heart)
    mid = 130  # half-way between the lungs
    assert not ((ys > base_r + 1) & (xs < mid)).any()  # the right half rests on the right hemidiaphragm
    assert ys.max() > base_r + 20  # the left half still reaches down to the left angle
    floor = diaphragm_line(right, left)
    assert floor[mid] <= base_r + 1 and floor[int(xs.max())] > base_r + 20
    assert floor_drop(right, left) > 0.15
    assert "heart floor uncertain" in floor_warning(right, left)


def test_heart_left_half_stays_above_the_left_lung_base_when_the_right_lung_runs_low():
    from cxrground.anatomy.segment.heart import floor_warning

    right, left = _low_left_lungs(drop=-15.0, right_drop=65.0)
    base_l = int(np.flatnonzero(left.any(axis=1))[-1])
    heart = estimate_heart(right, left, seen_borders=(60.0, 170.0))
    ys, xs = np.nonzero(heart)
    assert not ((ys > base_l + 1) & (xs >= 130)).any()
    assert ((ys > base_l + 1) & (xs < 130)).any()  # the right half reaches below the left base, towards its angle
    assert floor_warning(right, left) is None  # only a left angle below the right base is judged


def test_no_floor_warning_and_straight_floor_for_lungs_of_similar_depth():
    from cxrground.anatomy.segment.heart import cardiophrenic_points, diaphragm_line, floor_warning

    right, left = _low_left_lungs(drop=-15.0)  # both bases at the same depth
    assert floor_warning(right, left) is None
    (y_r, x_r), (y_l, x_l) = cardiophrenic_points(right, left)
    floor = diaphragm_line(right, left, smooth_fraction=0.0)
    xs = np.arange(int(np.ceil(x_r)), int(x_l) + 1)
    np.testing.assert_allclose(floor[xs], np.interp(xs, [x_r, x_l], [y_r, y_l]))  # the chord, not bent


def test_floor_warning_reaches_the_record_and_the_batch_status():
    from cxrground.anatomy.segment.base import LungHeartMasks
    from cxrground.anatomy.segment.batch import SegmentRow
    from cxrground.anatomy.segment.builtin import heart_from_lungs
    from cxrground.anatomy.segment.output import SegmentationOutput

    right, left = _low_left_lungs()
    heart, info = heart_from_lungs(right, left)
    assert heart is not None and "heart floor uncertain" in info["floor_warning"]
    masks = LungHeartMasks(right, left, heart, "estimate", "unet", {"heart_estimate": info})
    output = SegmentationOutput(Path("out"), info["ctr"], {})
    assert any("heart floor uncertain" in line for line in output.summary_lines(masks))
    assert SegmentRow.written("x.png", "x.png", output, masks).status == "check"
    calm = {**info, "floor_warning": None}
    masks = LungHeartMasks(right, left, heart, "estimate", "unet", {"heart_estimate": calm})
    assert SegmentRow.written("x.png", "x.png", output, masks).status == ("ok" if info["ctr_plausible"] else "check")
