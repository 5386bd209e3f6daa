"""CheXpercept mask refinement, the non-SAM fallback of CHEXPERCEPT.md §6 (the "optimal" mask).

Per 8-connected component of the accepted candidate with ≥ 1000 px (@1024), largest first (ids 0, 1, …;
size ties in raster order of the first pixel): fill holes, closing then opening with a 15 px disc (@1024),
drop pieces < 1000 px (@1024) and OR-merge the rest into ``optimal_component_{id}``; a component left empty
is dropped and the ids stay consecutive. Each component also records the §6 refinement prompts of the SAM
path: its seed (the rounded centroid if inside, else the grid point nearest to it, else the component pixel
nearest to it) then the other 64 px lattice points (@1024) inside it, all with label 1.

Choices: the lattice holds the cell centres ``(step/2 + i·step)`` rounded down; morphology with a disc of
diameter ``k`` uses the Euclidean distance transform (a pixel is within the disc when its distance is
``≤ k/2``); iterating a disc of radius ``r`` ``n`` times equals one disc of radius ``n·r`` (Minkowski sums of
discs), which is how the ellipse-kernel iterations of §7 and §9 are applied. The backend name recorded for
the card is :data:`REFINEMENT_BACKEND`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np
from scipy import ndimage

from cxrground.io.masks import as_mask
from cxrground.percept.config import DeformConfig, ScaledDeform

__all__ = [
    "REFINEMENT_BACKEND",
    "Point",
    "RefinedComponent",
    "Refinement",
    "bounding_box",
    "clean_mask",
    "components_by_size",
    "disc_close",
    "disc_dilate",
    "disc_erode",
    "disc_open",
    "drop_small",
    "external_contour",
    "fill_holes",
    "lattice_points",
    "refine_mask",
    "seed_point",
]

#: The name of this refinement in the card and the provenance (§6: the fallback MUST be named).
REFINEMENT_BACKEND: Final[str] = "morphological (CHEXPERCEPT.md §6 non-SAM fallback)"

#: A point ``(x, y)`` in native pixels.
Point = tuple[int, int]

_EIGHT: Final[np.ndarray] = np.ones((3, 3), dtype=bool)


# --- morphology ------------------------------------------------------------------------------------

def bounding_box(mask: np.ndarray, pad: float = 0) -> tuple[slice, slice] | None:
    """Return the bounding box of ``mask`` grown by ``pad`` px and clipped to the image, or None if empty."""
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return None
    cols = np.flatnonzero(mask.any(axis=0))
    p = int(np.ceil(pad))
    h, w = mask.shape
    return (
        slice(max(0, int(rows[0]) - p), min(h, int(rows[-1]) + p + 1)),
        slice(max(0, int(cols[0]) - p), min(w, int(cols[-1]) + p + 1)),
    )


def _in_box(mask: np.ndarray, pad: float, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Apply ``fn`` to the padded bounding-box crop of ``mask`` only (everything else stays False)."""
    box = bounding_box(mask, pad)
    out = np.zeros(mask.shape, dtype=bool)
    if box is not None:
        out[box] = fn(mask[box])
    return out


def disc_dilate(mask: np.ndarray, radius: float) -> np.ndarray:
    """Return ``mask`` dilated by the Euclidean disc of ``radius`` px (empty stays empty)."""
    if radius <= 0:
        return mask.copy()
    return _in_box(mask, radius + 1, lambda m: ndimage.distance_transform_edt(~m) <= radius)


def disc_erode(mask: np.ndarray, radius: float) -> np.ndarray:
    """Return ``mask`` eroded by the Euclidean disc of ``radius`` px (the image border is not background)."""
    if radius <= 0 or mask.all():
        return mask.copy()
    return _in_box(mask, 1, lambda m: ndimage.distance_transform_edt(m) > radius)


def disc_close(mask: np.ndarray, diameter: float) -> np.ndarray:
    """Return the closing of ``mask`` with a disc of ``diameter`` px."""
    return disc_erode(disc_dilate(mask, diameter / 2.0), diameter / 2.0)


def disc_open(mask: np.ndarray, diameter: float) -> np.ndarray:
    """Return the opening of ``mask`` with a disc of ``diameter`` px."""
    return disc_dilate(disc_erode(mask, diameter / 2.0), diameter / 2.0)


def fill_holes(mask: np.ndarray) -> np.ndarray:
    """Return ``mask`` with its holes filled."""
    return _in_box(mask, 1, ndimage.binary_fill_holes)


