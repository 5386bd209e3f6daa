"""How far is a film tilted in its own plane, and how to read it upright.

A film turned a few degrees (a patient leaning in bed, a film scanned or photographed askew) is read worse by a lung
U-Net trained on upright films. :func:`thorax_tilt` estimates the tilt from a first reading of the lungs: the turn
that makes the midline between their lateral edges (the rib cage) vertical. :func:`turn` turns a film or a mask
about its centre. The built-in segmenter's option ``deskew`` reads a film tilted by at least :data:`MIN_TILT`
upright and turns its masks back (``bench/records/film_tilt_preregistration.md``).

Angles are in degrees, in the sense of :func:`turn`: turning a film by ``thorax_tilt(...)`` makes it upright.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from scipy import ndimage

__all__ = ["MIN_TILT", "SEARCH", "lateral_tilt", "thorax_tilt", "turn"]

#: Smallest tilt (degrees) the option ``deskew`` corrects.
MIN_TILT: Final[float] = 3.0
#: The search range and step of :func:`lateral_tilt`.
SEARCH: Final[np.ndarray] = np.arange(-15.0, 15.0 + 1e-9, 1.0)
#: Grid the estimates are made on (longest side, pixels).
GRID: Final[int] = 256


def turn(array: np.ndarray, degrees: float, mask: bool = False) -> np.ndarray:
    """``array`` turned by ``degrees`` about its centre, same shape (anticlockwise as displayed for positive
    angles). A mask is turned by nearest pixel and stays boolean; a film bilinearly, its edges continued with the
    nearest pixel, in its own dtype."""
    if mask:
        return ndimage.rotate(np.asarray(array, dtype=np.uint8), degrees, reshape=False, order=0, mode="constant",
                              cval=0).astype(bool)
    out = ndimage.rotate(np.asarray(array, dtype=np.float32), degrees, reshape=False, order=1, mode="nearest")
    if np.issubdtype(array.dtype, np.integer):
        info = np.iinfo(array.dtype)
        out = np.clip(np.rint(out), info.min, info.max)
    return out.astype(array.dtype)


def _small(mask: np.ndarray) -> np.ndarray:
    """``mask`` strided down to a longest side of at most :data:`GRID`."""
    step = max(1, int(np.ceil(max(mask.shape) / GRID)))
    return np.asarray(mask, dtype=bool)[::step, ::step]


def _lateral_spread(r: np.ndarray, lft: np.ndarray) -> float | None:
    """SD of the midpoints between the lungs' lateral edges over the rows holding both; None under 5 rows."""
    both = np.flatnonzero(r.any(axis=1) & lft.any(axis=1))
    if both.size < 5:
        return None
    mids = [(np.flatnonzero(r[y]).min() + np.flatnonzero(lft[y]).max()) / 2.0 for y in both]
    return float(np.std(mids))


def lateral_tilt(right: np.ndarray, left: np.ndarray) -> float | None:
    """The turn (searched over :data:`SEARCH`) that makes the midpoints between the lungs' lateral edges most nearly
    one vertical line; None when no turn leaves 5 rows holding both lungs."""
    r, lft = _small(right), _small(left)
    best: tuple[float, float] | None = None
    for degrees in SEARCH:
        spread = _lateral_spread(turn(r, degrees, mask=True), turn(lft, degrees, mask=True))
        if spread is not None and (best is None or spread < best[0]):
            best = (spread, float(degrees))
    return None if best is None else best[1]


def thorax_tilt(right: np.ndarray, left: np.ndarray) -> float | None:
    """The film's tilt from its lungs: :func:`lateral_tilt`; None when it is undefined or at the end of the search
    range (the turn was not found inside it). The midline between the lungs' medial edges is no estimate: a lung
    U-Net draws the upper mediastinal edges nearly vertical on a turned film
    (``bench/records/film_tilt_preregistration.md``)."""
    lateral = lateral_tilt(right, left)
    if lateral is None or abs(lateral) >= float(np.abs(SEARCH).max()):
        return None
    return round(lateral, 2)
