"""Simulated lung lesions of known extent on real films: zone-level labels we can make ourselves (pure numpy/scipy).

A real film whose lungs are normal gets opacities inserted into chosen Brixia zones (A–F = the ILS bands
right/left × upper/mid/base), and the six zone labels are read off the inserted field, so a zone classifier can
learn from films that look like real films (real anatomy, noise and processing) with known zone truth.

**Physics.** The 8-bit grey level ``g`` is read as ``1 − g/256`` = the fraction of the film's dynamic range still
transmitted; an opacity adds attenuation ``Δ ≥ 0`` (log units), which multiplies that fraction by ``exp(−Δ)``:
``g' = 256 − (256 − g) · exp(−Δ)``. Additive in the log-attenuation-like space ``−log(1 − g/256)``, so dark
aerated lung brightens most and already dense places (ribs, heart, fluid) little, and nothing saturates.

**Lesions** (all confined to the lungs: the field is multiplied by a lightly smoothed lung mask):

- *ground-glass*: a broad, low-contrast haze over most of the zone, texture from smoothed noise;
- *airspace*: patchy consolidation, smoothed noise thresholded at a quantile so that a chosen share of the zone
  is covered, higher contrast;
- either may be stronger laterally (a random gradient along the lung-shape coordinate ``u``, peripheral
  predominance as in viral pneumonia);
- *effusion*: dense homogeneous fluid at the base of one lung below a meniscus that rises laterally; optionally
  (``effusion_spill``) the fluid also spreads beyond the lung mask, below and beside the fluid, so that it hides
  the costophrenic angle and the diaphragm's edge as pleural fluid does (the labels are still read on the lung).

**Zones.** A film is a negative (no lesion, ``p_negative``), or gets all six zones (``p_all_zones``, diffuse
disease as on portables), or 1–5 zones drawn without replacement, lower zones ``lower_bias`` times as likely as
upper ones (mid zones halfway). **Labels**: a zone is abnormal when at least ``min_zone_cover`` of its pixels have
``Δ ≥ label_attenuation``, computed from the drawn field (a lesion that spills over a band boundary may label
the neighbour too). Every film, negatives included, may get a global gamma (``gamma`` range), so exposure and
processing differences do not pass for disease.

:func:`simulate_lesions` is deterministic for a seed; :class:`SimulatedFilm` is the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
from scipy import ndimage

from cxrground.anatomy.ils_locations import lung_zone_bands
from cxrground.errors import ConfigError, InputError
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS, lung_coordinates

__all__ = ["LESION_KINDS", "LesionSimParams", "SimulatedFilm", "add_attenuation", "simulate_lesions",
           "smooth_noise", "zone_labels_from_field"]

#: What a zone may receive.
LESION_KINDS: Final[tuple[str, ...]] = ("ground-glass", "airspace", "effusion")
ZONES: Final[tuple[str, ...]] = tuple(BRIXIA_ZONE_LABELS)
_BANDS: Final[tuple[str, str, str]] = ("upper zone lung", "mid zone lung", "lung base")
_SIDES: Final[tuple[str, str]] = ("right", "left")
#: Grey levels are read on this full scale (one above the 8-bit maximum, so ``1 − g/256`` is never 0).
_FULL: Final[float] = 256.0
#: Gaussian σ (pixels) of the lung mask the lesion field is blended under.
_BLEND: Final[float] = 3.0


def _check_range(name: str, lo_hi: tuple[float, float], lo: float, hi: float) -> None:
    a, b = lo_hi
    if not (lo <= a <= b <= hi):
        raise ConfigError(f"lesion simulation {name} must be a range within [{lo}, {hi}], got {lo_hi}")


@dataclass(frozen=True)
class LesionSimParams:
    """How lesions are drawn; ranges are sampled uniformly. Lengths are fractions of the lung's height."""

    p_negative: float = 0.2
    """Share of films left without any lesion."""
    p_all_zones: float = 0.35
    """Share of the lesioned films with all six zones involved."""
    lower_bias: float = 2.0
    """How much likelier a lower zone is drawn than an upper one (mid zones: halfway)."""
    p_effusion: float = 0.25
    """Chance that a chosen lower zone gets an effusion (alone or under the opacity)."""
    p_ground_glass: float = 0.5
    """Chance that a zone's opacity is ground-glass rather than patchy airspace."""
    ground_glass_attenuation: tuple[float, float] = (0.06, 0.35)
    airspace_attenuation: tuple[float, float] = (0.12, 0.6)
    effusion_attenuation: tuple[float, float] = (0.3, 0.9)
    airspace_cover: tuple[float, float] = (0.25, 0.9)
    """Share of the zone the patchy opacity covers."""
    effusion_height: tuple[float, float] = (0.06, 0.3)
    """Fluid height at the medial side; the meniscus rises by up to as much again laterally."""
    lateral_gradient: tuple[float, float] = (0.0, 0.8)
    """Extra weight of the lateral edge over the medial edge (0: uniform across the zone)."""
    texture: tuple[float, float] = (0.2, 0.6)
    """Relative amplitude of the smoothed-noise texture on the opacity."""
    cell: float = 0.05
    """Feature size of the texture and of the patches."""
    edge: float = 0.02
    """Smoothing (Gaussian σ) of the opacity's borders."""
    gamma: tuple[float, float] = (0.85, 1.2)
    """Global gamma of the film (every film, negatives too)."""
    effusion_spill: tuple[float, float] = (0.0, 0.0)
    """How far an effusion spreads outside the lung mask (fraction of the lung's height; (0, 0): not at all)."""
    label_attenuation: float = 0.05
    min_zone_cover: float = 0.1

    def __post_init__(self) -> None:
        for name in ("p_negative", "p_all_zones", "p_effusion", "p_ground_glass", "min_zone_cover"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"lesion simulation {name} must be in [0, 1], got {getattr(self, name)}")
        if self.lower_bias <= 0 or self.cell <= 0 or self.edge < 0 or self.label_attenuation <= 0:
            raise ConfigError("lesion simulation lower_bias, cell and label_attenuation must be positive, edge >= 0")
        for name in ("ground_glass_attenuation", "airspace_attenuation", "effusion_attenuation"):
            _check_range(name, getattr(self, name), 0.0, 5.0)
        for name in ("airspace_cover", "effusion_height", "lateral_gradient", "texture", "effusion_spill"):
            _check_range(name, getattr(self, name), 0.0, 1.0)
        _check_range("gamma", self.gamma, 0.2, 5.0)


