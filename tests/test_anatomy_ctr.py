"""The cardiothoracic ratio as radiologists measure it: robust maximal transverse cardiac diameter over the
maximal internal thoracic diameter (same-row lateral lung edges), on masks with known widths."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.anatomy.ctr import (
    EmptyAnatomyError,
    cardiothoracic_ratio,
    internal_thoracic_diameter,
    maximal_transverse_diameter,
    measure_ctr,
    robust_max,
    row_window,
)
from cxrground.anatomy.segment.heart_image import SeenHeartParams, seen_cardiac_borders, smooth_border
from cxrground.errors import MaskShapeError


def _ellipse(shape: tuple[int, int], cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    yy, xx = np.mgrid[: shape[0], : shape[1]].astype(float)
    return ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0


def _staggered_lungs(shape: tuple[int, int] = (300, 300)) -> tuple[np.ndarray, np.ndarray]:
    """Right lung widest (x 20) in rows 50-99, left lung widest (x 279) in rows 200-249: no row holds both
    lateral extremes, so the internal thoracic diameter (same row) is narrower than the lungs' extent."""
    right = np.zeros(shape, dtype=bool)
    left = np.zeros(shape, dtype=bool)
    right[20:250, 40:140] = True
    right[50:100, 20:40] = True
    left[20:250, 160:260] = True
    left[200:250, 260:280] = True
    return right, left


def test_row_window_is_two_percent_of_the_lung_height_odd_and_at_least_three():
    assert row_window(100) == 3 and row_window(10) == 3
    assert row_window(500) == 11 and row_window(400) == 9
    assert all(row_window(h) % 2 == 1 for h in range(0, 2000, 37))


def test_robust_max_ignores_a_single_row_spike_but_not_a_plateau():
    widths = np.array([50.0] * 20 + [90.0] + [50.0] * 20)
    assert robust_max(widths, 1) == 90.0
    assert robust_max(widths, 3) == 50.0
    plateau = np.array([50.0] * 20 + [70.0] * 3 + [50.0] * 20)
    assert robust_max(plateau, 3) == 70.0
    assert robust_max(np.array([]), 5) == 0.0
    assert robust_max(np.array([10.0, 30.0, 20.0]), 5) == 20.0  # fewer values than the window: their median


def test_maximal_transverse_diameter_is_the_widest_row_robust_to_one_row():
    shape = (200, 200)
    heart = _ellipse(shape, 120, 100, 40, 30)  # widest row: x 70..130 = 61 px
    assert maximal_transverse_diameter(heart) == 61
    spiky = heart.copy()
    spiky[100, 10:190] = True  # one row reaching far out (a rib edge, a ragged mask row)
    assert maximal_transverse_diameter(spiky, 1) == 180
    assert maximal_transverse_diameter(spiky, 5) == pytest.approx(61, abs=2)
    assert maximal_transverse_diameter(np.zeros(shape, dtype=bool), 5) == 0.0


def test_internal_thoracic_diameter_takes_both_lateral_edges_in_the_same_row():
    right, left = _staggered_lungs()
    # widest same-row span: right edge 20 with left edge 259 (rows 50-99) or 40 with 279 (rows 200-249): 240
    assert internal_thoracic_diameter(right, left) == 240
    assert internal_thoracic_diameter(right, left, 9) == 240
    # the union's extent (x 20..279 = 260) is wider: the two definitions differ on these lungs
    heart = np.zeros_like(right)
    heart[150:200, 100:208] = True  # 108 px
    m = measure_ctr(heart, right, left, "radiological")
    assert m.ctr == pytest.approx(108 / 240) and m.thoracic.length == 240
    assert (m.cardiac.length, m.cardiac.x0, m.cardiac.x1) == (108, 100, 207) and 150 <= m.cardiac.y < 200
    # the ILS ctr (extent) divides by the union's extent
    assert cardiothoracic_ratio(heart, right, left) == pytest.approx(108 / 260)
    e = measure_ctr(heart, right, left)
    assert e.definition == "extent" and e.ctr == cardiothoracic_ratio(heart, right, left)
    assert (e.thoracic.x0, e.thoracic.x1, e.thoracic.length) == (20, 279, 260)
    assert internal_thoracic_diameter(right, np.zeros_like(left)) == 0.0


