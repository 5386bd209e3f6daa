"""The CPU deformer of CHEXPERCEPT.md §7.3 (non-SAM paragraph).

Expansion: for each expansion point ``p`` the geodesic corridor from the mask to ``p`` inside
``anatomy region ∪ mask ∪ disc(p)`` is added together with ``disc(p)`` (radius ``builtin_disc``, 16 px @1024,
spec ≥ 8), then the result is closed (the §6 disc). The corridor is the set of pixels ``q`` with
``g_mask(q) + g_p(q) ≤ g_mask(p) + 2·radius`` (``g`` = geodesic step distances, alternating 4/8-neighbour
steps); when ``p`` cannot be reached inside that set the straight band of the same radius from the nearest
mask pixel is used. Contraction: for each contraction point a disc whose radius is the point's distance to
the background plus ``builtin_contraction_margin`` (8 px @1024) is removed, so the notch reaches the
contour, then the mask is opened (the §6 disc). Finally the §6 clean-up. Changes stay within the
corridors and discs, i.e. local to the anatomy. The caller checks the validity rule.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from cxrground.io.masks import as_mask
from cxrground.percept.config import DeformConfig, ScaledDeform
from cxrground.percept.deform.base import Deformer, DeformRequest, DeformResult
from cxrground.percept.refine import Point, clean_mask, disc_close, disc_open

__all__ = ["BuiltinDeformer", "geodesic_steps", "grow_toward"]

def geodesic_steps(seed: np.ndarray, allowed: np.ndarray, limit: int) -> np.ndarray:
    """Return the geodesic step distance from ``seed`` inside ``allowed`` (inf beyond ``limit`` steps).

    Step ``k`` adds the pixels of ``allowed`` next to those already reached: 8-neighbours on odd steps,
    4-neighbours on even ones. Seed pixels are at distance 0 whether or not they are allowed.
    """
    h, w = seed.shape
    width = w + 2
    ok = np.zeros((h + 2, width), dtype=bool)
    ok[1:-1, 1:-1] = allowed
    reached = np.zeros((h + 2, width), dtype=bool)
    reached[1:-1, 1:-1] = seed
    ok, reached = ok.ravel(), reached.ravel()
    dist = np.full(reached.shape, np.inf)
    dist[reached] = 0
    cross = np.array([-1, 1, -width, width])
    diagonal = np.array([-width - 1, -width + 1, width - 1, width + 1])
    front = np.flatnonzero(reached)
    before = np.empty(0, dtype=np.intp)
    for k in range(1, limit + 1):
        # Pixels reached two or more steps ago have met both neighbourhoods, except the diagonals of those
        # reached two steps ago after a 4-neighbour step: an 8-neighbour step takes those too.
        if k % 2:
            cand = np.concatenate([(front[:, None] + np.concatenate([cross, diagonal])).ravel(),
                                   (before[:, None] + diagonal).ravel()])
        else:
            cand = (front[:, None] + cross).ravel()
        cand = cand[ok[cand] & ~reached[cand]]
        if cand.size == 0:
            break
        cand = np.unique(cand)
        reached[cand] = True
        dist[cand] = k
        before, front = front, cand
    return dist.reshape(h + 2, width)[1:-1, 1:-1]


def _disc(shape: tuple[int, int], center: tuple[float, float], radius: float, origin=(0, 0)) -> np.ndarray:
    yy, xx = np.ogrid[origin[0] : origin[0] + shape[0], origin[1] : origin[1] + shape[1]]
    return (xx - center[0]) ** 2 + (yy - center[1]) ** 2 <= radius**2


def _band(shape, origin, a: tuple[float, float], b: tuple[float, float], radius: float) -> np.ndarray:
    yy, xx = np.mgrid[origin[0] : origin[0] + shape[0], origin[1] : origin[1] + shape[1]]
    ax, ay = a
    dx, dy = b[0] - ax, b[1] - ay
    den = dx * dx + dy * dy
    t = np.clip(((xx - ax) * dx + (yy - ay) * dy) / den, 0.0, 1.0) if den > 0 else np.zeros(xx.shape)
    return (xx - (ax + t * dx)) ** 2 + (yy - (ay + t * dy)) ** 2 <= radius**2


def _distance_to(mask_yx: np.ndarray, x: int, y: int) -> float:
    """Return the Euclidean distance from pixel ``(x, y)`` to the nearest of ``mask_yx`` (N×2 row, column)."""
    d2 = (mask_yx[:, 0] - y) ** 2 + (mask_yx[:, 1] - x) ** 2
    return float(np.sqrt(np.float64(d2.min())))


def grow_toward(
    mask: np.ndarray,
    region: np.ndarray,
    point: Point,
    scale: ScaledDeform,
    mask_yx: np.ndarray | None = None,
) -> np.ndarray:
    """Return the region grown from ``mask`` toward ``point`` (corridor ∪ point disc; see the module doc).

    ``mask_yx`` = ``np.argwhere(mask)`` if known. The straight band of an unreachable point starts at the mask
    pixel ``distance_transform_edt(~mask, return_indices=True)`` names.
    """
    x, y = int(point[0]), int(point[1])
    if mask_yx is None:
        mask_yx = np.argwhere(mask)
    if mask_yx.size == 0:
        raise ValueError("cannot grow an empty mask")
    r = scale.builtin_disc
    d_e = 0.0 if mask[y, x] else _distance_to(mask_yx, x, y)
    h, w = mask.shape
    half = int(np.ceil(d_e + 2 * r + 2))
    y0, y1, x0, x1 = max(0, y - half), min(h, y + half + 1), max(0, x - half), min(w, x + half + 1)
    crop = (slice(y0, y1), slice(x0, x1))
    cshape = (y1 - y0, x1 - x0)
    pdisc = _disc(cshape, (x, y), r, (y0, x0))
    out = np.zeros_like(mask)
    if d_e == 0:
        out[crop] = pdisc
        return out
    m = mask[crop]
    allowed = region[crop] | m | pdisc
    limit = int(np.ceil(1.5 * d_e + 2 * r + 4))
    g_m = geodesic_steps(m, allowed, limit)
    seed = np.zeros(cshape, dtype=bool)
    seed[y - y0, x - x0] = True
    g_p = geodesic_steps(seed, allowed, limit)
    reach = g_m[y - y0, x - x0]
    if np.isfinite(reach):
        corridor = (g_m + g_p) <= reach + 2 * r
    else:
        idx = ndimage.distance_transform_edt(~mask, return_distances=False, return_indices=True)
        ny, nx = int(idx[0][y, x]), int(idx[1][y, x])
        corridor = _band(cshape, (y0, x0), (nx, ny), (x, y), r)
    out[crop] = corridor | pdisc
    return out


class BuiltinDeformer(Deformer):
    """The §7.3 non-SAM deformer (CPU, deterministic; ``rng`` and ``prev_logits`` are not used)."""

    name = "builtin"

    def __init__(self, config: DeformConfig | None = None) -> None:
        self.config = config or DeformConfig()

    def apply(self, request: DeformRequest) -> DeformResult:
        """Return the deformed and §6-cleaned mask (no logits)."""
        m = as_mask(request.mask, "mask to deform").copy()
        region = as_mask(request.anatomy_region, "anatomy region")
        expansion_points, contraction_points = request.expansion_points, request.contraction_points
        scale = self.config.scaled(m.shape)
        if expansion_points and m.any():
            mask_yx = np.argwhere(m)
            grown = np.zeros_like(m)
            for p in expansion_points:
                grown |= grow_toward(m, region, p, scale, mask_yx)
            m = disc_close(m | grown, scale.refine_kernel)
        if contraction_points and m.any():
            inside = ndimage.distance_transform_edt(m)
            h, w = m.shape
            for x, y in contraction_points:
                if not (0 <= y < h and 0 <= x < w):
                    continue
                rad = float(inside[y, x]) + scale.builtin_contraction_margin
                k = int(np.ceil(rad)) + 1
                y0, y1, x0, x1 = max(0, y - k), min(h, y + k + 1), max(0, x - k), min(w, x + k + 1)
                m[y0:y1, x0:x1] &= ~_disc((y1 - y0, x1 - x0), (x, y), rad, (y0, x0))
            m = disc_open(m, scale.refine_kernel)
        return DeformResult(mask=clean_mask(m, scale), logits=None)
