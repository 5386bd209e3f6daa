"""Cardiothoracic ratio (ILS.md §9.4) from heart and lung masks: two definitions.

- **extent** (:func:`cardiothoracic_ratio`, the ``ctr`` of every output and of the ILS negative rule; ILS.md's
  proposed default): ``(max_x(H) − min_x(H) + 1) / (max_x(Lr ∪ Ll) − min_x(Lr ∪ Ll) + 1)``, the heart's
  horizontal extent over that of both lungs together.
- **radiological** (:func:`measure_ctr` with ``definition="radiological"``): as radiologists measure it on a PA
  film, the maximal transverse cardiac diameter (:func:`transverse_cardiac_diameter`: the widest row of the
  heart mask, first to last heart pixel) over the maximal internal thoracic diameter (:func:`thoracic_diameter`:
  the widest row from the right lung's lateral edge to the left lung's lateral edge in the same row; the lungs'
  lateral edges lie on the inner margins of the ribs). Both maxima are robust: the maximum of a running median
  over :func:`row_window` consecutive rows (2 % of the lungs' height), so one noisy row (a ragged mask row, a
  bulge) does not set a diameter.

For a convex heart mask the two numerators agree; the denominators differ when the lungs' lateral extremes lie
on different rows. :func:`measure_ctr` also returns where each diameter lies, for drawing.

A negative cardiomegaly pair needs ``CTR ≤ CTR_NEGATIVE_MAX``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
from scipy import ndimage

from cxrground.errors import MaskError
from cxrground.io.masks import as_mask, check_same_shape

__all__ = [
    "CTR_NEGATIVE_MAX",
    "ROW_WINDOW_FRACTION",
    "CtrMeasurement",
    "Diameter",
    "EmptyAnatomyError",
    "cardiothoracic_ratio",
    "ctr_negative_eligible",
    "internal_thoracic_diameter",
    "maximal_transverse_diameter",
    "measure_ctr",
    "robust_argmax",
    "robust_max",
    "row_window",
    "thoracic_diameter",
    "transverse_cardiac_diameter",
    "x_extent",
]

#: ILS.md §9.4: an image may give a cardiomegaly negative only when ``CTR ≤ 0.45`` (physician-calibrated).
CTR_NEGATIVE_MAX: Final[float] = 0.45
#: Running-median window of the robust maxima, as a fraction of the lungs' height (the window the heart
#: estimate uses on the lungs' medial borders, ``HeartEstimateParams.smooth_fraction``).
ROW_WINDOW_FRACTION: Final[float] = 0.02

Definition = Literal["extent", "radiological"]


class EmptyAnatomyError(MaskError):
    """An anatomy mask needed for a measurement (heart, lungs) has no pixels."""


def row_window(lung_height: float, fraction: float = ROW_WINDOW_FRACTION) -> int:
    """Odd number of rows of a running median: ``fraction`` of ``lung_height`` (rows), at least 3."""
    return max(3, round(fraction * lung_height)) | 1


def robust_argmax(values: np.ndarray, window: int) -> tuple[int, float]:
    """``(index, value)`` of the maximum of the running median (``window`` consecutive values, edges held) of
    a 1-D sequence; the index is the middle of the values reaching that maximum. With fewer values than the
    window, the median of all of them at the middle index; an empty sequence gives ``(-1, 0.0)``."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return -1, 0.0
    if window <= 1:
        k = int(np.argmax(v))
        return k, float(v[k])
    if v.size < window:
        return v.size // 2, float(np.median(v))
    smooth = ndimage.median_filter(v, size=window, mode="nearest")
    top = np.flatnonzero(smooth == smooth.max())
    k = int(top[top.size // 2])  # the middle of the widest stretch
    return k, float(smooth[k])


def robust_max(values: np.ndarray, window: int) -> float:
    """The value of :func:`robust_argmax`: the maximum of the running median over ``window`` values."""
    return robust_argmax(values, window)[1]


def _lung_height(lungs: np.ndarray) -> int:
    rows = np.flatnonzero(lungs.any(axis=1))
    return int(rows[-1] - rows[0] + 1) if rows.size else 0


@dataclass(frozen=True)
class Diameter:
    """A horizontal diameter: its ``length`` in pixels (a robust maximum, see :func:`robust_argmax`) and where
    to draw it, the row ``y`` where the running median peaks and that row's first and last columns."""

    length: float
    y: int
    x0: int
    x1: int

    def to_dict(self) -> dict[str, float | int]:
        """JSON-ready form."""
        return {"length": round(self.length, 1), "y": self.y, "x0": self.x0, "x1": self.x1}


_NO_DIAMETER: Final[Diameter] = Diameter(0.0, -1, -1, -1)


def _widest(ys: np.ndarray, x0: np.ndarray, x1: np.ndarray, window: int) -> Diameter:
    """The robust widest of the rows ``ys`` spanning ``x0..x1`` (inclusive)."""
    k, length = robust_argmax((x1 - x0 + 1).astype(np.float64), window)
    return _NO_DIAMETER if k < 0 else Diameter(length, int(ys[k]), int(x0[k]), int(x1[k]))


def transverse_cardiac_diameter(heart: np.ndarray, window: int = 1) -> Diameter:
    """The maximal transverse cardiac diameter: the widest row of the heart mask (first to last heart pixel,
    inclusive), as the maximum of a running median over ``window`` rows (1: the plain widest row)."""
    h = as_mask(heart, "heart mask")
    ys = np.flatnonzero(h.any(axis=1))
    if ys.size == 0:
        return _NO_DIAMETER
    first = np.argmax(h[ys], axis=1)
    last = h.shape[1] - 1 - np.argmax(h[ys][:, ::-1], axis=1)
    return _widest(ys, first, last, window)


def thoracic_diameter(right_lung: np.ndarray, left_lung: np.ndarray, window: int = 1) -> Diameter:
    """The maximal internal thoracic diameter: per row holding both lungs, the right lung's lateral edge to the
    left lung's lateral edge (inclusive), as the maximum of a running median over ``window`` rows."""
    r, lft = as_mask(right_lung, "right lung mask"), as_mask(left_lung, "left lung mask")
    ys = np.flatnonzero(r.any(axis=1) & lft.any(axis=1))
    if ys.size == 0:
        return _NO_DIAMETER
    x_r = np.argmax(r[ys], axis=1)  # lateral edge of the right lung (image left)
    x_l = lft.shape[1] - 1 - np.argmax(lft[ys][:, ::-1], axis=1)
    return _widest(ys, x_r, x_l, window)


def maximal_transverse_diameter(heart: np.ndarray, window: int = 1) -> float:
    """Length in pixels of :func:`transverse_cardiac_diameter` (0 for an empty mask)."""
    return transverse_cardiac_diameter(heart, window).length


def internal_thoracic_diameter(right_lung: np.ndarray, left_lung: np.ndarray, window: int = 1) -> float:
    """Length in pixels of :func:`thoracic_diameter` (0 when no row holds both lungs)."""
    return thoracic_diameter(right_lung, left_lung, window).length


def _checked(heart: np.ndarray, right_lung: np.ndarray, left_lung: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    h = as_mask(heart, "heart mask")
    r = as_mask(right_lung, "right lung mask")
    l_ = as_mask(left_lung, "left lung mask")
    check_same_shape(("heart mask", h), ("right lung mask", r), ("left lung mask", l_))
    if not h.any():
        raise EmptyAnatomyError("heart mask is empty; the cardiothoracic ratio is undefined")
    if not (r | l_).any():
        raise EmptyAnatomyError("both lung masks are empty; the cardiothoracic ratio is undefined")
    return h, r, l_


def x_extent(mask: np.ndarray) -> int:
    """Columns from the mask's leftmost to its rightmost pixel, inclusive (the mask must not be empty)."""
    cols = np.flatnonzero(np.asarray(mask, bool).any(axis=0))
    return int(cols[-1]) - int(cols[0]) + 1


@dataclass(frozen=True)
class CtrMeasurement:
    """A CTR with the two diameters it divides (pixels of the masks it was measured on)."""

    ctr: float
    definition: Definition
    cardiac: Diameter
    thoracic: Diameter

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"ctr": round(self.ctr, 4), "definition": self.definition, "cardiac": self.cardiac.to_dict(),
                "thoracic": self.thoracic.to_dict()}


def _extent(mask: np.ndarray, at: Diameter) -> Diameter:
    """The mask's horizontal extent as a diameter drawn on the row of ``at`` (the mask's middle row if none)."""
    cols = np.flatnonzero(mask.any(axis=0))
    y = at.y if at.y >= 0 else int(np.flatnonzero(mask.any(axis=1)).mean())
    return Diameter(float(cols[-1] - cols[0] + 1), y, int(cols[0]), int(cols[-1]))


def measure_ctr(heart: np.ndarray, right_lung: np.ndarray, left_lung: np.ndarray,
                definition: Definition = "extent") -> CtrMeasurement:
    """The CTR and the two diameters it divides.

    ``definition="extent"`` (ILS.md's proposed default, :func:`cardiothoracic_ratio`): the heart's horizontal
    extent over that of ``right ∪ left``; the diameters are drawn on the heart's widest row and on the widest
    row holding both lungs. ``"radiological"``: :func:`transverse_cardiac_diameter` over
    :func:`thoracic_diameter`, both robust maxima over :func:`row_window` rows of the lungs' height (the lungs'
    extent when no row holds both lungs). Raises :class:`EmptyAnatomyError` when the heart or both lungs are
    empty and :class:`~cxrground.errors.MaskShapeError` when the shapes differ.
    """
    h, r, l_ = _checked(heart, right_lung, left_lung)
    lungs = r | l_
    window = row_window(_lung_height(lungs)) if definition == "radiological" else 1
    cardiac = transverse_cardiac_diameter(h, window)
    chest = thoracic_diameter(r, l_, window)
    if definition == "extent":
        cardiac, chest = _extent(h, cardiac), _extent(lungs, chest)
    elif chest.length <= 0:
        chest = _extent(lungs, chest)
    return CtrMeasurement(cardiac.length / chest.length, definition, cardiac, chest)


def cardiothoracic_ratio(heart: np.ndarray, right_lung: np.ndarray, left_lung: np.ndarray) -> float:
    """Return the CTR: the heart's horizontal extent over the horizontal extent of ``right ∪ left`` (inclusive
    pixel extents; ILS.md's proposed default). :func:`measure_ctr` also gives the radiological definition.

    Raises :class:`EmptyAnatomyError` when the heart or both lungs are empty and
    :class:`~cxrground.errors.MaskShapeError` when the shapes differ.
    """
    h, r, l_ = _checked(heart, right_lung, left_lung)
    return x_extent(h) / x_extent(r | l_)


def ctr_negative_eligible(ctr: float) -> bool:
    """Return True when ``ctr ≤ CTR_NEGATIVE_MAX`` (the image may serve as a cardiomegaly negative)."""
    return ctr <= CTR_NEGATIVE_MAX