@dataclass(frozen=True, eq=False)
class SimulatedFilm:
    """A film with inserted lesions, the added attenuation and the zone truth (zones A–F)."""

    pixels: np.ndarray
    """uint8, the input's shape."""
    attenuation: np.ndarray
    """float32 ``Δ`` added at every pixel (0 outside the lesions)."""
    labels: tuple[bool, ...]
    """Zone A–F abnormal (see the module docstring)."""
    cover: tuple[float, ...]
    """Share of each zone's pixels with ``Δ ≥ label_attenuation``."""
    kinds: tuple[tuple[str, ...], ...]
    """The :data:`LESION_KINDS` drawn into each zone (empty: none drawn there)."""
    gamma: float


def smooth_noise(rng: np.random.Generator, shape: tuple[int, int], sigma: float) -> np.ndarray:
    """White noise smoothed by a Gaussian of ``sigma`` pixels, zero mean and unit std (float32).

    Drawn on a grid coarser by up to ``sigma / 2`` (at most 4) and interpolated linearly back: the same
    smoothness at a fraction of the cost."""
    step = int(np.clip(sigma // 2, 1, 4))
    coarse = (-(-shape[0] // step) + 1, -(-shape[1] // step) + 1)
    small = ndimage.gaussian_filter(rng.standard_normal(coarse), max(sigma / step, 0.5), mode="reflect")
    field = ndimage.zoom(small, step, order=1, mode="nearest", grid_mode=False)[: shape[0], : shape[1]]
    std = float(field.std())
    return ((field - field.mean()) / (std if std > 1e-12 else 1.0)).astype(np.float32)


def add_attenuation(pixels: np.ndarray, attenuation: np.ndarray) -> np.ndarray:
    """``256 − (256 − g) · exp(−Δ)``, rounded to uint8: ``Δ`` added in the log-attenuation-like space."""
    g = np.asarray(pixels, np.float64)
    d = np.asarray(attenuation, np.float64)
    if g.shape != d.shape:
        raise InputError(f"attenuation shape {d.shape} differs from the image's {g.shape}")
    if (d < 0).any():
        raise InputError("attenuation must be >= 0 (a lesion adds density)")
    return np.clip(np.rint(_FULL - (_FULL - g) * np.exp(-d)), 0, 255).astype(np.uint8)


def zone_labels_from_field(attenuation: np.ndarray, right: np.ndarray, left: np.ndarray, level: float,
                           min_cover: float) -> tuple[tuple[bool, ...], tuple[float, ...]]:
    """Per zone A–F: abnormal (cover ≥ ``min_cover``) and cover = share of its pixels with ``Δ ≥ level``."""
    cover: list[float] = []
    for lung in (right, left):
        bands = lung_zone_bands(lung)
        for b in _BANDS:
            vals = attenuation[bands[b]]
            cover.append(float((vals >= level).mean()) if vals.size else 0.0)
    return tuple(c >= min_cover for c in cover), tuple(cover)


def _choose_zones(rng: np.random.Generator, p: LesionSimParams) -> list[int]:
    """Indices (0–5, zones A–F) that get a lesion."""
    if rng.random() < p.p_negative:
        return []
    if rng.random() < p.p_all_zones:
        return list(range(6))
    w = np.tile([1.0, 0.5 * (1.0 + p.lower_bias), p.lower_bias], 2)
    k = int(rng.integers(1, 6))
    return sorted(int(i) for i in rng.choice(6, size=k, replace=False, p=w / w.sum()))


def _u_map(lung: np.ndarray, side: str) -> np.ndarray:
    """``u`` (lateral 0 → medial 1) at the lung's pixels, 0 elsewhere."""
    out = np.zeros(lung.shape, np.float32)
    ys, xs, _, u = lung_coordinates(lung, side)
    out[ys, xs] = u
    return out


def _v_map(lung: np.ndarray, side: str) -> np.ndarray:
    """``v`` (apex 0 → base 1) at the lung's pixels, 0 elsewhere."""
    out = np.zeros(lung.shape, np.float32)
    ys, xs, v, _ = lung_coordinates(lung, side)
    out[ys, xs] = v
    return out


def _opacity(rng: np.random.Generator, p: LesionSimParams, zone: np.ndarray, u: np.ndarray, height: float,
             ground_glass: bool) -> np.ndarray:
    """Added attenuation of one ground-glass or airspace opacity over ``zone``."""
    cell = p.cell * height
    tex = smooth_noise(rng, zone.shape, 0.5 * cell)
    if ground_glass:
        amp = rng.uniform(*p.ground_glass_attenuation)
        shape = np.ones(zone.shape, np.float32)
    else:
        amp = rng.uniform(*p.airspace_attenuation)
        patches = smooth_noise(rng, zone.shape, cell)
        inside = zone > 0.5
        cut = np.quantile(patches[inside], 1.0 - rng.uniform(*p.airspace_cover)) if inside.any() else 0.0
        shape = (0.5 * (1.0 + np.tanh((patches - cut) / 0.6))).astype(np.float32)
    grad = rng.uniform(*p.lateral_gradient)
    lateral = (1.0 + grad * (1.0 - u)) / (1.0 + grad)
    field = amp * shape * lateral * np.clip(1.0 + rng.uniform(*p.texture) * tex, 0.0, None) * zone
    return field.astype(np.float32)


def _effusion(rng: np.random.Generator, p: LesionSimParams, lung: np.ndarray, side: str) -> np.ndarray:
    """Added attenuation of fluid at the base of ``lung``, meniscus rising laterally."""
    v, u = _v_map(lung, side), _u_map(lung, side)
    h = rng.uniform(*p.effusion_height)
    level = 1.0 - h - h * rng.uniform(0.3, 1.0) * (1.0 - u)
    fluid = 0.5 * (1.0 + np.tanh((v - level) / 0.04))
    return (rng.uniform(*p.effusion_attenuation) * fluid * lung).astype(np.float32)


def _spill(rng: np.random.Generator, p: LesionSimParams, fluid: np.ndarray, height: float) -> np.ndarray:
    """The effusion ``fluid`` carried beyond its edge and out of the lung (not above the fluid's top), fading to 0
    over the drawn reach: each pixel takes the nearest fluid pixel's attenuation times ``(1 − distance / reach)²``
    (the fluid itself inside)."""
    reach = max(1.0, rng.uniform(*p.effusion_spill) * height)
    wet = fluid > 0.5 * fluid.max() if fluid.max() > 0 else np.zeros(fluid.shape, bool)
    if not wet.any():
        return np.zeros(fluid.shape, np.float32)
    dist, (iy, ix) = ndimage.distance_transform_edt(~wet, return_indices=True)
    spread = fluid[iy, ix] * np.clip(1.0 - dist / reach, 0.0, 1.0) ** 2
    spread[: int(np.flatnonzero(wet.any(axis=1))[0])] = 0.0
    return spread.astype(np.float32)


def simulate_lesions(pixels: np.ndarray, right: np.ndarray, left: np.ndarray, params: LesionSimParams | None = None,
                     seed: int = 0) -> SimulatedFilm:
    """Insert lesions into chosen zones of a (normal) film; deterministic for ``seed``.

    ``pixels`` is an 8-bit grey film, ``right``/``left`` its lung masks (patient's right = image left). Raises
    :class:`~cxrground.errors.InputError` when the shapes differ or a lung is empty.
    """
    p = params or LesionSimParams()
    img = np.asarray(pixels)
    if img.ndim != 2:
        raise InputError(f"lesion simulation needs a 2-D grey image, got shape {img.shape}")
    r, lft = as_mask(right, "right lung mask"), as_mask(left, "left lung mask")
    check_same_shape(("image", img), ("right lung mask", r), ("left lung mask", lft))
    if not r.any() or not lft.any():
        raise InputError("lesion simulation needs both lungs; a lung mask is empty")
    rng = np.random.default_rng(seed)
    chosen = _choose_zones(rng, p)
    field = np.zeros(img.shape, np.float32)
    outside = np.zeros(img.shape, np.float32)
    kinds: list[tuple[str, ...]] = [() for _ in ZONES]
    for k, (side, lung) in enumerate(zip(_SIDES, (r, lft), strict=True)):
        rows = np.flatnonzero(lung.any(axis=1))
        height = float(rows[-1] - rows[0] + 1)
        bands = lung_zone_bands(lung)
        u = _u_map(lung, side)
        for j, band in enumerate(_BANDS):
            zi = 3 * k + j
            if zi not in chosen:
                continue
            drawn: list[str] = []
            effusion = j == 2 and rng.random() < p.p_effusion
            if effusion:
                fluid = _effusion(rng, p, lung, side)
                field = np.maximum(field, fluid)
                if p.effusion_spill[1] > 0:
                    outside = np.maximum(outside, _spill(rng, p, fluid, height))
                drawn.append("effusion")
            if not effusion or rng.random() < 0.5:
                gg = bool(rng.random() < p.p_ground_glass)
                zone = ndimage.gaussian_filter(bands[band].astype(np.float32), p.edge * height) if p.edge else \
                    bands[band].astype(np.float32)
                field += _opacity(rng, p, zone, u, height, gg)
                drawn.append("ground-glass" if gg else "airspace")
            kinds[zi] = tuple(drawn)
    lungs = r | lft
    soft_lungs = ndimage.gaussian_filter(lungs.astype(np.float32), _BLEND) * ndimage.binary_dilation(lungs, None, 2)
    field = np.maximum(field * soft_lungs, outside).astype(np.float32)
    gamma = float(rng.uniform(*p.gamma))
    base = np.clip(np.rint(255.0 * (img.astype(np.float64) / 255.0) ** gamma), 0, 255).astype(np.uint8)
    labels, cover = zone_labels_from_field(field, r, lft, p.label_attenuation, p.min_zone_cover)
    return SimulatedFilm(add_attenuation(base, field), field, labels, cover, tuple(kinds), gamma)
