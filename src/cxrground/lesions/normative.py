"""A normative model of the normal chest: where a film's lungs deviate from normal films (pure numpy/scipy).

Method (``normative-lung-grid/1``):

1. **Lung-shape coordinates.** Per lung, ``v`` = the row's position between the lung's top and bottom row
   (0 = apex, 1 = base) and ``u`` = the pixel's position in its row between the lung's lateral edge (0) and
   its medial edge (1). Every lung, whatever its size or shape, maps onto the unit square, so location
   ``(v, u)`` means the same place on every film.
2. **Intensity normalisation per film.** The image is smoothed (Gaussian, σ = :data:`SMOOTH_FRACTION` of
   the longest side) and mapped linearly so that the 5th percentile inside the lungs (aerated lung) is 0 and
   the median of the mediastinum (between the lungs' medial edges, upper half of the lung height) is 1. The
   mediastinum is outside the lungs, so a film with diffuse opacities keeps its high values instead of
   being normalised away (a within-lung z-score would do that).
3. **Per-location statistics.** Over the normal films, the per-film mean of the normalised intensity in
   each cell of an ``nv × nu`` grid per lung; the model stores, per lung and cell, the median over films
   and the scaled MAD (``1.4826 · MAD``, at least :data:`MIN_SCALE`): small, robust, and shipped as an
   ``.npz`` (:meth:`NormativeModel.save`).
4. **Anomaly map.** ``z = (n − median(v, u)) / scale(v, u)``, the statistics interpolated bilinearly
   between cell centres; 0 outside the lungs. Brighter than normal (opacity) is positive.
5. **Zone scores.** For each of the six ILS bands (right/left × upper/mid/lower = Brixia A–F), the 75th
   percentile of ``z`` in the band; a zone is flagged when its score exceeds the model's threshold.

The shipped statistics come from the pack's NIH ChestX-ray14 films labelled ``No Finding`` (NIH's terms
allow any use with attribution) with lungs from the shipped lung U-Net; ``cxrground anatomy fit-normative``
rebuilds them (:mod:`cxrground.lesions.normative_fit` is the recipe) and the sidecar lists the films.
"""

from __future__ import annotations

import json
import warnings
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np
from scipy import ndimage

from cxrground.anatomy.ils_locations import MID_FRACTION, UPPER_FRACTION, lung_zone_bands
from cxrground.errors import ConfigError, InputError
from cxrground.io.files import sha256_file
from cxrground.io.masks import as_mask, check_same_shape

__all__ = [
    "BRIXIA_ZONE_LABELS",
    "DEFAULT_NORMATIVE",
    "NORMATIVE_METHOD",
    "NormativeModel",
    "default_normative_path",
    "film_cells",
    "fit_cells",
    "fit_normative",
    "lung_coordinates",
    "normalise_intensity",
    "read_model_arrays",
    "read_model_sidecar",
    "shrink_toward",
]

NORMATIVE_METHOD: Final[str] = "normative-lung-grid/1"
#: File stem of the shipped statistics under ``cxrground/lesions/weights/``.
DEFAULT_NORMATIVE: Final[str] = "normative_v1"
#: Gaussian smoothing of the film before normalisation, as a fraction of the longest side (1.5 px at 512).
SMOOTH_FRACTION: Final[float] = 1.5 / 512
#: Floor of the per-cell scale (normalised units): a cell where normal films agree very closely must not
#: turn noise into large z.
MIN_SCALE: Final[float] = 0.02
#: Percentile of ``z`` inside a zone that is the zone's abnormality score.
ZONE_PERCENTILE: Final[float] = 75.0
#: Brixia zone → ILS location label (A/B/C right upper/mid/lower, D/E/F left).
BRIXIA_ZONE_LABELS: Final[dict[str, str]] = {
    "A": "right upper zone lung", "B": "right mid zone lung", "C": "right lung base",
    "D": "left upper zone lung", "E": "left mid zone lung", "F": "left lung base",
}
_SIDES: Final[tuple[str, str]] = ("right", "left")
_BANDS: Final[tuple[str, str, str]] = ("upper zone lung", "mid zone lung", "lung base")


