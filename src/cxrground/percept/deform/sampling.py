"""Deformation point sampling of CHEXPERCEPT.md §7.1 (anatomy and operation) and §7.2 (points).

Choices where the spec is silent:

* §7.1 overrides are applied in the listed order, each later one winning: region ratio ``≥ 0.75`` →
  contraction, ``≤ 0.5`` → expansion, same-side lung ratio ``≥ 0.7`` → contraction. A lung-base zone also
  accepts an overlapping costophrenic angle of its own side only (``cpa_same_side``; False = the
  reference, either side). An anatomy already picked for another zone is not picked twice.
* §7.2 the widths are drawn anew on every try; depth ``ℓ ≥ 2`` generalises the depth-2 rule: ``w_ℓ`` is uniform
  in ``[2, w_{ℓ−1} − 1]`` (2 when ``w_{ℓ−1} = 2``), ``w_ℓ`` of the level-``ℓ−1`` points are drawn and each
  takes the nearest unused level-``ℓ`` candidate. Distance ties go to the first candidate in raster order.
* Every point keeps ``point_margin`` px (the §10.1 disc radius plus half its ring, scaled) from the film's border
  (:func:`inside_film`), so that its whole disc is drawn: a mask reaching the border gets no point there.
* Contours are :func:`~cxrground.percept.refine.external_contour` of the mask dilated (eroded) by
  ``iterations × kernel/2`` px (iterated ellipse = one disc of the summed radius).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cxrground.anatomy.overlap import ComponentOverlap
from cxrground.anatomy.percept_regions import PERCEPT_ZONE_NAMES, SUBREGION_NAMES, cpa_name
from cxrground.percept.config import DeformConfig, ScaledDeform
from cxrground.percept.refine import Point, disc_dilate, disc_erode, external_contour
from cxrground.vocab.traits import traits

__all__ = [
    "CONTRACTION",
    "EXPANSION",
    "OPERATIONS",
    "AnatomyChoice",
    "AnatomyPoints",
    "candidate_pixels",
    "choose_anatomies",
    "contour_at",
    "contour_pixels",
    "draw_widths",
    "inside_film",
    "min_distance",
    "operation_for",
    "opposite",
    "sample_anatomy",
    "sample_levels",
    "side_of",
]

EXPANSION = "expansion"
CONTRACTION = "contraction"
OPERATIONS = (EXPANSION, CONTRACTION)


def opposite(operation: str) -> str:
    """Return the other operation."""
    return CONTRACTION if operation == EXPANSION else EXPANSION


def side_of(anatomy: str) -> str:
    """Return the side word (``right``/``left``) an anatomy name starts with."""
    return anatomy.split(" ", 1)[0]


@dataclass(frozen=True)
class AnatomyChoice:
    """One §7.1 pick: anatomy name, operation and the covered fraction of that anatomy."""

    anatomy: str
    operation: str
    ratio: float


@dataclass(frozen=True)
class AnatomyPoints:
    """The §7.2 points of one anatomy: per depth level (level 1 first) with the drawn widths."""

    anatomy: str
    operation: str
    depth: int
    widths: tuple[int, ...]
    levels: tuple[tuple[Point, ...], ...]

    @property
    def points(self) -> list[Point]:
        """Return all points, level 1 first."""
        return [p for level in self.levels for p in level]


# --- §7.1 ------------------------------------------------------------------------------------------

def operation_for(coin_expansion: bool, region_ratio: float, lung_ratio: float, config: DeformConfig) -> str:
    """Return the §7.1 operation: the coin, then the three overrides in order (the last matching wins)."""
    op = EXPANSION if coin_expansion else CONTRACTION
    if region_ratio >= config.region_contract_min:
        op = CONTRACTION
    if region_ratio <= config.region_expand_max:
        op = EXPANSION
    if lung_ratio >= config.lung_contract_min:
        op = CONTRACTION
    return op


def _zone_candidates(overlap: ComponentOverlap, zone: str, config: DeformConfig) -> list[str]:
    regions = overlap.lung_regions or {}
    names = [n for n in SUBREGION_NAMES if " & " in n and n.endswith(zone) and regions[n].has_overlap]
    if zone.endswith("lung base"):
        sides = [side_of(zone)] if config.cpa_same_side else ["right", "left"]
        names += [cpa_name(s) for s in sides if regions[cpa_name(s)].has_overlap]
    return names


def choose_anatomies(
    overlap: ComponentOverlap, lesion: str, rng: np.random.Generator, config: DeformConfig
) -> list[AnatomyChoice]:
    """Return the §7.1 anatomies and operations of one component (zone order for lung lesions)."""
    if traits(lesion).percept.deform == "organ":
        zones = [z for z in PERCEPT_ZONE_NAMES if overlap.zones[z].has_overlap]
        n = int(rng.integers(1, config.cardiomegaly_max_zones + 1))
        if len(zones) > n:
            picked = sorted(int(i) for i in rng.choice(len(zones), size=n, replace=False))
            zones = [zones[i] for i in picked]
        return [
            AnatomyChoice(z, EXPANSION if rng.random() < 0.5 else CONTRACTION, overlap.zones[z].ratio) for z in zones
        ]
    out: list[AnatomyChoice] = []
    used: set[str] = set()
    regions = overlap.lung_regions or {}
    for zone in PERCEPT_ZONE_NAMES:
        if not overlap.zones[zone].has_overlap:
            continue
        cands = [n for n in _zone_candidates(overlap, zone, config) if n not in used]
        if not cands:
            continue
        ops = [
            operation_for(bool(rng.random() < 0.5), regions[n].ratio, overlap.lung(side_of(n)).ratio, config)
            for n in cands
        ]
        i = int(rng.integers(len(cands)))
        used.add(cands[i])
        out.append(AnatomyChoice(cands[i], ops[i], regions[cands[i]].ratio))
    return out


# --- §7.2 ------------------------------------------------------------------------------------------

def contour_at(mask: np.ndarray, operation: str, iterations: float, scale: ScaledDeform) -> np.ndarray:
    """Return the external contour of ``mask`` dilated (expansion) or eroded (contraction) by ``iterations``
    iterations of the ``kernel`` ellipse."""
    radius = iterations * scale.kernel_radius
    moved = disc_dilate(mask, radius) if operation == EXPANSION else disc_erode(mask, radius)
    return external_contour(moved)


def min_distance(xs: np.ndarray, ys: np.ndarray, points: Sequence[Point]) -> np.ndarray:
    """Return, per pixel ``(xs[i], ys[i])``, the Euclidean distance to the nearest of ``points`` (inf if none)."""
    out = np.full(xs.shape, np.inf)
    for px, py in points:
        out = np.minimum(out, np.hypot(xs - px, ys - py))
    return out


def contour_pixels(
    mask: np.ndarray, operation: str, iterations: float, scale: ScaledDeform, cache: dict | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(xs, ys)`` of :func:`contour_at`; ``cache`` (one per mask) keeps them per operation and depth."""
    key = (operation, float(iterations))
    if cache is not None and key in cache:
        return cache[key]
    ys, xs = np.nonzero(contour_at(mask, operation, iterations, scale))
    if cache is not None:
        cache[key] = (xs, ys)
    return xs, ys


