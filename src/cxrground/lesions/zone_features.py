"""Per-zone feature vectors for the six Brixia zones A–F, read from a film's normative z-map (pure numpy).

A zone's abnormality is more than one percentile of ``z``: these features describe the distribution of
``z`` in the zone (mean, percentiles, fraction above thresholds), where in the zone it is raised (lateral
vs medial half, by the lung-shape coordinate ``u``), how the zone compares with the same zone of the other
lung (left–right asymmetry), the zone's mean normalised intensity (aerated lung 0, mediastinum 1), and the
whole film (``z`` over both lungs, which sets the scale of a film with diffuse disease, and the mean grey
level of the lungs). The zone's position (upper / mid / lower) is one-hot and its share of its lung's area a
number, so one classifier serves all six zones.

:func:`zone_feature_matrix` returns a ``(6, len(FEATURE_NAMES))`` array, rows in zone order A–F. Features
depend on the normative model whose z-map they read: :func:`normative_hash` identifies that model and
:func:`check_same_normative` refuses a zone classifier trained on another one's features.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final

import numpy as np

from cxrground.anatomy.ils_locations import lung_zone_bands
from cxrground.errors import InputError
from cxrground.io.files import sha256_file
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS, NormativeModel, lung_coordinates, normalise_intensity
from cxrground.lesions.zone_classifier import ZoneClassifier

__all__ = ["FEATURE_NAMES", "Z_LEVELS", "check_same_normative", "feature_columns", "film_zone_features",
           "normative_hash", "zone_feature_matrix"]

ZONES: Final[tuple[str, ...]] = tuple(BRIXIA_ZONE_LABELS)
_BANDS: Final[tuple[str, str, str]] = ("upper zone lung", "mid zone lung", "lung base")
#: ``z`` levels whose exceedance fraction in the zone is a feature.
Z_LEVELS: Final[tuple[float, ...]] = (1.0, 2.0, 3.0)
_ZONE_STATS: Final[tuple[str, ...]] = (
    "z_mean", "z_p25", "z_p50", "z_p75", "z_p90", *(f"z_frac_gt{lv:g}" for lv in Z_LEVELS),
    "z_lateral_mean", "z_medial_mean", "z_lateral_minus_medial", "norm_mean", "norm_p25", "norm_p75", "area_frac",
)
#: Column names of :func:`zone_feature_matrix`, in order.
FEATURE_NAMES: Final[tuple[str, ...]] = (
    *_ZONE_STATS,
    "asym_z_p75", "asym_z_mean", "asym_norm_mean",
    "film_z_mean", "film_z_p75", "film_z_frac_gt2", "film_norm_mean", "film_norm_p10", "film_lung_grey",
    "zone_upper", "zone_mid", "zone_lower",
)


def _zone_stats(z: np.ndarray, norm: np.ndarray, u: np.ndarray, lung_area: int) -> list[float]:
    """The :data:`_ZONE_STATS` of one zone from its pixels' ``z``, normalised intensity and ``u``."""
    if z.size == 0:
        return [0.0] * len(_ZONE_STATS)
    p25, p50, p75, p90 = np.percentile(z, [25, 50, 75, 90])
    lateral, medial = z[u < 0.5], z[u >= 0.5]
    lat = float(lateral.mean()) if lateral.size else float(z.mean())
    med = float(medial.mean()) if medial.size else float(z.mean())
    return [float(z.mean()), float(p25), float(p50), float(p75), float(p90),
            *(float((z > lv).mean()) for lv in Z_LEVELS),
            lat, med, lat - med, float(norm.mean()), *(float(q) for q in np.percentile(norm, [25, 75])),
            z.size / max(lung_area, 1)]


