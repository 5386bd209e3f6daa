"""A geometric ESTIMATE of the heart from the right and left lung masks (no image needed).

The pack has no heart masks, so the built-in U-Net segments the lungs only and the heart comes from
here (``heart_source="estimate"``). The heart silhouette is the soft tissue the lungs' medial borders
wrap around, so the estimate reads it off those borders:

1. **Cardiophrenic points.** For each lung, the lowest point of its medial concavity (convex hull minus
   lung, the component on the medial side): the hull vertex where the medial border meets the diaphragm.
   When that point is not in the lowest 30 % of the lung (the mask does not wrap the heart), the lowest
   lung pixel within the medial third of the lung's columns.
2. **Floor: the diaphragm line** (:func:`diaphragm_line`): lateral of each cardiophrenic point, that lung's
   lowest row per column (its hemidiaphragm, domes up to :data:`DOME_FRACTION` of the lung height above the
   angle); between the two points, the line joining them, bent up half-way to the higher of the two lungs'
   lowest rows when it would pass below it (each half of the heart rests on its side's hemidiaphragm). The heart
   rests on it and never reaches below it; :func:`floor_warning` says when the lungs leave its floor uncertain.
3. **Top.** ``y_top = apex + top_fraction * (base - apex)`` with ``base`` the mean row of the two
   cardiophrenic points: half-way (:data:`TOP_FRACTION`), where the cardiac silhouette starts below the aortic
   knob and the hila.
4. **Width.** Over the rows from ``y_top`` down to each cardiophrenic point, the most lateral position
   of each lung's medial border (right lung: its smallest medial-edge column; left lung: its largest),
   after a running median over ``~2 %`` of the lung height to ignore single-row spikes; or the borders seen in
   the image (:mod:`.heart_image`). The heart spans between the two; so the CTR of the estimate follows the
   medial borders (or the seen borders), and a heart that pushes the lungs apart (cardiomegaly) widens it.
5. **Shape.** The heart hangs from the mediastinum: its vertical axis is the midline between the lungs above
   it. Its reach right of that axis is at most ``max_right_share`` of its reach to the left (a right border
   further out is opacified lung, not the right atrium). The outline is two half-ellipses joined on the axis
   (right and left reach), widest at ``widest_fraction`` of the way from ``y_top`` to the hemidiaphragm line,
   the lower semi-axis ``bottom_stretch`` times the remaining distance, so the diaphragm cuts the outline low
   on its curve and leaves a rounded apex sitting on it. The estimate is that outline ∩ above the
   hemidiaphragm line ∩ inside the thorax (the filled convex hull of the lungs), minus the lungs when the
   width comes from their medial borders.

The left-ward bias of the heart (patient's left = image right) is not imposed: it comes from the left
lung's medial border lying further from the midline than the right one.

What it cannot do: see a heart border the lungs do not show. The width is the cardiac silhouette's only
when the lung masks stop at the silhouette. Measured (``bench/segment.py``):

- synthetic phantoms (their lungs are the thoracic cavity minus the heart, so the medial borders ARE the
  heart borders): 50 phantoms of seed 0 (22 normal, 1 borderline, 27 enlarged): Dice 0.854 mean, CTR MAE
  0.0008, Pearson r(estimated, true CTR) 0.9998. The width is exact; the overlap is not, because the phantom
  hearts are ellipses that reach up to the hila, where the outline of real films does not start.
- real images (cxr-pack-v1, no heart truth; 69 images): the pack's V7 lung masks, and the U-Net trained
  on them, appear to run over the heart shadow (they include lung behind the heart), so the gap between
  the lungs is mostly mediastinum: the estimated CTR has median 0.21 (IQR 0.19–0.26) on the pack's masks
  and 0.21 (IQR 0.18–0.27) on the U-Net's lungs, 86–88 % below 0.30, far below real adult CTRs (about
  0.4–0.55). On such masks the estimate is NOT a heart measurement; do not use its CTR for cardiomegaly
  decisions (ILS §9.4 negatives). Backends flag it (``extra["heart_estimate"]["ctr_plausible"]`` is
  False below CTR 0.30).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import numpy as np
from scipy import ndimage

from cxrground.anatomy.ctr import EmptyAnatomyError, cardiothoracic_ratio
from cxrground.io.masks import as_mask, check_same_shape

__all__ = [
    "FLOOR_DROP_MAX",
    "HEART_METHOD",
    "TOP_FRACTION",
    "HeartEstimateParams",
    "HeartEstimateScore",
    "cardiophrenic_points",
    "diaphragm_line",
    "estimate_heart",
    "floor_warning",
    "midline",
    "score_heart_estimates",
]

#: Version tag of the method, written into provenance records.
HEART_METHOD: Final[str] = "lung-medial-border-ellipse/3"
#: Default top of the heart as a fraction of the apex-to-cardiophrenic height (below the aortic knob and hila).
TOP_FRACTION: Final[float] = 0.5


#: A hemidiaphragm dome rises at most this fraction of the lung height above the cardiophrenic angles; a column
#: whose lowest lung row lies higher holds lung above something else (a heart the masks leave out, the
#: mediastinum), and the diaphragm line is interpolated across it.
DOME_FRACTION: Final[float] = 0.15


#: A left cardiophrenic angle more than this fraction of the lungs' height below the right lung's lowest row makes
#: the heart's floor uncertain (:func:`floor_warning`): 95 % of the 205 human lung annotations of cxr-pack-v1's
#: COVID-19 films have it within 0.144 (``bench/segment.py --real`` prints the percentiles).
FLOOR_DROP_MAX: Final[float] = 0.15


#: ``(a, b)`` of ``HeartEstimateParams(outline_calibration=...)``: least squares of the ``quadratic-max`` outline's CTR
#: on the shipped outline's CTR over 619 NIH ChestX-ray14 films of cxr-pack-v1 with ``lung_unet_v2``'s lungs, no label
#: read (``python bench/ctr_calibration_fit.py --cache DIR --outline``;
#: ``bench/records/ctr_calibrated_preregistration.md``, round 4).
OUTLINE_CALIBRATION: Final[tuple[float, float]] = (0.0836, 0.9088)


@dataclass(frozen=True)
class HeartEstimateParams:
    """Knobs of :func:`estimate_heart` (fractions of the lung height unless stated)."""

    top_fraction: float = TOP_FRACTION
    widest_fraction: float = 0.6
    """Row of the ellipse's widest point between the top and the floor (0 = top, 1 = floor)."""
    bottom_stretch: float = 1.25
    """Lower semi-axis over the widest-row-to-floor distance (> 1: the diaphragm cuts the outline, leaving a
    rounded apex on it)."""
    smooth_fraction: float = 0.02
    max_right_share: float = 0.9
    """The heart's reach right of the midline is at most this share of its reach to the left (a seen right border
    further out lies in opacified lung, not on the right atrium)."""
    outline_calibration: tuple[float, float] | None = None
    """``(a, b)``, e.g. :data:`OUTLINE_CALIBRATION`: when the cardiac borders are read from the image
    (:func:`~.builtin.heart_from_lungs` with pixels), the outline is redrawn with both half-widths about the midline
    scaled so that its CTR becomes ``a + b ·`` the CTR it was drawn with; None (default): off."""


