"""Small numeric helpers shared by the phantom and the lesion painters (float32 fields on the pixel grid)."""

from __future__ import annotations

import numpy as np
from PIL import Image
from scipy import ndimage


def grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column coordinate arrays, shapes ``(H, 1)`` and ``(1, W)`` (broadcastable, float32)."""
    yy = np.arange(height, dtype=np.float32)[:, None]
    xx = np.arange(width, dtype=np.float32)[None, :]
    return yy, xx


def soft_step(x: np.ndarray | float, edge: float) -> np.ndarray:
    """0 -> 1 transition at ``x = 0`` with half-width ``edge`` (tanh)."""
    return (0.5 * (1.0 + np.tanh(np.asarray(x, dtype=np.float32) / max(edge, 1e-6)))).astype(np.float32)


def smooth_noise(rng: np.random.Generator, shape: tuple[int, int], cell: float) -> np.ndarray:
    """Band-limited noise with feature size about ``cell`` pixels, zero mean and unit std (float32)."""
    h, w = shape
    gh = max(2, round(h / max(cell, 1.0))) + 3
    gw = max(2, round(w / max(cell, 1.0))) + 3
    coarse = rng.standard_normal((gh, gw)).astype(np.float32)
    # resize a slightly larger grid and crop the centre so the borders are not special
    size = (w + 2 * round(w / gw * 1.5), h + 2 * round(h / gh * 1.5))
    big = np.asarray(Image.fromarray(coarse).resize(size, Image.Resampling.BICUBIC), dtype=np.float32)
    oy = (big.shape[0] - h) // 2
    ox = (big.shape[1] - w) // 2
    out = big[oy : oy + h, ox : ox + w]
    std = float(out.std())
    return ((out - float(out.mean())) / (std if std > 1e-6 else 1.0)).astype(np.float32)


def blur(field: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur (float32); ``sigma <= 0`` returns a copy."""
    if sigma <= 0:
        return field.astype(np.float32, copy=True)
    return ndimage.gaussian_filter(field.astype(np.float32), sigma=sigma, mode="nearest")


def band_profile(dist: np.ndarray, cortex: float = 0.35) -> np.ndarray:
    """Cross-section of a bone band: 1 inside (``|dist| < 1``) with brighter edges (cortex), soft border."""
    a = np.abs(dist)
    inside = soft_step(1.0 - a, 0.12)
    return (inside * ((1.0 - cortex) + cortex * np.clip(a, 0.0, 1.0) ** 3)).astype(np.float32)


def curve_band(
    out: np.ndarray,
    xs: np.ndarray,
    ys: np.ndarray,
    half: np.ndarray,
    weight: np.ndarray | float,
    cortex: float = 0.35,
) -> None:
    """Add a band along the curve ``y = ys[i]`` at columns ``xs[i]`` (one y per column) to ``out``.

    ``half`` is the half thickness (pixels) per column, ``weight`` the peak value per column. The band
    is evaluated only in the rows it can reach.
    """
    h, w = out.shape
    xs = np.asarray(xs, dtype=np.int64)
    keep = (xs >= 0) & (xs < w)
    if not keep.any():
        return
    xs, ys = xs[keep], np.asarray(ys, dtype=np.float32)[keep]
    half = np.broadcast_to(np.asarray(half, dtype=np.float32), keep.shape)[keep]
    wt = np.broadcast_to(np.asarray(weight, dtype=np.float32), keep.shape)[keep]
    y0 = max(0, int(np.floor((ys - half).min())) - 2)
    y1 = min(h, int(np.ceil((ys + half).max())) + 3)
    if y1 <= y0:
        return
    rows = np.arange(y0, y1, dtype=np.float32)[:, None]
    dist = (rows - ys[None, :]) / np.maximum(half[None, :], 0.5)
    out[y0:y1, xs] += band_profile(dist, cortex) * wt[None, :]


def ellipse_radius(
    yy: np.ndarray,
    xx: np.ndarray,
    cy: float,
    cx: float,
    ry: float,
    rx: float,
    angle: float = 0.0,
) -> np.ndarray:
    """Normalised elliptical radius (1 on the ellipse border), rotated by ``angle`` radians."""
    c, s = np.cos(angle), np.sin(angle)
    dx = xx - cx
    dy = yy - cy
    u = (dx * c + dy * s) / max(rx, 1e-3)
    v = (-dx * s + dy * c) / max(ry, 1e-3)
    return np.sqrt(u * u + v * v).astype(np.float32)


def splat_polyline(out: np.ndarray, pts: np.ndarray, weights: np.ndarray) -> None:
    """Accumulate ``weights`` at the (y, x) points ``pts`` (bilinear splat) into ``out``."""
    h, w = out.shape
    y = pts[:, 0]
    x = pts[:, 1]
    keep = (y >= 0) & (y < h - 1) & (x >= 0) & (x < w - 1)
    y, x, wt = y[keep], x[keep], weights[keep]
    y0 = np.floor(y).astype(np.int64)
    x0 = np.floor(x).astype(np.int64)
    fy = (y - y0).astype(np.float32)
    fx = (x - x0).astype(np.float32)
    np.add.at(out, (y0, x0), wt * (1 - fy) * (1 - fx))
    np.add.at(out, (y0 + 1, x0), wt * fy * (1 - fx))
    np.add.at(out, (y0, x0 + 1), wt * (1 - fy) * fx)
    np.add.at(out, (y0 + 1, x0 + 1), wt * fy * fx)


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 8-connected component of ``mask`` (empty stays empty)."""
    if not mask.any():
        return mask.copy()
    labels, n = ndimage.label(mask, structure=np.ones((3, 3), dtype=bool))
    if n <= 1:
        return mask.copy()
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    return labels == int(np.argmax(sizes))