def test_internal_thoracic_diameter_ignores_a_one_row_bulge():
    right, left = _staggered_lungs()
    bulged = right.copy()
    bulged[150, 0:40] = True  # one row of the right lung reaching the film edge
    assert internal_thoracic_diameter(bulged, left, 1) == 260
    assert internal_thoracic_diameter(bulged, left, row_window(230)) == 240


def test_ctr_of_an_elliptic_heart_between_elliptic_lungs():
    shape = (400, 400)
    right = _ellipse(shape, 200, 110, 150, 80)  # lateral edge x 30
    left = _ellipse(shape, 200, 290, 150, 80)  # lateral edge x 370
    heart = _ellipse(shape, 260, 210, 60, 70)  # widest row 140..280 = 141 px
    m = measure_ctr(heart, right, left, "radiological")
    assert m.ctr == pytest.approx(141 / 341, abs=2 / 341)
    assert abs(m.cardiac.y - 260) <= 3 and abs(m.thoracic.y - 200) <= 3  # drawn where each is widest
    # the heart's extent and its widest row agree for a convex heart: the two ratios match here
    assert cardiothoracic_ratio(heart, right, left) == pytest.approx(141 / 341)
    assert m.to_dict()["cardiac"]["y"] == m.cardiac.y


def test_ctr_errors_name_the_problem():
    right, left = _staggered_lungs()
    empty = np.zeros_like(right)
    with pytest.raises(EmptyAnatomyError, match="heart"):
        cardiothoracic_ratio(empty, right, left)
    with pytest.raises(EmptyAnatomyError, match="lung"):
        measure_ctr(right, empty, empty, "radiological")
    with pytest.raises(MaskShapeError):
        measure_ctr(np.ones((10, 10), dtype=bool), right, left)
    # one lung only: no row holds both lungs, the radiological CTR falls back to the lung's extent
    heart = np.zeros_like(right)
    heart[150:200, 100:130] = True
    assert measure_ctr(heart, right, empty, "radiological").ctr == pytest.approx(30 / 120)


