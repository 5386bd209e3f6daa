"""CheXpercept item images (CHEXPERCEPT.md §10.1): plain CXR, cyan mask overlays and coloured points.

Every image is exactly the CXR's ``W×H``, 8-bit RGB, written as a PNG without text chunks or other metadata.
Overlays use :func:`cxrground.io.overlay.blend` (cyan, α 0.5). A point is a filled anti-aliased disc of radius
``15·s`` px in the point colour (opacity 1) plus a white ring of the same radius and line width ``2·s``
(at least 1 px), ``s = longest side / 1024`` (§0 scale rule). Anti-aliasing is the exact pixel coverage of a
disc / annulus approximated by ``clip(r + 0.5 − d, 0, 1)`` with ``d`` the distance of the pixel centre.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from cxrground.anatomy.scale import scale_length
from cxrground.io.overlay import blend
from cxrground.vocab.percept_templates import (
    MASK_ALPHA,
    MASK_RGB,
    POINT_RADIUS_AT_1024,
    POINT_RGB,
    POINT_RING_WIDTH,
)

__all__ = ["draw_points", "gray_rgb", "mask_overlay", "point_geometry", "write_png"]

_WHITE = (1.0, 1.0, 1.0)


def gray_rgb(pixels: np.ndarray) -> np.ndarray:
    """8-bit grey (or RGB) pixels as ``H×W×3`` uint8."""
    arr = np.asarray(pixels)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    return np.ascontiguousarray(arr.astype(np.uint8))


def mask_overlay(pixels: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The §10.1 cyan overlay (α 0.5) of ``mask`` on the CXR."""
    return blend(pixels, mask, MASK_RGB, MASK_ALPHA)


def point_geometry(shape: Sequence[int]) -> tuple[float, float]:
    """``(radius, ring width)`` in pixels for an image of ``shape`` (scale rule; ring ≥ 1 px)."""
    longest = max(int(shape[0]), int(shape[1]))
    return scale_length(POINT_RADIUS_AT_1024, longest), max(1.0, scale_length(POINT_RING_WIDTH, longest))


def _composite(out: np.ndarray, cover: np.ndarray, colour: Sequence[float], y0: int, x0: int) -> None:
    h, w = cover.shape
    patch = out[y0:y0 + h, x0:x0 + w]
    col = np.asarray(colour, dtype=np.float64).reshape(1, 1, 3)
    patch[:] = patch * (1.0 - cover[:, :, None]) + col * cover[:, :, None]


def draw_points(rgb: np.ndarray, points: Sequence[tuple[Sequence[int], str]]) -> np.ndarray:
    """Draw ``[((x, y), colour name), …]`` as filled discs with white rings; returns a new uint8 image."""
    out = np.asarray(rgb, dtype=np.float64) / 255.0
    h, w = out.shape[:2]
    radius, ring = point_geometry((h, w))
    reach = int(np.ceil(radius + ring / 2 + 1))
    for (x, y), colour in points:
        x0, x1 = max(0, int(x) - reach), min(w, int(x) + reach + 1)
        y0, y1 = max(0, int(y) - reach), min(h, int(y) + reach + 1)
        if x0 >= x1 or y0 >= y1:
            continue
        yy, xx = np.mgrid[y0:y1, x0:x1]
        d = np.hypot(xx - float(x), yy - float(y))
        disc = np.clip(radius + 0.5 - d, 0.0, 1.0)
        annulus = np.clip(ring / 2 + 0.5 - np.abs(d - radius), 0.0, 1.0)
        _composite(out, disc, POINT_RGB[colour], y0, x0)
        _composite(out, annulus, _WHITE, y0, x0)
    return np.clip(np.rint(out * 255.0), 0, 255).astype(np.uint8)


def write_png(path: str | Path, rgb: np.ndarray) -> Path:
    """Write ``H×W×3`` uint8 as an RGB PNG with no text chunks or metadata (deterministic bytes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.asarray(rgb)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"expected H×W×3 uint8, got {arr.shape} {arr.dtype}")
    Image.fromarray(arr, mode="RGB").save(path, format="PNG", optimize=False, compress_level=6)
    return path