def external_contour(mask: np.ndarray) -> np.ndarray:
    """Return the outer boundary pixels of ``mask`` (holes filled first; 8-connected inner erosion)."""

    def contour(m: np.ndarray) -> np.ndarray:
        filled = ndimage.binary_fill_holes(m)
        return filled & ~ndimage.binary_erosion(filled, structure=_EIGHT, border_value=0)

    return _in_box(mask, 1, contour)


# --- components ------------------------------------------------------------------------------------

def components_by_size(mask: np.ndarray, min_area: float = 0.0) -> list[np.ndarray]:
    """Return the 8-connected components of ``mask`` with ``≥ min_area`` px, largest first (ties: raster
    order of their first pixel)."""
    labels, n = ndimage.label(mask, structure=_EIGHT)
    if n == 0:
        return []
    sizes = np.bincount(labels.ravel(), minlength=n + 1)
    order = sorted(range(1, n + 1), key=lambda lab: -int(sizes[lab]))  # stable: label order = raster order
    return [labels == lab for lab in order if sizes[lab] >= min_area]


def drop_small(mask: np.ndarray, min_area: float) -> np.ndarray:
    """Return ``mask`` without its 8-connected pieces of fewer than ``min_area`` px."""
    labels, n = ndimage.label(mask, structure=_EIGHT)
    if n == 0:
        return mask.copy()
    sizes = np.bincount(labels.ravel(), minlength=n + 1)
    keep = sizes >= min_area
    keep[0] = False
    return keep[labels]


def clean_mask(mask: np.ndarray, scale: ScaledDeform) -> np.ndarray:
    """Return the §6 clean-up of one mask: holes filled, closing then opening (disc), small pieces dropped."""
    m = fill_holes(as_mask(mask))
    m = disc_close(m, scale.refine_kernel)
    m = disc_open(m, scale.refine_kernel)
    return drop_small(m, scale.min_area)


# --- refinement points -----------------------------------------------------------------------------

def lattice_points(mask: np.ndarray, step: float) -> list[Point]:
    """Return the lattice points ``(x, y)`` (cell centres of a ``step`` px grid) inside ``mask``, raster order."""
    h, w = mask.shape
    ys = np.unique(np.floor(np.arange(step / 2.0, h, step)).astype(int))
    xs = np.unique(np.floor(np.arange(step / 2.0, w, step)).astype(int))
    return [(int(x), int(y)) for y in ys for x in xs if mask[y, x]]


def seed_point(component: np.ndarray, grid: list[Point]) -> Point:
    """Return the §6 seed: the rounded centroid if inside, else the nearest grid point, else the nearest pixel."""
    ys, xs = np.nonzero(component)
    if ys.size == 0:
        raise ValueError("cannot seed an empty component")
    cx, cy = int(np.rint(xs.mean())), int(np.rint(ys.mean()))
    if component[cy, cx]:
        return (cx, cy)
    if grid:
        d = [(x - cx) ** 2 + (y - cy) ** 2 for x, y in grid]
        return grid[int(np.argmin(d))]
    i = int(np.argmin((xs - cx) ** 2 + (ys - cy) ** 2))
    return (int(xs[i]), int(ys[i]))


@dataclass(frozen=True, eq=False)
class RefinedComponent:
    """One optimal component: id, native bool mask, refinement prompts (seed first, label 1) and the
    low-resolution logits of a SAM refinement (None for the morphological fallback)."""

    id: int
    mask: np.ndarray
    points: tuple[Point, ...]
    labels: tuple[int, ...]
    logits: np.ndarray | None = None

    @property
    def name(self) -> str:
        """Return ``optimal_component_{id}``."""
        return f"optimal_component_{self.id}"


@dataclass(frozen=True, eq=False)
class Refinement:
    """The §6 artefacts: components in id order and their union, the optimal mask."""

    components: tuple[RefinedComponent, ...]
    optimal: np.ndarray
    backend: str = field(default=REFINEMENT_BACKEND)


def refine_mask(mask: np.ndarray, config: DeformConfig | None = None) -> Refinement:
    """Return the §6 refinement (non-SAM fallback) of an accepted candidate mask (native bool H×W)."""
    m = as_mask(mask, "candidate mask")
    scale = (config or DeformConfig()).scaled(m.shape)
    out: list[RefinedComponent] = []
    for comp in components_by_size(m, scale.min_area):
        cleaned = clean_mask(comp, scale)
        if not cleaned.any():
            continue
        grid = lattice_points(cleaned, scale.grid_step)
        seed = seed_point(cleaned, grid)
        points = (seed, *[p for p in grid if p != seed])
        out.append(RefinedComponent(id=len(out), mask=cleaned, points=points, labels=(1,) * len(points)))
    optimal = np.zeros_like(m)
    for comp_rec in out:
        optimal |= comp_rec.mask
    return Refinement(components=tuple(out), optimal=optimal)