def read_model_sidecar(path: Path, what: str) -> dict[str, Any]:
    """The JSON object of the ``.json`` sidecar beside the model file ``path`` ({} when there is none); an
    :class:`~cxrground.errors.InputError` naming the sidecar when it is not a readable JSON object."""
    sidecar = path.with_suffix(".json")
    if not sidecar.is_file():
        return {}
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"sidecar of the {what} {path.name} is not JSON ({exc})", sidecar) from exc
    if not isinstance(meta, dict):
        raise InputError(f"sidecar of the {what} {path.name} is not a JSON object", sidecar)
    return meta


def read_model_arrays(path: Path, keys: Sequence[str], what: str) -> dict[str, np.ndarray]:
    """The arrays ``keys`` of the ``.npz`` archive ``path``; an :class:`~cxrground.errors.InputError` naming the
    file when it is not an ``.npz`` archive holding them (``what``: the model, for the message)."""
    bad = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile)
    try:
        data = np.load(path, allow_pickle=False)
    except bad as exc:
        raise InputError(f"not {what} file ({exc})", path) from exc
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise InputError(f"not {what} file: one array, not an .npz archive of {', '.join(keys)}", path)
    with data:
        missing = [k for k in keys if k not in data.files]
        if missing:
            raise InputError(f"not {what} file: the archive has no {', '.join(missing)}", path)
        try:
            return {k: data[k] for k in keys}
        except bad as exc:
            raise InputError(f"not {what} file ({exc})", path) from exc


def default_normative_path() -> Path:
    """Path of the shipped ``normative_v1.npz`` (inside the installed package)."""
    return Path(str(resources.files("cxrground.lesions") / "weights" / f"{DEFAULT_NORMATIVE}.npz"))


