"""Small builders for hand-made masks used by several test files."""

from __future__ import annotations

import numpy as np


def rect(shape: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
    """Bool mask with the inclusive row and column ranges set."""
    m = np.zeros(shape, dtype=bool)
    m[rows[0] : rows[1] + 1, cols[0] : cols[1] + 1] = True
    return m


#: Size of :func:`toy_lungs`.
TOY_H, TOY_W = 120, 140


def toy_lungs() -> tuple[np.ndarray, np.ndarray]:
    """Two rounded lungs on a TOY_H × TOY_W grid with a mediastinum gap (right lung = image left)."""
    yy, xx = np.mgrid[:TOY_H, :TOY_W]
    right = ((xx - 38) / 26.0) ** 2 + ((yy - 62) / 48.0) ** 4 <= 1.0
    left = ((xx - 102) / 26.0) ** 2 + ((yy - 62) / 48.0) ** 4 <= 1.0
    return right, left


def rows_of(mask: np.ndarray) -> list[int]:
    """Indices of the rows that contain any foreground pixel."""
    return [int(r) for r in np.flatnonzero(mask.any(axis=1))]


def blank_image(path):
    """Write an 8×8 black image (PNG or JPEG by suffix) and return its path."""
    from cxrground.io.image import write_image

    return write_image(path, np.zeros((8, 8), np.uint8))
