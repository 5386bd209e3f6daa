"""Cardiothoracic ratio (ILS.md §9.4 proposed default) from HybridGNet heart and lung masks.

``CTR = (max_x(H) − min_x(H) + 1) / (max_x(Lr ∪ Ll) − min_x(Lr ∪ Ll) + 1)``: the heart's horizontal extent
over the extent of both lungs together, both in pixels and inclusive. A negative cardiomegaly pair needs
``CTR ≤ CTR_NEGATIVE_MAX``.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from cxrground.errors import MaskError
from cxrground.io.masks import as_mask, check_same_shape

__all__ = ["CTR_NEGATIVE_MAX", "EmptyAnatomyError", "cardiothoracic_ratio", "ctr_negative_eligible"]

#: ILS.md §9.4: an image may give a cardiomegaly negative only when ``CTR ≤ 0.45`` (physician-calibrated).
CTR_NEGATIVE_MAX: Final[float] = 0.45


class EmptyAnatomyError(MaskError):
    """An anatomy mask needed for a measurement (heart, lungs) has no pixels."""


def _x_extent(mask: np.ndarray) -> int:
    cols = np.flatnonzero(mask.any(axis=0))
    return int(cols[-1]) - int(cols[0]) + 1


def cardiothoracic_ratio(heart: np.ndarray, right_lung: np.ndarray, left_lung: np.ndarray) -> float:
    """Return the CTR: heart width over the width of ``right ∪ left`` lungs (inclusive pixel extents).

    Raises :class:`EmptyAnatomyError` when the heart or both lungs are empty and
    :class:`~cxrground.errors.MaskShapeError` when the shapes differ.
    """
    h = as_mask(heart, "heart mask")
    r = as_mask(right_lung, "right lung mask")
    l_ = as_mask(left_lung, "left lung mask")
    check_same_shape(("heart mask", h), ("right lung mask", r), ("left lung mask", l_))
    if not h.any():
        raise EmptyAnatomyError("heart mask is empty; the cardiothoracic ratio is undefined")
    lungs = r | l_
    if not lungs.any():
        raise EmptyAnatomyError("both lung masks are empty; the cardiothoracic ratio is undefined")
    return _x_extent(h) / _x_extent(lungs)


def ctr_negative_eligible(ctr: float) -> bool:
    """Return True when ``ctr ≤ CTR_NEGATIVE_MAX`` (the image may serve as a cardiomegaly negative)."""
    return ctr <= CTR_NEGATIVE_MAX