def lung_coordinates(lung: np.ndarray, side: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(ys, xs, v, u)`` of the lung's pixels: ``v`` apex→base, ``u`` lateral→medial, both in [0, 1].

    ``side`` is ``right`` (the patient's right = image left, lateral = small x) or ``left``.
    """
    if side not in _SIDES:
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    ys, xs = np.nonzero(lung)
    if ys.size == 0:
        empty = np.zeros(0)
        return ys, xs, empty, empty
    y0, y1 = int(ys.min()), int(ys.max())
    v = (ys - y0) / max(y1 - y0, 1)
    first = np.argmax(lung, axis=1)
    last = lung.shape[1] - 1 - np.argmax(lung[:, ::-1], axis=1)
    lo, hi = first[ys], last[ys]
    u = (xs - lo) / np.maximum(hi - lo, 1)
    return ys, xs, v, (u if side == "right" else 1.0 - u)


def _mediastinum_level(img: np.ndarray, right: np.ndarray, left: np.ndarray) -> float | None:
    """Median of the smoothed image between the lungs' medial edges over the upper half of the lung rows."""
    rows = np.flatnonzero((right | left).any(axis=1))
    y0, y1 = int(rows[0]), int(rows[-1])
    r_has, l_has = right.any(axis=1), left.any(axis=1)
    r_med = right.shape[1] - 1 - np.argmax(right[:, ::-1], axis=1)
    l_med = np.argmax(left, axis=1)
    values = [img[y, r_med[y] + 1 : l_med[y]] for y in range(y0 + (y1 - y0) // 10, y0 + (y1 - y0) // 2)
              if r_has[y] and l_has[y] and l_med[y] - r_med[y] > 2]
    return float(np.median(np.concatenate(values))) if values else None


def _film_levels(pixels: np.ndarray, right: np.ndarray, left: np.ndarray) -> tuple[np.ndarray, float, float]:
    """The smoothed film, its aerated-lung level and its lung-to-mediastinum span (step 2 above)."""
    r = as_mask(right, "right lung mask")
    lft = as_mask(left, "left lung mask")
    check_same_shape(("image", np.asarray(pixels)), ("right lung mask", r), ("left lung mask", lft))
    if not r.any() or not lft.any():
        raise InputError("the normative model needs both lungs; a lung mask is empty")
    sigma = SMOOTH_FRACTION * max(r.shape)
    img = ndimage.gaussian_filter(np.asarray(pixels, dtype=np.float64), sigma)
    vals = img[r | lft]
    lo = float(np.percentile(vals, 5))
    hi = _mediastinum_level(img, r, lft)
    if hi is None or hi - lo < 1.0:
        hi = float(np.percentile(vals, 95))
    return img, lo, max(hi - lo, 1.0)


def normalise_intensity(pixels: np.ndarray, right: np.ndarray, left: np.ndarray) -> np.ndarray:
    """Film intensity mapped to aerated lung = 0, mediastinum = 1 (float64, whole image; step 2 above).

    Raises :class:`~cxrground.errors.InputError` when a lung is empty.
    """
    img, lo, span = _film_levels(pixels, right, left)
    return (img - lo) / span


def _cell_means(norm: np.ndarray, lung: np.ndarray, side: str, nv: int, nu: int) -> np.ndarray:
    """Mean normalised intensity per ``(v, u)`` cell of one lung (NaN where the cell has no pixel)."""
    ys, xs, v, u = lung_coordinates(lung, side)
    vb = np.clip((v * nv).astype(np.int64), 0, nv - 1)
    ub = np.clip((u * nu).astype(np.int64), 0, nu - 1)
    sums = np.zeros((nv, nu))
    counts = np.zeros((nv, nu))
    np.add.at(sums, (vb, ub), norm[ys, xs])
    np.add.at(counts, (vb, ub), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


@dataclass(frozen=True, eq=False)
class NormativeModel:
    """Per-location median and scale of the normalised intensity of normal lungs, and the zone threshold."""

    median: np.ndarray
    """``(2, nv, nu)``: index 0 = right lung, 1 = left lung."""
    scale: np.ndarray
    """``(2, nv, nu)`` robust spread (scaled MAD, ≥ :data:`MIN_SCALE`)."""
    zone_threshold: float = 1.0
    """A zone is flagged when its score (75th percentile of z) exceeds this."""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        med, sc = np.asarray(self.median, np.float64), np.asarray(self.scale, np.float64)
        if med.ndim != 3 or med.shape[0] != 2 or med.shape != sc.shape:
            raise ConfigError(f"normative statistics must be (2, nv, nu) arrays of one shape, got {med.shape} "
                              f"and {sc.shape}")
        if not (np.isfinite(med).all() and np.isfinite(sc).all() and (sc > 0).all()):
            raise ConfigError("normative statistics must be finite with a positive scale")
        object.__setattr__(self, "median", med)
        object.__setattr__(self, "scale", sc)

    @property
    def grid(self) -> tuple[int, int]:
        """``(nv, nu)``."""
        return int(self.median.shape[1]), int(self.median.shape[2])

    # --- files -----------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write ``path`` (``.npz``: median, scale, threshold) and its ``.json`` sidecar (meta + sha256)."""
        path = Path(path).with_suffix(".npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, median=self.median.astype(np.float32), scale=self.scale.astype(np.float32),
                 zone_threshold=np.float32(self.zone_threshold))
        meta = {**self.meta, "method": NORMATIVE_METHOD, "grid": list(self.grid),
                "zone_threshold": round(float(self.zone_threshold), 4), "sha256": sha256_file(path)}
        path.with_suffix(".json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path | None = None) -> NormativeModel:
        """Read a model written by :meth:`save` (None: the shipped one); checks the sidecar's sha256."""
        path = Path(path) if path is not None else default_normative_path()
        if not path.is_file():
            raise InputError("normative model file not found", path)
        meta = read_model_sidecar(path, "normative model")
        if meta.get("sha256") and meta["sha256"] != sha256_file(path):
            raise InputError("normative model does not match the sha256 in its sidecar", path)
        arrays = read_model_arrays(path, ("median", "scale", "zone_threshold"), "a normative model")
        try:
            return cls(arrays["median"], arrays["scale"], float(arrays["zone_threshold"]), {**meta, "path": str(path)})
        except (ConfigError, TypeError, ValueError) as exc:
            raise InputError(f"not a normative model file ({exc})", path) from exc

    # --- inference -------------------------------------------------------------------------------
    def z_map(self, pixels: np.ndarray, right: np.ndarray, left: np.ndarray) -> np.ndarray:
        """Deviation from normal in robust z units (float32, 0 outside the lungs)."""
        norm = normalise_intensity(pixels, right, left)
        out = np.zeros(norm.shape, dtype=np.float32)
        nv, nu = self.grid
        for k, (side, lung) in enumerate(zip(_SIDES, (as_mask(right), as_mask(left)), strict=True)):
            ys, xs, v, u = lung_coordinates(lung, side)
            coords = np.stack([np.clip(v * nv - 0.5, 0, nv - 1), np.clip(u * nu - 0.5, 0, nu - 1)])
            med = ndimage.map_coordinates(self.median[k], coords, order=1, mode="nearest")
            sc = ndimage.map_coordinates(self.scale[k], coords, order=1, mode="nearest")
            out[ys, xs] = (norm[ys, xs] - med) / sc
        return out

    def normal_upper(self, pixels: np.ndarray, right: np.ndarray, left: np.ndarray, k: float) -> np.ndarray:
        """Grey level of ``median + k · scale`` at every lung pixel (the top of the normal band), NaN elsewhere."""
        img, lo, span = _film_levels(pixels, right, left)
        r, lft = as_mask(right), as_mask(left)
        out = np.full(img.shape, np.nan)
        nv, nu = self.grid
        for j, (side, lung) in enumerate(zip(_SIDES, (r, lft), strict=True)):
            ys, xs, v, u = lung_coordinates(lung, side)
            coords = np.stack([np.clip(v * nv - 0.5, 0, nv - 1), np.clip(u * nu - 0.5, 0, nu - 1)])
            med = ndimage.map_coordinates(self.median[j], coords, order=1, mode="nearest")
            sc = ndimage.map_coordinates(self.scale[j], coords, order=1, mode="nearest")
            out[ys, xs] = lo + (med + k * sc) * span
        return out

    def zone_scores(self, z: np.ndarray, right: np.ndarray, left: np.ndarray) -> dict[str, float]:
        """Score of each Brixia zone A–F: the 75th percentile of ``z`` in its ILS band (NaN if empty)."""
        out: dict[str, float] = {}
        letters = iter(BRIXIA_ZONE_LABELS)
        for lung in (as_mask(right), as_mask(left)):
            bands = lung_zone_bands(lung)
            for band in _BANDS:
                vals = z[bands[band]]
                out[next(letters)] = float(np.percentile(vals, ZONE_PERCENTILE)) if vals.size else float("nan")
        return out

    def cell_film_score(self, cells: np.ndarray) -> float:
        """A film's highest zone score from its :func:`film_cells` array: per lung and ILS band (cell rows by
        their centre's ``v``), the 75th percentile of the cells' z; NaN when no cell has a value. The cell-level
        counterpart of the highest of :meth:`zone_scores` (cell means are less noisy than pixels)."""
        arr = np.asarray(cells, dtype=np.float64)
        if arr.shape != self.median.shape:
            raise ConfigError(f"film cells of shape {arr.shape} do not fit a {self.median.shape} normative grid")
        z = (arr - self.median) / self.scale
        v = (np.arange(self.grid[0]) + 0.5) / self.grid[0]
        bands = (v <= UPPER_FRACTION, (v > UPPER_FRACTION) & (v <= MID_FRACTION), v > MID_FRACTION)
        scores = [float(np.percentile(vals, ZONE_PERCENTILE)) for k in range(2) for rows in bands
                  if (vals := z[k][rows][np.isfinite(z[k][rows])]).size]
        return max(scores) if scores else float("nan")

    def zone_flags(self, scores: dict[str, float]) -> dict[str, bool]:
        """Zone → abnormal (score above the model's threshold; an empty zone is not flagged)."""
        return {k: bool(np.isfinite(s) and s > self.zone_threshold) for k, s in scores.items()}

    def provenance(self) -> dict[str, Any]:
        """Method, grid, threshold, file and training summary."""
        return {"method": NORMATIVE_METHOD, "grid": list(self.grid), "zone_threshold": self.zone_threshold,
                "path": self.meta.get("path"), "sha256": self.meta.get("sha256"),
                "training_data": self.meta.get("summary")}


def film_cells(pixels: np.ndarray, right: np.ndarray, left: np.ndarray, grid: tuple[int, int] = (16, 8)) -> np.ndarray:
    """One film's mean normalised intensity per lung and ``(v, u)`` cell, ``(2, nv, nu)`` (NaN where no pixel).

    Raises :class:`~cxrground.errors.InputError` when a lung is empty.
    """
    nv, nu = grid
    norm = normalise_intensity(pixels, right, left)
    return np.stack([_cell_means(norm, as_mask(m), s, nv, nu) for s, m in zip(_SIDES, (right, left), strict=True)])


def fit_cells(cells: Sequence[np.ndarray], zone_threshold: float = 1.0,
              meta: dict[str, Any] | None = None) -> NormativeModel:
    """The per-cell median / scaled MAD over per-film :func:`film_cells` arrays.

    A cell no film covers takes the median of its lung's covered cells. Raises :class:`ValueError` with
    fewer than 3 films.
    """
    if len(cells) < 3:
        raise ValueError(f"a normative model needs at least 3 normal films, got {len(cells)}")
    arr = np.stack(list(cells))
    with warnings.catch_warnings():  # cells no film covers are all-NaN; filled below
        warnings.simplefilter("ignore", RuntimeWarning)
        median = np.nanmedian(arr, axis=0)
        scale = np.maximum(1.4826 * np.nanmedian(np.abs(arr - median), axis=0), MIN_SCALE)
        for k in range(2):
            median[k][~np.isfinite(median[k])] = np.nanmedian(median[k])
            scale[k][~np.isfinite(scale[k])] = np.nanmedian(scale[k])
    return NormativeModel(median, scale, zone_threshold, {**(meta or {}), "films": len(cells)})


def fit_normative(
    films: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]],
    grid: tuple[int, int] = (16, 8),
    zone_threshold: float = 1.0,
    meta: dict[str, Any] | None = None,
) -> NormativeModel:
    """Fit the per-cell median / scaled MAD over normal ``(pixels, right, left)`` films.

    A cell no film covers takes the median of its lung's covered cells. Raises :class:`ValueError` with
    fewer than 3 films.
    """
    return fit_cells([film_cells(pixels, right, left, grid) for pixels, right, left in films], zone_threshold, meta)


#: Sampling variance of the log of a scaled MAD, times the number of films (normal data: 1 / (2 · 0.3675),
#: the MAD's asymptotic efficiency being 36.75 %).
_LOG_MAD_VARIANCE: Final[float] = 1.36


def _shrink(estimate: np.ndarray, prior: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, float]:
    """``estimate`` pulled toward ``prior`` cell by cell with weight ``noise / (noise + τ²)`` on the prior, τ² the
    mean squared estimate−prior gap beyond the noise (empirical Bayes); returns the result and the mean weight."""
    tau2 = max(float(np.mean((estimate - prior) ** 2 - noise)), 0.0)
    weight = noise / (noise + tau2) if tau2 > 0 else np.ones_like(estimate)
    return weight * prior + (1.0 - weight) * estimate, float(np.mean(weight))


def shrink_toward(cohort: NormativeModel, prior: NormativeModel, films: int) -> NormativeModel:
    """``cohort`` (fitted on ``films`` films) shrunk toward ``prior``, per lung.

    The median of each cell has sampling variance ``(π/2) · scale² / n``, the log of its scale ``1.36 / n``;
    each is pulled toward the prior by how small the cohort's gap to the prior is compared with that noise.
    A few films that look like the prior's films keep mostly the prior; a cohort that clearly differs from them
    (another population, other scanners) keeps its own statistics. The weights go into ``meta["shrinkage"]``.
    """
    if cohort.grid != prior.grid:
        raise ConfigError(f"cannot shrink a {cohort.grid} normative grid toward a {prior.grid} one")
    n = int(films)
    if n < 1:
        raise ConfigError(f"shrinking needs a cohort of at least one film, got {films}")
    median, scale = np.empty_like(cohort.median), np.empty_like(cohort.scale)
    weights: dict[str, dict[str, float]] = {}
    for k, side in enumerate(_SIDES):
        median[k], w_med = _shrink(cohort.median[k], prior.median[k], (np.pi / 2) * cohort.scale[k] ** 2 / n)
        log_scale, w_sc = _shrink(np.log(cohort.scale[k]), np.log(prior.scale[k]),
                                  np.full(cohort.scale[k].shape, _LOG_MAD_VARIANCE / n))
        scale[k] = np.maximum(np.exp(log_scale), MIN_SCALE)
        weights[side] = {"median": round(w_med, 4), "scale": round(w_sc, 4)}
    meta = {**cohort.meta, "shrinkage": {"prior": prior.meta.get("name", prior.meta.get("path")),
                                         "mean_prior_weight": weights}}
    return NormativeModel(median, scale, cohort.zone_threshold, meta)