def _medial_edges(mask: np.ndarray, side: str) -> np.ndarray:
    """Per row: medial-most column of the lung (right lung: max x; left lung: min x); NaN on empty rows."""
    w = mask.shape[1]
    has = mask.any(axis=1)
    if side == "right":
        edge = (w - 1 - np.argmax(mask[:, ::-1], axis=1)).astype(np.float64)
    else:
        edge = np.argmax(mask, axis=1).astype(np.float64)
    edge[~has] = np.nan
    return edge


def _hull_mask(mask: np.ndarray) -> np.ndarray:
    """Filled convex hull of a mask's pixel centres (always contains the mask)."""
    from PIL import Image, ImageDraw
    from scipy.spatial import ConvexHull, QhullError

    ys, xs = np.nonzero(mask ^ ndimage.binary_erosion(mask))
    pts = np.stack([xs, ys], axis=1).astype(np.float64)
    try:
        hull = ConvexHull(pts)
    except (QhullError, ValueError):  # degenerate (a line or a few pixels)
        return mask.copy()
    poly = [(float(x), float(y)) for x, y in pts[hull.vertices]]
    canvas = Image.new("1", (mask.shape[1], mask.shape[0]), 0)
    ImageDraw.Draw(canvas).polygon(poly, fill=1, outline=1)
    return np.asarray(canvas, dtype=bool) | mask