def inside_film(xs: np.ndarray, ys: np.ndarray, shape: Sequence[int], margin: int) -> np.ndarray:
    """Return, per pixel ``(xs[i], ys[i])``, whether it lies at least ``margin`` px inside a film of ``shape``
    ``(H, W)``: a point disc drawn there stays whole on the film."""
    h, w = int(shape[0]), int(shape[1])
    return (xs >= margin) & (xs <= w - 1 - margin) & (ys >= margin) & (ys <= h - 1 - margin)


def candidate_pixels(
    xs: np.ndarray, ys: np.ndarray, region: np.ndarray, avoid: Sequence[Point], avoid_dist: float
) -> tuple[np.ndarray, np.ndarray]:
    """Return the pixels ``(xs, ys)`` inside ``region`` at ``≥ avoid_dist`` from every ``avoid`` point."""
    inside = region[ys, xs]
    xs, ys = xs[inside], ys[inside]
    if avoid and xs.size:
        ok = min_distance(xs, ys, avoid) >= avoid_dist
        xs, ys = xs[ok], ys[ok]
    return xs, ys


def draw_widths(depth: int, rng: np.random.Generator, choices: Sequence[int]) -> tuple[int, ...]:
    """Return ``(w1, …, w_depth)``: ``w1`` from ``choices``, then ``w_ℓ ~ U[2, w_{ℓ−1} − 1]`` (2 if that is 2)."""
    widths = [int(choices[int(rng.integers(len(choices)))])]
    for _ in range(1, depth):
        prev = widths[-1]
        widths.append(2 if prev <= 2 else int(rng.integers(2, prev)))
    return tuple(widths)


