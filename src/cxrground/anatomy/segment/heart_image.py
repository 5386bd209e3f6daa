"""The cardiac borders SEEN in the image (method ``cardiac-silhouette-rows/1``), for the heart estimate.

Lung masks such as the pack's V7 masks, and the U-Net trained on them, include the lung behind the heart,
so their medial borders are the mediastinum, not the heart (CTR about 0.21 on real films). The heart is
still visible: inside those masks it is the bright soft-tissue silhouette that reaches out from the
midline over the lower lung. Per row this module finds where that silhouette ends:

1. the film is smoothed (Gaussian, σ = 1 % of the thoracic width);
2. rows from ``row_range[0]`` to ``row_range[1]`` of the lungs' height (apex = 0, lowest lung row = 1; the
   default 0.50–0.80 is below the hila and above the domes, where the heart is widest and liver and
   stomach are not yet in the row) where both lungs are present;
3. in each row: the midline (halfway between the lungs' medial edges), its soft-tissue level ``m`` (median
   over ±3 % of the thoracic width), and each lung's aerated level ``a`` (30th percentile of the lateral
   half of that lung in the row); going outward from the midline, the border is the first pixel darker
   than ``a + alpha · (m − a)`` (``alpha`` = 0.3; ``border="level"``). With ``border="steepest"`` the border
   is instead where the profile falls fastest going outward (most negative central difference; ties: nearest
   the midline) between the first pixel darker than ``a + 0.6 · (m − a)`` and ``edge_window`` (3 %) of the
   thoracic width beyond that level crossing: a real heart is a rounded body whose projected thickness, and so
   its brightness, fades towards its edge, so a level crossing lies inside the silhouette while the steepest
   fall lies on its edge. A row whose border reaches the lung's lateral edge is dropped (no silhouette edge in it);
4. the transverse diameter (``transverse``): ``"percentile"``, the ``width_percentile`` (75th) of the row
   widths; ``"robust-max"``, the maximal transverse diameter, the maximum of the running median of the row widths
   over :func:`~cxrground.anatomy.ctr.row_window` rows (2 % of the lungs' height; rows in order, rows without
   both borders skipped). The borders returned are those of the row with the width nearest that diameter, so a
   heart mask drawn with them has that diameter. ``"mrd+mld"``: the maximal right and left diameters (MRD,
   MLD), each the same robust maximum of one border's distance from the mediastinal midline (each side on its
   own, so they may come from different rows); the borders are ``midline − MRD`` and ``midline + MLD``.
   ``"quadratic-max"``: each border fitted over the seen rows by a robust quadratic in ``y``
   (:func:`smooth_border`), the diameter the widest gap between the two curves over the seen rows' span.
   ``"calibrated"``: the expected maximal diameter given the 75th-percentile width (regression calibration):
   with ``D`` the lungs' x-extent and ``(a, b)`` = ``calibration``, the width ``(a + b · w75 / D) · D``, the
   75th-percentile row's borders widened (or narrowed) symmetrically about their midpoint to it. ``(a, b)``
   come from a least-squares fit of the ``"quadratic-max"`` width on the 75th-percentile width, both over
   ``D``, across unlabelled films (``bench/ctr_calibration_fit.py``); ``b > 0``, so films keep their order.

Chosen on the pack's NIH films with patient-grouped cross-validation over a small grid (``bench/heart_ctr.py``
reports the held-out AUROC against the NIH Cardiomegaly label and the CTR distribution of normal films).
It is still an estimate: no heart mask exists in the pack to measure its outline against.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

import numpy as np
from scipy import ndimage

from cxrground.anatomy.ctr import internal_thoracic_diameter, robust_max, row_window, x_extent
from cxrground.io.masks import as_mask, check_same_shape

__all__ = [
    "CTR_CALIBRATION",
    "RADIOLOGICAL_CTR_METHOD",
    "SEEN_HEART_METHOD",
    "STEEPEST_FROM",
    "Border",
    "SeenHeartParams",
    "Transverse",
    "cardiac_row_widths",
    "radiological_ctr",
    "seen_cardiac_borders",
    "smooth_border",
]

SEEN_HEART_METHOD: Final[str] = "cardiac-silhouette-rows/1"
RADIOLOGICAL_CTR_METHOD: Final[str] = "mrd+mld-over-internal-thoracic/1"
#: The "maximal" right and left cardiac diameters are this percentile of the seen rows (a robust maximum: a
#: single row can catch a vessel or a rib edge).
MAX_PERCENTILE: Final[float] = 90.0


Transverse = Literal["percentile", "robust-max", "mrd+mld", "quadratic-max", "calibrated"]
#: Where a row's border sits: at a brightness level (``"level"``) or at the steepest fall (``"steepest"``).
Border = Literal["level", "steepest"]
#: ``border="steepest"`` searches from the crossing of this fraction of the midline's contrast above air.
STEEPEST_FROM: Final[float] = 0.6
#: ``(a, b)`` of ``transverse="calibrated"``: least squares of the ``"quadratic-max"`` width on the 75th-percentile
#: width (both over the lungs' x-extent) over 618 NIH ChestX-ray14 films of cxr-pack-v1 with ``lung_unet_v2``'s
#: lungs, no label read (``python bench/ctr_calibration_fit.py --cache DIR``;
#: ``bench/records/ctr_calibrated_preregistration.md``).
CTR_CALIBRATION: Final[tuple[float, float]] = (0.0189, 1.0710)
#: Rows whose residual from a border's fitted curve exceeds this many robust standard deviations (1.4826 x
#: the median absolute residual, at least :data:`OUTLIER_MIN_PX`) are dropped before the curve is refitted.
OUTLIER_SIGMAS: Final[float] = 3.0
OUTLIER_MIN_PX: Final[float] = 2.0
#: Refits after dropping outlier rows.
REFITS: Final[int] = 2


@dataclass(frozen=True)
class SeenHeartParams:
    """Knobs of :func:`seen_cardiac_borders` (see the module docstring)."""

    alpha: float = 0.3
    row_range: tuple[float, float] = (0.50, 0.80)
    transverse: Transverse = "percentile"
    width_percentile: float = 75.0
    smooth_fraction: float = 0.01
    midline_fraction: float = 0.03
    lung_percentile: float = 30.0
    min_rows: int = 5
    calibration: tuple[float, float] = CTR_CALIBRATION
    """``(a, b)`` of ``transverse="calibrated"``: width over the lungs' extent = ``a + b ·`` the percentile row's."""
    border: Border = "level"
    """Where a row's border sits (module docstring, step 3)."""
    edge_window: float = 0.03
    """``border="steepest"``: how far beyond the level crossing the search reaches, as a share of the thoracic width."""

    def __post_init__(self) -> None:
        if self.transverse == "calibrated" and not self.calibration[1] > 0:
            raise ValueError(f"calibration slope must be positive, got {self.calibration}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "row_range": list(self.row_range), "calibration": list(self.calibration)}


def cardiac_row_widths(
    pixels: np.ndarray, right: np.ndarray, left: np.ndarray, params: SeenHeartParams | None = None
) -> np.ndarray:
    """``(n, 3)`` rows ``[y, x_right_border, x_left_border]`` of every row where both borders were seen."""
    p = params or SeenHeartParams()
    r = as_mask(right, "right lung mask")
    lft = as_mask(left, "left lung mask")
    check_same_shape(("image", np.asarray(pixels)), ("right lung mask", r), ("left lung mask", lft))
    lungs = r | lft
    if not r.any() or not lft.any():
        return np.zeros((0, 3))
    rows = np.flatnonzero(lungs.any(axis=1))
    cols = np.flatnonzero(lungs.any(axis=0))
    y0, height = int(rows[0]), int(rows[-1] - rows[0])
    thorax = int(cols[-1] - cols[0] + 1)
    img = ndimage.gaussian_filter(np.asarray(pixels, dtype=np.float64), max(p.smooth_fraction * thorax, 0.5))
    half = max(2, round(p.midline_fraction * thorax))
    window = max(2, round(p.edge_window * thorax))
    out = []
    for y in range(int(y0 + p.row_range[0] * height), int(y0 + p.row_range[1] * height)):
        rr, ll = np.flatnonzero(r[y]), np.flatnonzero(lft[y])
        if rr.size < 3 or ll.size < 3:
            continue
        mid = round(0.5 * (rr[-1] + ll[0]))
        prof = img[y]
        soft = float(np.median(prof[max(0, mid - half) : mid + half + 1]))
        air_r = float(np.percentile(prof[rr[0] : rr[0] + max(3, (rr[-1] - rr[0]) // 2)], p.lung_percentile))
        air_l = float(np.percentile(prof[ll[-1] - max(3, (ll[-1] - ll[0]) // 2) : ll[-1] + 1], p.lung_percentile))
        if mid <= rr[0] or mid >= ll[-1]:
            continue
        out_r, out_l = prof[rr[0] : mid + 1][::-1], prof[mid : ll[-1] + 1]  # outward from the midline
        d_r = _border_distance(out_r, air_r, soft, p, window)
        d_l = _border_distance(out_l, air_l, soft, p, window)
        if d_r is None or d_l is None:
            continue
        b_r, b_l = mid - d_r, mid + d_l
        if b_r <= rr[0] + 1 or b_l >= ll[-1] - 1:
            continue
        out.append((y, b_r, b_l))
    return np.asarray(out, dtype=np.float64).reshape(-1, 3)


def _border_distance(profile: np.ndarray, air: float, soft: float, p: SeenHeartParams, window: int) -> int | None:
    """Distance from the midline of one side's border in a row (``profile`` runs outward from the midline), or
    None when the profile never falls below the border level."""
    dark = np.flatnonzero(profile < air + p.alpha * (soft - air))
    if dark.size == 0:
        return None
    level = int(dark[0])
    if p.border == "level":
        return level
    start = int(np.flatnonzero(profile < air + STEEPEST_FROM * (soft - air))[0])
    stop = min(level + window, profile.size - 3)
    if stop <= start or start < 1:
        return level
    fall = profile[start + 1 : stop + 2] - profile[start - 1 : stop]  # central differences at start..stop
    return start + int(np.argmin(fall))


def seen_cardiac_borders(
    pixels: np.ndarray, right: np.ndarray, left: np.ndarray, params: SeenHeartParams | None = None,
    rows: np.ndarray | None = None, midline: float | None = None,
) -> tuple[tuple[float, float] | None, dict[str, Any]]:
    """``((x_right_border, x_left_border), info)`` with the chosen transverse diameter (module docstring,
    step 4), or ``(None, info)`` when fewer than ``min_rows`` rows show both borders. ``rows``: the
    :func:`cardiac_row_widths` of the film when already computed; ``midline``: the mediastinal midline column,
    needed by ``transverse="mrd+mld"`` (without it: ``(None, info)``)."""
    p = params or SeenHeartParams()
    rows = cardiac_row_widths(pixels, right, left, p) if rows is None else rows
    info: dict[str, Any] = {"method": SEEN_HEART_METHOD, "transverse": p.transverse, "rows_seen": len(rows)}
    if len(rows) < p.min_rows:
        return None, {**info, "error": f"the cardiac borders were seen in fewer than {p.min_rows} rows"}
    window = row_window(_lung_height(right, left))
    if p.transverse == "mrd+mld":
        if midline is None:
            return None, {**info, "error": "no mediastinal midline (no row holds both lungs above the heart)"}
        mrd = robust_max(midline - rows[:, 1], window)
        mld = robust_max(rows[:, 2] - midline, window)
        if mld <= 0 or mrd + mld <= 0:
            return None, {**info, "error": "the left cardiac border lies right of the midline"}
        return (midline - mrd, midline + mld), {**info, "mrd_px": round(mrd, 1), "mld_px": round(mld, 1),
                                                "midline": round(float(midline), 1)}
    if p.transverse == "quadratic-max":
        fit_r = smooth_border(rows[:, 0], rows[:, 1], p.min_rows)
        fit_l = smooth_border(rows[:, 0], rows[:, 2], p.min_rows)
        if fit_r is None or fit_l is None:
            return None, {**info, "error": f"fewer than {p.min_rows} rows fit a smooth cardiac border"}
        ys = np.arange(int(rows[:, 0].min()), int(rows[:, 0].max()) + 1, dtype=np.float64)
        gap = np.polyval(fit_l, ys) - np.polyval(fit_r, ys)
        k = int(np.argmax(gap))
        if gap[k] <= 0:
            return None, {**info, "error": "the fitted cardiac borders do not enclose the heart"}
        return (float(np.polyval(fit_r, ys[k])), float(np.polyval(fit_l, ys[k]))), {**info, "row": int(ys[k])}
    widths = rows[:, 2] - rows[:, 1]
    if p.transverse == "robust-max":
        target = robust_max(widths, window)
    else:
        target = float(np.percentile(widths, p.width_percentile))
    k = int(np.argmin(np.abs(widths - target)))
    x_r, x_l = float(rows[k, 1]), float(rows[k, 2])
    if p.transverse == "calibrated":
        extent = float(x_extent(np.asarray(right, bool) | np.asarray(left, bool)))
        width = (p.calibration[0] + p.calibration[1] * (x_l - x_r) / extent) * extent
        if width <= 0:
            return None, {**info, "error": "the calibrated cardiac width is not positive"}
        centre = 0.5 * (x_r + x_l)
        return (centre - 0.5 * width, centre + 0.5 * width), {**info, "row": int(rows[k, 0]),
                                                               "row_width_px": round(x_l - x_r, 1)}
    return (x_r, x_l), {**info, "row": int(rows[k, 0])}


def smooth_border(ys: np.ndarray, xs: np.ndarray, min_rows: int = 5) -> np.ndarray | None:
    """Coefficients (``np.polyval`` order) of a quadratic ``x(y)`` fitted to one cardiac border's seen rows,
    robust to single rows: rows farther than :data:`OUTLIER_SIGMAS` robust standard deviations from the curve
    are dropped and the curve refitted (:data:`REFITS` times at most). None when fewer than ``min_rows`` rows
    remain or the rows span fewer than three distinct ``y``."""
    y = np.asarray(ys, dtype=np.float64)
    x = np.asarray(xs, dtype=np.float64)
    keep = np.ones(y.size, dtype=bool)
    coef = None
    for fit in range(REFITS + 1):
        if keep.sum() < max(min_rows, 3) or np.unique(y[keep]).size < 3:
            return None
        coef = np.polyfit(y[keep], x[keep], 2)
        if fit == REFITS:
            break
        resid = np.abs(x - np.polyval(coef, y))
        limit = max(OUTLIER_SIGMAS * 1.4826 * float(np.median(resid[keep])), OUTLIER_MIN_PX)
        if np.array_equal(resid <= limit, keep):
            break
        keep = resid <= limit
    return coef


def _lung_height(right: np.ndarray, left: np.ndarray) -> int:
    rows = np.flatnonzero((np.asarray(right, dtype=bool) | np.asarray(left, dtype=bool)).any(axis=1))
    return int(rows[-1] - rows[0] + 1) if rows.size else 0


def radiological_ctr(
    rows: np.ndarray, midline: float, right: np.ndarray, left: np.ndarray, max_right_share: float = 0.9,
    min_rows: int = 5,
) -> tuple[float | None, dict[str, Any]]:
    """The CTR as radiologists measure it on a PA film: (MRD + MLD) / maximal internal thoracic diameter.

    MRD and MLD are the maximal distances of the right and left cardiac borders from the ``midline``
    (:data:`MAX_PERCENTILE` of the seen ``rows`` of :func:`cardiac_row_widths`, each side on its own, so they
    may come from different rows), MRD at most ``max_right_share`` x MLD as in the heart outline; the thoracic
    diameter is :func:`~cxrground.anatomy.ctr.internal_thoracic_diameter` (its single widest row).
    ``(None, info)`` with fewer than ``min_rows`` rows."""
    info: dict[str, Any] = {"method": RADIOLOGICAL_CTR_METHOD}
    thorax = internal_thoracic_diameter(right, left)
    if len(rows) < min_rows or thorax <= 0:
        return None, {**info, "error": "too few rows show both cardiac borders"}
    mld = float(np.percentile(rows[:, 2] - midline, MAX_PERCENTILE))
    mrd = min(float(np.percentile(midline - rows[:, 1], MAX_PERCENTILE)), max_right_share * mld)
    if mld <= 0:
        return None, {**info, "error": "the left cardiac border lies right of the midline"}
    return (mrd + mld) / thorax, {**info, "mrd_px": round(mrd, 1), "mld_px": round(mld, 1),
                                  "thoracic_px": round(thorax, 1)}