def zone_feature_matrix(pixels: np.ndarray, z: np.ndarray, norm: np.ndarray, right: np.ndarray,
                        left: np.ndarray) -> np.ndarray:
    """Feature rows of zones A–F (columns :data:`FEATURE_NAMES`) of one film.

    ``pixels`` (8-bit grey), ``z`` and ``norm`` are on the lungs' grid (``NormativeModel.z_map`` and
    ``normalise_intensity`` of the same film). An empty zone gets zeros. Raises
    :class:`~cxrground.errors.InputError` when a lung is empty or the shapes differ.
    """
    r, lft = as_mask(right, "right lung mask"), as_mask(left, "left lung mask")
    check_same_shape(("image", np.asarray(pixels)), ("z-map", np.asarray(z)), ("normalised image", np.asarray(norm)),
                     ("right lung mask", r), ("left lung mask", lft))
    if not r.any() or not lft.any():
        raise InputError("zone features need both lungs; a lung mask is empty")
    z = np.asarray(z, dtype=np.float64)
    norm = np.asarray(norm, dtype=np.float64)
    stats: list[list[float]] = []
    for side, lung in (("right", r), ("left", lft)):
        u_map = np.zeros(lung.shape)
        ys, xs, _, u = lung_coordinates(lung, side)
        u_map[ys, xs] = u
        bands = lung_zone_bands(lung)
        area = int(lung.sum())
        stats += [_zone_stats(z[bands[b]], norm[bands[b]], u_map[bands[b]], area) for b in _BANDS]
    s = np.array(stats)
    col = {name: j for j, name in enumerate(_ZONE_STATS)}
    other = np.array([3, 4, 5, 0, 1, 2])  # the same zone of the other lung
    asym = np.stack([s[:, col[c]] - s[other, col[c]] for c in ("z_p75", "z_mean", "norm_mean")], axis=1)
    both = r | lft
    zb, nb = z[both], norm[both]
    grey = np.asarray(pixels, dtype=np.float64)[both].mean() / 255.0
    film = np.array([zb.mean(), np.percentile(zb, 75), (zb > 2.0).mean(), nb.mean(), np.percentile(nb, 10), grey])
    position = np.tile(np.eye(3), (2, 1))
    return np.hstack([s, asym, np.tile(film, (6, 1)), position])


def film_zone_features(model: NormativeModel, pixels: np.ndarray, right: np.ndarray,
                       left: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(features, z)``: :func:`zone_feature_matrix` of a film under ``model``, and its z-map."""
    z = model.z_map(pixels, right, left)
    return zone_feature_matrix(pixels, z, normalise_intensity(pixels, right, left), right, left), z


def feature_columns(names: tuple[str, ...] | list[str]) -> list[int]:
    """Column indices of ``names`` in :data:`FEATURE_NAMES`; an unknown name is an error naming it."""
    unknown = [n for n in names if n not in FEATURE_NAMES]
    if unknown:
        raise InputError(f"unknown zone feature(s) {unknown}; known: {', '.join(FEATURE_NAMES)}")
    return [FEATURE_NAMES.index(n) for n in names]


def normative_hash(model: NormativeModel) -> str:
    """sha256 of the normative model's ``.npz`` (its sidecar's, else the file's; an unsaved model: of its arrays)."""
    if model.meta.get("sha256"):
        return str(model.meta["sha256"])
    path = model.meta.get("path")
    if path and Path(path).is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for arr in (model.median.astype(np.float32), model.scale.astype(np.float32),
                np.float32(model.zone_threshold)):
        digest.update(np.ascontiguousarray(arr).tobytes())
    return "arrays:" + digest.hexdigest()


def check_same_normative(zone_model: ZoneClassifier, model: NormativeModel) -> None:
    """Raise :class:`~cxrground.errors.InputError` (naming the classifier's file) unless ``zone_model`` was trained
    on features read from ``model`` (its sidecar's ``normative.sha256`` equals :func:`normative_hash`)."""
    recorded = zone_model.meta.get("normative") or {}
    fitted = recorded.get("sha256")
    here = normative_hash(model)
    where = zone_model.meta.get("path")
    if not fitted:
        raise InputError("zone classifier does not record the normative model it was trained with "
                         "(fit it with `cxrground anatomy fit-zones`)", where)
    if fitted != here:
        raise InputError(f"zone classifier was trained on features of the normative model sha256 {fitted[:12]}…, "
                         f"but the films would be read with {model.meta.get('path') or 'an unsaved model'} "
                         f"(sha256 {here[:12]}…); pass the same --normative it was fitted with "
                         f"({recorded.get('path') or 'unsaved'})", where)