def _medial_concavity(mask: np.ndarray, side: str) -> np.ndarray:
    """The largest concavity (convex hull minus lung, 4-connected) on the lung's medial side: the room
    the mediastinum and the heart take from that lung. Empty when the lung has none."""
    conc = _hull_mask(mask) & ~mask
    lab, n = ndimage.label(conc)
    if n == 0:
        return conc
    x_mid = float(np.nonzero(mask)[1].mean())
    best, best_area = 0, 0
    for k, sl in enumerate(ndimage.find_objects(lab), start=1):
        comp = lab[sl] == k
        area = int(comp.sum())
        cx = float(np.nonzero(comp)[1].mean()) + sl[1].start
        medial = cx > x_mid if side == "right" else cx < x_mid
        if medial and area > best_area:
            best, best_area = k, area
    return lab == best if best else np.zeros_like(conc)


#: A medial concavity whose lowest point lies above this fraction of the lung's height does not reach
#: the diaphragm (the lung mask does not wrap the heart); the fallback cardiophrenic point is used.
_CP_MIN_FRACTION: Final[float] = 0.7


def _cardiophrenic_point(mask: np.ndarray, conc: np.ndarray, side: str) -> tuple[float, float]:
    """(row, column) of the cardiophrenic angle: the lowest point of the medial concavity (the hull
    vertex where the heart border meets the diaphragm) when it lies in the lowest 30 % of the lung;
    otherwise the lowest lung pixel within the medial third of the lung's columns."""
    rows = np.flatnonzero(mask.any(axis=1))
    y_min_ok = rows[0] + _CP_MIN_FRACTION * (rows[-1] - rows[0])
    if conc.any():
        ys, xs = np.nonzero(conc)
        y = int(ys.max())
        if y >= y_min_ok:
            return float(y), float(xs[ys == y].mean())
    cols = np.flatnonzero(mask.any(axis=0))
    x0, x1 = int(cols[0]), int(cols[-1])
    third = max(1, (x1 - x0 + 1) // 3)
    band = slice(x1 - third + 1, x1 + 1) if side == "right" else slice(x0, x0 + third)
    ys, xs = np.nonzero(mask[:, band])
    y = int(ys.max())
    return float(y), float(xs[ys == y].mean()) + band.start


def _running_median(values: np.ndarray, size: int) -> np.ndarray:
    if size <= 1 or values.size < 3:
        return values
    return ndimage.median_filter(values, size=min(size, values.size), mode="nearest")


def diaphragm_line(right_lung: np.ndarray, left_lung: np.ndarray, smooth_fraction: float = 0.03,
                   angles: tuple[tuple[float, float], tuple[float, float]] | None = None) -> np.ndarray:
    """Per column, the row of the diaphragm under the lungs and the heart (``(W,)`` floats).

    Lateral of each cardiophrenic angle (:func:`cardiophrenic_points`) it is that lung's lowest row in the column
    (the hemidiaphragm), where that row lies at most :data:`DOME_FRACTION` of the lung height above the angle;
    between the two angles it is the line joining them (the heart's inferior border rests on the diaphragm there),
    and never above it. That line is straight unless it would pass below either lung's lowest row half-way between
    the angles: each half of the heart rests on its side's hemidiaphragm, which lies no lower than that lung's
    lowest row (its costophrenic recess), so there the line bends up to the higher of the two rows and runs straight
    to each angle (one angle far below the other lung's base: a lung running below the diaphragm, a lost base or a
    low hemidiaphragm; see :func:`floor_warning`); columns with no usable lung row are interpolated, columns beyond
    the lungs held flat; then a running median over ``smooth_fraction`` of the thoracic width. Nothing of the heart
    lies below it. ``angles``: the :func:`cardiophrenic_points` when already known. Raises
    :class:`~cxrground.anatomy.ctr.EmptyAnatomyError` when a lung is empty.
    """
    r, lft = as_mask(right_lung, "right lung mask"), as_mask(left_lung, "left lung mask")
    lungs = r | lft
    h, w = lungs.shape
    (y_rb, x_rb), (y_lb, x_lb) = angles or cardiophrenic_points(r, lft)
    rows = np.flatnonzero(lungs.any(axis=1))
    min_row = min(y_rb, y_lb) - DOME_FRACTION * (0.5 * (y_rb + y_lb) - rows[0])
    xx = np.arange(w, dtype=np.float64)
    low_r = (h - 1 - np.argmax(r[::-1], axis=0)).astype(np.float64)
    low_l = (h - 1 - np.argmax(lft[::-1], axis=0)).astype(np.float64)
    use_r = r.any(axis=0) & (xx <= x_rb) & (low_r >= min_row)
    use_l = lft.any(axis=0) & (xx >= x_lb) & (low_l >= min_row)
    low = np.where(use_r, low_r, low_l)
    cols = np.flatnonzero(use_r | use_l)
    chord_x, chord_y = np.array([x_rb, x_lb]), np.array([y_rb, y_lb])
    if x_lb < x_rb:
        chord_x, chord_y = chord_x[::-1], chord_y[::-1]
    between = (xx > min(x_rb, x_lb)) & (xx < max(x_rb, x_lb))
    # each half of the heart rests on its side's hemidiaphragm, which lies no lower than that lung's lowest row:
    # half-way between the angles the line bends up to the higher of the two rows when the chord would pass below it
    x_half = 0.5 * (x_rb + x_lb)
    base_r, base_l = (float(np.flatnonzero(m.any(axis=1))[-1]) for m in (r, lft))
    y_half = min(float(np.interp(x_half, chord_x, chord_y)), max(base_r, y_rb), max(base_l, y_lb))
    chord_x, chord_y = np.array([chord_x[0], x_half, chord_x[1]]), np.array([chord_y[0], y_half, chord_y[1]])
    chord = np.interp(xx, chord_x, chord_y)
    cols = cols[~between[cols]]
    keep_x = np.concatenate([cols, chord_x]).astype(np.float64)
    keep_y = np.concatenate([low[cols], chord_y])
    order = np.argsort(keep_x, kind="mergesort")
    line = np.interp(xx, keep_x[order], keep_y[order])
    line = np.where(between, np.maximum(line, chord), line)
    size = max(1, round(smooth_fraction * (np.ptp(np.flatnonzero(lungs.any(axis=0))) + 1))) | 1
    return _running_median(line, size)


def floor_drop(right_lung: np.ndarray, left_lung: np.ndarray,
               angles: tuple[tuple[float, float], tuple[float, float]] | None = None) -> float:
    """How far the left cardiophrenic angle lies below the right lung's lowest row, as a fraction of the lungs'
    height (negative: above it). Raises :class:`~cxrground.anatomy.ctr.EmptyAnatomyError` when a lung is empty."""
    r, lft = as_mask(right_lung, "right lung mask"), as_mask(left_lung, "left lung mask")
    (_, _), (y_lb, _) = angles or cardiophrenic_points(r, lft)
    rows = np.flatnonzero((r | lft).any(axis=1))
    return float((y_lb - np.flatnonzero(r.any(axis=1))[-1]) / max(1, rows[-1] - rows[0]))


def floor_warning(right_lung: np.ndarray, left_lung: np.ndarray,
                  angles: tuple[tuple[float, float], tuple[float, float]] | None = None) -> str | None:
    """Why the heart's floor is uncertain, or None: the left cardiophrenic angle lies more than
    :data:`FLOOR_DROP_MAX` of the lungs' height below the right lung's lowest row (:func:`floor_drop`), more than
    in 95 % of annotated lungs. Then the left lung runs below the diaphragm, the right lung's base is lost (dense
    opacity, effusion), or the left hemidiaphragm is unusually low; the lungs cannot tell which. Only this direction
    is judged (the bound is measured for it: the left hemidiaphragm normally lies lower than the right).
    :func:`diaphragm_line` keeps the floor half-way between the angles above both lungs' lowest rows in every
    case."""
    drop = floor_drop(right_lung, left_lung, angles)
    if drop <= FLOOR_DROP_MAX:
        return None
    return (f"heart floor uncertain: the left cardiophrenic angle lies {drop:.0%} of the lung height below the "
            f"right lung's base (more than {FLOOR_DROP_MAX:.0%}): a left lung below the diaphragm or a lost right "
            "base? check the heart outline in the overlay")


def cardiophrenic_points(right_lung: np.ndarray, left_lung: np.ndarray) -> tuple[tuple[float, float],
                                                                                   tuple[float, float]]:
    """``((row, col) right, (row, col) left)`` cardiophrenic angles (step 1 of the module docstring)."""
    if not right_lung.any() or not left_lung.any():
        raise EmptyAnatomyError("both lungs are needed to estimate the heart; one lung mask is empty")
    return (_cardiophrenic_point(right_lung, _medial_concavity(right_lung, "right"), "right"),
            _cardiophrenic_point(left_lung, _medial_concavity(left_lung, "left"), "left"))


def midline(right: np.ndarray, left: np.ndarray, y0: int, y1: int) -> float | None:
    """Median over rows ``y0..y1`` of the point halfway between the two lungs' medial edges (None: no row
    holds both lungs)."""
    med_r, med_l = _medial_edges(right, "right")[y0:y1], _medial_edges(left, "left")[y0:y1]
    both = ~np.isnan(med_r) & ~np.isnan(med_l)
    return float(np.median(0.5 * (med_r[both] + med_l[both]))) if both.any() else None


def estimate_heart(
    right_lung: np.ndarray,
    left_lung: np.ndarray,
    params: HeartEstimateParams | None = None,
    seen_borders: tuple[float, float] | None = None,
    width_scale: float = 1.0,
) -> np.ndarray:
    """Estimate the heart mask from the lung masks (method in the module docstring); bool ``(H, W)``.

    Without ``seen_borders`` the heart spans the gap between the lungs' medial borders, which on real films is
    narrower than the heart (CTR about 0.2): for the built-in outline, with the borders read from the image, use
    :func:`~cxrground.anatomy.segment.builtin.heart_from_lungs` with ``pixels``.

    ``width_scale``: both half-widths about the midline multiplied by it (after the right-reach cap).

    ``seen_borders`` = ``(x_right, x_left)``: the cardiac borders seen in the image
    (:func:`~.heart_image.seen_cardiac_borders`). The heart then spans those borders instead of the lungs'
    medial borders (taking the wider of the two lowered the held-out CTR AUROC against the NIH Cardiomegaly
    label from 0.84 to 0.79), and it may overlap the lung masks (which include the lung behind the heart).

    Whatever the borders, the outline stays inside the thorax (the filled convex hull of the lungs) and on or
    above the hemidiaphragm line of every column (:func:`diaphragm_line`).

    Raises :class:`~cxrground.anatomy.ctr.EmptyAnatomyError` when a lung is empty and
    :class:`~cxrground.errors.MaskShapeError` when the shapes differ. The result may be empty when the
    lungs leave no room between them (e.g. masks that overlap at the midline).
    """
    p = params or HeartEstimateParams()
    r = as_mask(right_lung, "right lung mask")
    lft = as_mask(left_lung, "left lung mask")
    h, w = check_same_shape(("right lung mask", r), ("left lung mask", lft))
    if not r.any() or not lft.any():
        raise EmptyAnatomyError("both lungs are needed to estimate the heart; one lung mask is empty")
    lungs = r | lft
    y_apex = float(np.flatnonzero(lungs.any(axis=1))[0])
    (y_rb, x_rb), (y_lb, x_lb) = cardiophrenic_points(r, lft)
    height = max(0.5 * (y_rb + y_lb) - y_apex, 1.0)
    y_top = y_apex + p.top_fraction * height
    xx = np.arange(w, dtype=np.float64)
    floor = diaphragm_line(r, lft, angles=((y_rb, x_rb), (y_lb, x_lb)))

    # lateral-most reach of each lung's medial border between the top and its cardiophrenic point
    smooth = max(1, round(p.smooth_fraction * height)) | 1
    med_r, med_l = _medial_edges(r, "right"), _medial_edges(lft, "left")
    lo = int(np.ceil(y_top))
    seg_r, seg_l = med_r[lo : int(y_rb) + 1], med_l[lo : int(y_lb) + 1]
    seg_r, seg_l = seg_r[~np.isnan(seg_r)], seg_l[~np.isnan(seg_l)]
    x_right = float(_running_median(seg_r, smooth).min()) + 1.0 if seg_r.size else x_rb + 1.0
    x_left = float(_running_median(seg_l, smooth).max()) - 1.0 if seg_l.size else x_lb - 1.0
    if seen_borders is not None:
        x_right, x_left = float(seen_borders[0]), float(seen_borders[1])
    if x_left <= x_right:
        return np.zeros((h, w), dtype=bool)

    # the heart hangs from the mediastinum: its vertical axis is the midline above it, one third of it (or
    # less) on the patient's right; a right border further out than the left one is not the heart's
    mid = midline(r, lft, int(y_apex + 0.2 * height), int(y_top)) or 0.5 * (x_right + x_left)
    mid = float(np.clip(mid, x_right + 0.1 * (x_left - x_right), x_left - 0.1 * (x_left - x_right)))
    w_left = x_left - mid + 0.5
    w_right = min(mid - x_right, p.max_right_share * w_left) + 0.5
    w_left, w_right = w_left * width_scale, w_right * width_scale
    y_floor = float(np.median(floor[int(max(0, mid - w_right)) : int(min(w, mid + w_left)) + 1]))
    y_w = y_top + p.widest_fraction * max(y_floor - y_top, 1.0)
    b_top = max(y_w - y_top, 1.0)
    b_bot = max(p.bottom_stretch * (y_floor - y_w), 1.0)

    yy = np.arange(h, dtype=np.float64)[:, None]
    ey = (yy - y_w) / np.where(yy < y_w, b_top, b_bot)
    ex = (xx[None, :] - mid) / np.where(xx[None, :] < mid, w_right, w_left)
    heart = (ex * ex + ey * ey <= 1.0) & (yy <= floor[None, :]) & _hull_mask(lungs)
    if seen_borders is None:
        heart &= ~lungs
    if not heart.any():
        return heart
    lab, n = ndimage.label(heart)
    if n > 1:
        sizes = ndimage.sum_labels(heart, lab, index=np.arange(1, n + 1))
        heart = lab == int(np.argmax(sizes)) + 1
    return ndimage.binary_fill_holes(heart)


@dataclass(frozen=True)
class HeartEstimateScore:
    """Agreement of heart estimates with true hearts over a set of cases."""

    n: int
    dice_mean: float
    dice_median: float
    ctr_mae: float
    ctr_bias: float
    """Mean of ``estimated CTR − true CTR``."""
    ctr_pearson: float
    per_case: tuple[tuple[float, float, float], ...]
    """``(dice, true CTR, estimated CTR)`` per case."""

    def to_dict(self) -> dict[str, float | int]:
        """JSON-ready summary (without the per-case rows)."""
        return {"n": self.n, "dice_mean": self.dice_mean, "dice_median": self.dice_median,
                "ctr_mae": self.ctr_mae, "ctr_bias": self.ctr_bias, "ctr_pearson": self.ctr_pearson}


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    total = int(a.sum()) + int(b.sum())
    return 1.0 if total == 0 else 2.0 * int((a & b).sum()) / total


def score_heart_estimates(
    cases: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]],
    params: HeartEstimateParams | None = None,
) -> HeartEstimateScore:
    """Score :func:`estimate_heart` on ``(right_lung, left_lung, true_heart)`` cases: Dice and CTR error.

    CTR follows :func:`~cxrground.anatomy.ctr.cardiothoracic_ratio` for both hearts; an empty estimate
    counts as Dice 0 and CTR 0.
    """
    rows = []
    for r, lft, heart in cases:
        est = estimate_heart(r, lft, params)
        true_ctr = cardiothoracic_ratio(heart, r, lft)
        est_ctr = cardiothoracic_ratio(est, r, lft) if est.any() else 0.0
        rows.append((_dice(est, as_mask(heart)), true_ctr, est_ctr))
    if not rows:
        raise ValueError("no cases to score")
    arr = np.asarray(rows, dtype=np.float64)
    err = arr[:, 2] - arr[:, 1]
    corr = float(np.corrcoef(arr[:, 1], arr[:, 2])[0, 1]) if len(rows) > 2 and arr[:, 2].std() > 0 else float("nan")
    return HeartEstimateScore(
        n=len(rows),
        dice_mean=float(arr[:, 0].mean()),
        dice_median=float(np.median(arr[:, 0])),
        ctr_mae=float(np.abs(err).mean()),
        ctr_bias=float(err.mean()),
        ctr_pearson=corr,
        per_case=tuple(tuple(float(v) for v in row) for row in rows),
    )