def _rows(n: int = 40) -> np.ndarray:
    """Seen rows ``[y, x_right_border, x_left_border]`` about a midline at 150: the heart widens downwards
    (right border 120 → 101, left border 200 → 239), one noisy row at y 110 reaching far out."""
    rows = np.array([[100 + i, 120 - i // 2, 200 + i] for i in range(n)], dtype=float)
    rows[10, 1], rows[10, 2] = 60.0, 290.0
    return rows


def test_seen_borders_robust_max_is_the_widest_level_not_a_noisy_row():
    right, left = _staggered_lungs()
    px = np.zeros(right.shape)
    rows = _rows()
    (x_r, x_l), info = seen_cardiac_borders(px, right, left, SeenHeartParams(transverse="robust-max"), rows=rows)
    assert info["transverse"] == "robust-max"
    # widest smoothed rows at the bottom: width about 39 + 19 + 80 = 138, not the noisy 230
    assert 130 <= x_l - x_r <= 140 and info["row"] >= 130
    (p_r, p_l), _ = seen_cardiac_borders(px, right, left, SeenHeartParams(transverse="percentile"), rows=rows)
    assert p_l - p_r < x_l - x_r  # the 75th-percentile row is narrower than the maximal diameter


def test_seen_borders_mrd_mld_take_each_side_from_the_midline():
    right, left = _staggered_lungs()
    px = np.zeros(right.shape)
    rows = _rows()
    rows[-3:, 1] = 125.0  # the lowest right borders come back in: MRD is reached higher up than MLD
    (x_r, x_l), info = seen_cardiac_borders(px, right, left, SeenHeartParams(transverse="mrd+mld"), rows=rows,
                                            midline=150.0)
    assert info["mld_px"] == pytest.approx(89 - 1, abs=1.5) and info["mrd_px"] == pytest.approx(48, abs=1.5)
    assert (x_r, x_l) == (150.0 - info["mrd_px"], 150.0 + info["mld_px"])
    none, info = seen_cardiac_borders(px, right, left, SeenHeartParams(transverse="mrd+mld"), rows=rows)
    assert none is None and "midline" in info["error"]


def test_smooth_border_fits_a_curve_through_the_rows_and_ignores_a_far_row():
    y = np.arange(100, 160, dtype=float)
    x = 200 + 0.02 * (y - 130) ** 2
    x_noisy = x.copy()
    x_noisy[5] += 60.0
    coef = smooth_border(y, x_noisy)
    assert coef is not None
    assert np.abs(np.polyval(coef, y) - x).max() < 0.5
    # without the outlier rejection the far row would pull the curve by several pixels
    assert np.abs(np.polyval(np.polyfit(y, x_noisy, 2), y) - x).max() > 2.0
    assert smooth_border(y[:4], x[:4]) is None  # fewer than min_rows
    assert smooth_border(np.full(8, 120.0), np.arange(8.0), min_rows=5) is None  # one distinct row


def test_seen_borders_quadratic_max_is_the_widest_gap_between_the_fitted_borders():
    right, left = _staggered_lungs()
    px = np.zeros(right.shape)
    rows = _rows()
    (x_r, x_l), info = seen_cardiac_borders(px, right, left, SeenHeartParams(transverse="quadratic-max"),
                                            rows=rows)
    # the borders run straight (slopes -1/2 and +1) and widen downwards: the widest gap is at the lowest row,
    # 19.5 + 39 + 80 wide (about 138), not the noisy row's 230
    assert info["row"] == 139 and 136 <= x_l - x_r <= 140
    few = rows[:3]
    none, info = seen_cardiac_borders(px, right, left, SeenHeartParams(transverse="quadratic-max"), rows=few)
    assert none is None and "fewer than" in info["error"]


def test_seen_borders_calibrated_maps_the_percentile_width_about_its_midpoint():
    right, left = _staggered_lungs()
    px = np.zeros(right.shape)
    rows = _rows()
    cols = np.flatnonzero((right | left).any(axis=0))
    extent = cols[-1] - cols[0] + 1
    (p_r, p_l), base = seen_cardiac_borders(px, right, left, SeenHeartParams(transverse="percentile"), rows=rows)
    same, _ = seen_cardiac_borders(px, right, left, SeenHeartParams(transverse="calibrated", calibration=(0.0, 1.0)),
                                   rows=rows)
    assert same == pytest.approx((p_r, p_l))
    (x_r, x_l), info = seen_cardiac_borders(
        px, right, left, SeenHeartParams(transverse="calibrated", calibration=(0.05, 1.1)), rows=rows)
    assert x_l - x_r == pytest.approx((0.05 + 1.1 * (p_l - p_r) / extent) * extent)
    assert 0.5 * (x_r + x_l) == pytest.approx(0.5 * (p_r + p_l)) and info["row"] == base["row"]
    with pytest.raises(ValueError, match="slope"):
        SeenHeartParams(transverse="calibrated", calibration=(0.1, 0.0))


def test_draw_rows_draws_each_segment_with_end_ticks():
    from cxrground.io.overlay import draw_rows

    rgb = np.zeros((50, 80, 3), dtype=np.uint8)
    out = draw_rows(rgb, [(20, 10, 60), (-1, 0, 5)], [(1.0, 0.5, 0.0), (0.0, 1.0, 0.0)], thickness=1)
    assert not rgb.any()  # a copy
    assert (out[20, 10:61] == (255, 128, 0)).all() and not out[20, 61:].any() and not out[20, :10].any()
    assert (out[19, 10] == (255, 128, 0)).all() and (out[21, 60] == (255, 128, 0)).all()  # end ticks
    assert not out[19, 30].any() and not (out == (0, 255, 0)).all(axis=2).any()  # negative row skipped
    with pytest.raises(ValueError, match="RGB"):
        draw_rows(np.zeros((5, 5)), [], [])


def test_segmentation_output_records_and_draws_the_ctr_diameters(tmp_path):
    from PIL import Image

    from cxrground.anatomy.segment.base import LungHeartMasks
    from cxrground.anatomy.segment.output import DIAMETER_COLOURS, write_segmentation
    from cxrground.io.image import CXRImage

    right, left = _staggered_lungs()
    heart = np.zeros_like(right)
    heart[150:200, 100:208] = True
    image = CXRImage(np.full(right.shape, 40, dtype=np.uint8))
    masks = LungHeartMasks(right, left, heart, "truth", "given:test", {})
    out = write_segmentation(tmp_path, tmp_path / "film.png", image, masks, {})
    d = out.record["ctr_diameters"]
    assert out.ctr == pytest.approx(108 / 260) and out.record["ctr"] == round(108 / 260, 4)
    assert (d["cardiac"]["x0"], d["cardiac"]["x1"]) == (100, 207)
    assert (d["thoracic"]["x0"], d["thoracic"]["x1"]) == (20, 279)
    rgb = np.asarray(Image.open(tmp_path / "overlay.png").convert("RGB"))
    orange = np.asarray(DIAMETER_COLOURS[0]) * 255
    assert np.abs(rgb[d["cardiac"]["y"], 150].astype(float) - orange).max() <= 1


def test_heart_from_lungs_takes_the_seen_width_rule():
    from cxrground.anatomy.segment.builtin import heart_from_lungs
    from cxrground.datasets.synthetic import SynthConfig, generate_study

    study = generate_study(0, 2, SynthConfig(width=256))
    px = np.asarray(study.image, dtype=np.float64)
    right, left = study.anatomy_masks["right_lung"], study.anatomy_masks["left_lung"]
    widths = {}
    for rule in ("percentile", "robust-max", "mrd+mld"):
        heart, info = heart_from_lungs(right, left, pixels=px, seen_params=SeenHeartParams(transverse=rule))
        assert heart is not None and info["seen"]["transverse"] == rule and "error" not in info["seen"]
        widths[rule] = maximal_transverse_diameter(heart)
    default, _ = heart_from_lungs(right, left, pixels=px)
    assert maximal_transverse_diameter(default) == widths["percentile"]
    assert widths["robust-max"] >= widths["percentile"]


def test_outline_calibration_redraws_the_outline_to_the_target_ctr():
    from cxrground.anatomy.ctr import cardiothoracic_ratio
    from cxrground.anatomy.segment.builtin import heart_from_lungs
    from cxrground.anatomy.segment.heart import HeartEstimateParams
    from cxrground.datasets.synthetic import SynthConfig, generate_study

    study = generate_study(0, 2, SynthConfig(width=256))
    px = np.asarray(study.image, dtype=np.float64)
    right, left = study.anatomy_masks["right_lung"], study.anatomy_masks["left_lung"]
    plain, _ = heart_from_lungs(right, left, HeartEstimateParams(outline_calibration=None), pixels=px)
    same, info = heart_from_lungs(right, left, HeartEstimateParams(outline_calibration=(0.0, 1.0)), pixels=px)
    assert np.array_equal(plain, same) and info["outline_calibration"]["width_scale"] == 1.0
    c = cardiothoracic_ratio(plain, right, left)
    wider, info = heart_from_lungs(right, left, HeartEstimateParams(outline_calibration=(0.05, 1.0)), pixels=px)
    assert info["outline_calibration"]["target_ctr"] == pytest.approx(c + 0.05, abs=1e-4)
    assert cardiothoracic_ratio(wider, right, left) == pytest.approx(c + 0.05, abs=0.01)
    assert info["ctr"] == pytest.approx(cardiothoracic_ratio(wider, right, left), abs=1e-4)