def _first_level(xs: np.ndarray, ys: np.ndarray, width: int, spacing: float, rng: np.random.Generator):
    if xs.size == 0:
        return None
    i0 = int(rng.integers(xs.size))
    chosen = [(int(xs[i0]), int(ys[i0]))]
    d_first = np.hypot(xs - xs[i0], ys - ys[i0])
    while len(chosen) < width:
        ok = min_distance(xs, ys, chosen) >= spacing
        if not ok.any():
            return None
        j = int(np.flatnonzero(ok)[np.argmin(d_first[ok])])
        chosen.append((int(xs[j]), int(ys[j])))
    return chosen


def sample_levels(
    mask: np.ndarray,
    region: np.ndarray,
    operation: str,
    widths: Sequence[int],
    rng: np.random.Generator,
    scale: ScaledDeform,
    avoid: Sequence[Point],
    avoid_dist: float,
    iterations_per_depth: float,
    cache: dict | None = None,
) -> tuple[tuple[Point, ...], ...] | None:
    """Return one try of §7.2 points (one tuple per depth level), or None when a level falls short."""
    levels: list[list[Point]] = []
    for level, width in enumerate(widths, start=1):
        cx, cy = contour_pixels(mask, operation, iterations_per_depth * level, scale, cache)
        whole = inside_film(cx, cy, mask.shape, scale.point_margin)
        xs, ys = candidate_pixels(cx[whole], cy[whole], region, avoid, avoid_dist)
        if level == 1:
            first = _first_level(xs, ys, width, scale.point_spacing, rng)
            if first is None:
                return None
            levels.append(first)
            continue
        prev = levels[-1]
        picks = sorted(int(i) for i in rng.choice(len(prev), size=min(width, len(prev)), replace=False))
        used = np.zeros(xs.size, dtype=bool)
        cur: list[Point] = []
        for i in picks:
            if not (~used).any():
                return None
            d = np.hypot(xs - prev[i][0], ys - prev[i][1])
            d[used] = np.inf
            j = int(np.argmin(d))
            used[j] = True
            cur.append((int(xs[j]), int(ys[j])))
        if len(cur) < width:
            return None
        levels.append(cur)
    return tuple(tuple(level) for level in levels)


def sample_anatomy(
    mask: np.ndarray,
    region: np.ndarray,
    operation: str,
    depth: int,
    rng: np.random.Generator,
    scale: ScaledDeform,
    config: DeformConfig,
    *,
    avoid: Sequence[Point] = (),
    avoid_dist: float | None = None,
    anatomy: str = "",
    width_choices: Sequence[int] | None = None,
    cache: dict | None = None,
) -> AnatomyPoints | None:
    """Return the §7.2 points of one anatomy (up to ``point_tries`` tries), or None when every try fails.

    ``avoid`` are the points the candidates must keep ``avoid_dist`` (default: the 50 px opposite-operation
    distance) away from; ``cache`` is a :func:`contour_pixels` cache for ``mask``.
    """
    dist = scale.opposite_min_dist if avoid_dist is None else avoid_dist
    per_depth = (
        config.expansion_iterations_per_depth if operation == EXPANSION else config.contraction_iterations_per_depth
    )
    choices = width_choices or config.width_choices
    for _ in range(config.point_tries):
        widths = draw_widths(depth, rng, choices)
        levels = sample_levels(mask, region, operation, widths, rng, scale, avoid, dist, per_depth, cache)
        if levels is not None:
            return AnatomyPoints(anatomy, operation, depth, widths, levels)
    return None
