"""ILS location-label masks from right/left lung masks (ILS.md §3.1 built-in geometry).

Rows of a lung span ``y0..y1`` with ``h = y1 - y0``:
apical ``y <= y0 + 0.22 h`` (inside the upper zone), upper ``y <= y0 + h/3``,
mid ``y0 + h/3 < y <= y0 + 2h/3``, base ``y > y0 + 2h/3``.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from cxrground.io.masks import as_mask, check_same_shape
from cxrground.vocab.locations import SIDES, lung_label, zone_label

APICAL_FRACTION: Final[float] = 0.22
UPPER_FRACTION: Final[float] = 1.0 / 3.0
MID_FRACTION: Final[float] = 2.0 / 3.0


def lung_zone_bands(lung: np.ndarray) -> dict[str, np.ndarray]:
    """Zone masks of one lung keyed by ILS zone word (``apical zone lung`` ... ``lung base``)."""
    lung = as_mask(lung, "lung mask")
    rows = np.flatnonzero(lung.any(axis=1))
    empty = np.zeros_like(lung)
    if rows.size == 0:
        return {z: empty.copy() for z in ("apical zone lung", "upper zone lung", "mid zone lung", "lung base")}
    y0, y1 = int(rows[0]), int(rows[-1])
    h = y1 - y0
    y = np.arange(lung.shape[0])
    bounds = {"apical zone lung": (y <= y0 + APICAL_FRACTION * h),
              "upper zone lung": (y <= y0 + UPPER_FRACTION * h),
              "mid zone lung": (y > y0 + UPPER_FRACTION * h) & (y <= y0 + MID_FRACTION * h),
              "lung base": (y > y0 + MID_FRACTION * h)}
    out = {}
    for zone, in_rows in bounds.items():  # copy the band's rows only (fast on large images)
        band = np.zeros_like(lung)
        sel = np.flatnonzero(in_rows)
        if sel.size:
            band[sel[0] : sel[-1] + 1] = lung[sel[0] : sel[-1] + 1]
        out[zone] = band
    return out


def ils_location_masks(right_lung: np.ndarray, left_lung: np.ndarray) -> dict[str, np.ndarray]:
    """Masks of the ten ILS location labels plus ``lung`` (both lungs), keyed by label text."""
    right = as_mask(right_lung, "right lung mask")
    left = as_mask(left_lung, "left lung mask")
    check_same_shape(("right lung mask", right), ("left lung mask", left))
    out: dict[str, np.ndarray] = {}
    for side, lung in zip(SIDES, (right, left), strict=True):
        out[lung_label(side)] = lung.copy()
        for zone, band in lung_zone_bands(lung).items():
            out[zone_label(side, zone)] = band
    out["lung"] = right | left
    return out


def location_union(masks: dict[str, np.ndarray], labels: list[str] | tuple[str, ...]) -> np.ndarray:
    """OR of the masks of ``labels``; an unknown label is a ``KeyError`` naming it."""
    if not labels:
        raise ValueError("no labels given")
    missing = [lab for lab in labels if lab not in masks]
    if missing:
        raise KeyError(f"no anatomy mask for location label(s) {missing}")
    out = np.zeros_like(next(iter(masks.values())), dtype=bool)
    for lab in labels:
        out |= masks[lab]
    return out
