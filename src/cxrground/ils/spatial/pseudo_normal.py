"""Built-in "normal image" estimate ``x̂`` and the ILS §8 anomaly map (pure numpy/scipy, deterministic).

The reference pipeline edits the image with RadEdit (:mod:`.radedit`); this module is the CPU default.
:class:`PseudoNormalSynthesizer` splits the image, inside each region of the edit mask (right lung,
left lung, heart), into three parts:

1. **Fine structure** ``x − S``, where ``S`` is a grey *opening* of ``x`` restricted to the region with a
   square of side ``2r + 1`` (``r = structure_scale · longest side``, about 12 px at 512): everything
   narrower than the square — ribs, vessels, the bright rim along the lung border, pixel noise — is in
   ``x − S``; smooth structures wider than the square (lesions, hila) stay in ``S``.
2. **Background** ``B``: a robust low-order surface fitted to ``S`` over the region — a degree-2
   polynomial in ``(x, y)`` plus ``exp(−d/λ)`` terms of the distance ``d`` to the region border
   (``λ = edge_scales · longest side``; they model the denser, brighter lung periphery near the chest wall,
   diaphragm and mediastinum). The fit is a *quantile regression* at level ``p = asymmetry`` (0.1),
   solved by iteratively reweighted least squares on every ``fit_stride``-th pixel: the surface follows the
   lower envelope of ``S``, and since an absolute-residual loss does not grow with the size of an outlier, a
   large bright lesion does not lift or bend it (``loss="expectile"``, asymmetric squares, is the
   alternative).
3. **Excess** ``E = max(0, S − B)``: coarse structure brighter than the background. Excess below
   ``noise_floor`` grey levels is treated as normal variation (set to 0).

``x̂ = x − E`` inside the edit mask and ``x̂ = x`` outside it. Hence ``x̂ ≤ x``, the anomaly map
``(x − x̂)/255`` is non-negative with the built-in estimate (RadEdit may give negative values too), focal
bright lesions are removed while ribs and vessels stay (they are in the fine structure, which is kept),
and normal lung equals the input exactly wherever the excess is below the floor.

Settings are fractions of the image's longest side, so the estimate behaves the same on any canvas;
:meth:`PseudoNormalSynthesizer.provenance` records them. See ``bench/grounding.py`` for how they were
chosen on the synthetic phantoms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import ndimage

from cxrground.io.masks import as_mask, check_same_shape

__all__ = ["PseudoNormalSynthesizer", "anomaly_map", "anomaly_mask", "split_edit_mask"]

_VERSION = "1"


@dataclass(frozen=True)
class PseudoNormalSynthesizer:
    """Robust per-region background model; see the module docstring for the method."""

    structure_scale: float = 12 / 512
    """Half-side of the opening square (fraction of the longest side): thinner structures are kept."""
    edge_scales: tuple[float, ...] = (0.01, 0.025, 0.06)
    """Decay lengths of the border-distance terms of the background (fractions of the longest side)."""
    poly_degree: int = 2
    """Degree of the 2-D polynomial part of the background."""
    asymmetry: float = 0.1
    """Weight of points above the fitted surface (``1 −`` this below): with the quantile loss the surface is
    the 10th percentile of the opened image, i.e. a lower envelope of normal tissue."""
    iterations: int = 30
    """Reweighting iterations of the asymmetric fit."""
    fit_stride: int = 3
    """The fit uses every ``fit_stride``-th region pixel (row-major; deterministic)."""
    loss: str = "quantile"
    """``expectile`` (asymmetric squares) or ``quantile`` (asymmetric absolute residuals, IRLS; robust to
    the size of an outlier, so a large bright lesion cannot bend the surface)."""
    noise_floor: float = 3.0
    """Excess below this many grey levels is normal variation (x̂ = x there)."""
    min_region_pixels: int = 64
    """Regions smaller than this are left unedited."""

    name = "pseudo-normal"

    def __post_init__(self) -> None:
        if not 0 < self.asymmetry < 0.5:
            raise ValueError(f"asymmetry must be in (0, 0.5), got {self.asymmetry}")
        if self.poly_degree < 0 or self.iterations < 1 or self.fit_stride < 1:
            raise ValueError("poly_degree must be >= 0, iterations and fit_stride >= 1")
        if self.structure_scale < 0:
            raise ValueError(f"structure_scale must be >= 0, got {self.structure_scale}")
        if self.loss not in ("expectile", "quantile"):
            raise ValueError(f"loss must be 'expectile' or 'quantile', got {self.loss!r}")

    # --- NormalSynthesizer -----------------------------------------------------------------------
    def synthesize(
        self,
        image: np.ndarray,
        edit_mask: np.ndarray,
        regions: Sequence[np.ndarray] | None = None,
    ) -> np.ndarray:
        """``x̂`` (uint8, same shape); pixels outside ``edit_mask`` equal ``image``.

        ``regions`` (e.g. ``(right_lung, left_lung, heart)``) are modelled separately, each clipped to the
        edit mask; edit-mask pixels in no region form further regions by connected components. Without
        ``regions`` the regions are :func:`split_edit_mask` of the edit mask.
        """
        x = np.asarray(image)
        if x.ndim != 2:
            raise ValueError(f"image must be a 2-D grey array, got shape {x.shape}")
        edit = as_mask(edit_mask, "edit mask")
        check_same_shape(("image", x), ("edit mask", edit))
        xf = x.astype(np.float64)
        excess = self.excess(xf, edit, regions)
        out = np.where(edit, xf - excess, xf)
        return np.clip(np.round(out), 0, 255).astype(np.uint8)

    def provenance(self) -> dict[str, Any]:
        """Backend name, version and settings."""
        settings = asdict(self)
        settings["edge_scales"] = list(self.edge_scales)
        return {"name": self.name, "version": _VERSION, "settings": settings}

    # --- the method ------------------------------------------------------------------------------
    def excess(
        self,
        image: np.ndarray,
        edit_mask: np.ndarray,
        regions: Sequence[np.ndarray] | None = None,
    ) -> np.ndarray:
        """The removed part ``E = x − x̂`` (float, ≥ 0, zero outside the edit mask)."""
        x = np.asarray(image, dtype=np.float64)
        edit = as_mask(edit_mask, "edit mask")
        side = float(max(x.shape))
        out = np.zeros_like(x)
        for region in _regions(edit, regions):
            if int(region.sum()) < self.min_region_pixels:
                continue
            e = self._region_excess(x, region, side)
            out[region] = e[region]
        return out

    def _region_excess(self, x: np.ndarray, region: np.ndarray, side: float) -> np.ndarray:
        r = max(0, round(self.structure_scale * side))
        s = masked_opening(x, region, 2 * r + 1) if r > 0 else x
        ys, xs = np.nonzero(region)
        feats = _features(region, ys, xs, self.poly_degree, [k * side for k in self.edge_scales])
        vals = s[ys, xs]
        coef = _asymmetric_fit(vals[:: self.fit_stride], feats[:: self.fit_stride], self.asymmetry, self.iterations,
                               self.loss)
        excess = np.maximum(vals - feats @ coef, 0.0)
        excess[excess < self.noise_floor] = 0.0
        out = np.zeros_like(x)
        out[ys, xs] = excess
        return out


# --- helpers ---------------------------------------------------------------------------------------

def masked_opening(x: np.ndarray, region: np.ndarray, size: int) -> np.ndarray:
    """Grey opening of ``x`` with a ``size``² square using only pixels inside ``region``.

    Erosion takes the minimum over the region pixels of the window, dilation the maximum over the
    region pixels; the result is ``≤ x`` in the region and equals ``x`` outside it.
    """
    x = np.asarray(x, dtype=np.float64)
    big = float(x.max(initial=0.0)) + 1.0
    eroded = ndimage.minimum_filter(np.where(region, x, big), size=size, mode="nearest")
    low = float(x.min(initial=0.0)) - 1.0
    opened = ndimage.maximum_filter(np.where(region, eroded, low), size=size, mode="nearest")
    return np.where(region, np.minimum(opened, x), x)


def _features(region: np.ndarray, ys: np.ndarray, xs: np.ndarray, degree: int,
              edge_lengths: Sequence[float]) -> np.ndarray:
    cy, cx = float(ys.mean()), float(xs.mean())
    scale = max(float(np.ptp(ys)), float(np.ptp(xs)), 1.0) / 2.0
    u, v = (ys - cy) / scale, (xs - cx) / scale
    cols = [u**i * v**j for i in range(degree + 1) for j in range(degree + 1 - i)]
    if edge_lengths:
        dist = ndimage.distance_transform_edt(np.pad(region, 1))[1:-1, 1:-1][ys, xs]
        cols.extend(np.exp(-dist / max(lam, 1e-6)) for lam in edge_lengths)
    return np.stack(cols, axis=1)


def _solve(feats: np.ndarray, vals: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least squares by the normal equations (few features), with a tiny ridge for stability."""
    fw = feats * w[:, None]
    gram = feats.T @ fw
    gram[np.diag_indices_from(gram)] += 1e-9 * max(float(np.trace(gram)), 1.0) / gram.shape[0]
    return np.linalg.solve(gram, fw.T @ vals)


def _asymmetric_fit(vals: np.ndarray, feats: np.ndarray, p: float, iterations: int,
                    loss: str = "quantile") -> np.ndarray:
    """Asymmetric fit below the data: weight ``p`` above the surface, ``1 − p`` below.

    ``expectile``: weighted squares (stops when the weights no longer change); ``quantile``: the ``p``-quantile
    surface by iteratively reweighted least squares with weights ``(p or 1 − p) / max(|r|, 1)``.
    """
    if loss not in ("expectile", "quantile"):
        raise ValueError(f"loss must be 'expectile' or 'quantile', got {loss!r}")
    w = np.full(vals.shape, 0.5)
    coef = np.zeros(feats.shape[1])
    for _ in range(iterations):
        coef = _solve(feats, vals, w)
        r = vals - feats @ coef
        side = np.where(r > 0, p, 1.0 - p)
        if loss == "quantile":
            w = side / np.maximum(np.abs(r), 1.0)
            continue
        if np.array_equal(side, w):
            break
        w = side
    return coef


def split_edit_mask(edit_mask: np.ndarray) -> list[np.ndarray]:
    """Regions of an edit mask given without anatomy: its 8-connected components, largest first."""
    edit = as_mask(edit_mask, "edit mask")
    labels, n = ndimage.label(edit, structure=np.ones((3, 3), dtype=bool))
    if n == 0:
        return []
    sizes = np.bincount(labels.ravel(), minlength=n + 1)[1:]
    order = sorted(range(n), key=lambda k: (-int(sizes[k]), k))
    return [labels == (k + 1) for k in order]


def _regions(edit: np.ndarray, regions: Sequence[np.ndarray] | None) -> list[np.ndarray]:
    if regions is None:
        return split_edit_mask(edit)
    out: list[np.ndarray] = []
    covered = np.zeros_like(edit)
    for k, reg in enumerate(regions):
        m = as_mask(reg, f"region {k}")
        check_same_shape(("edit mask", edit), (f"region {k}", m))
        m = m & edit & ~covered
        covered |= m
        if m.any():
            out.append(m)
    rest = edit & ~covered
    if rest.any():
        out.extend(split_edit_mask(rest))
    return out


def anomaly_map(image: np.ndarray, normal: np.ndarray, edit_mask: np.ndarray | None = None) -> np.ndarray:
    """ILS §8: ``x_ano = (x − x̂) / 255`` as float32, signed (brighter than normal = positive).

    Pixels outside ``edit_mask`` (when given) are 0, as ``x̂ = x`` there by definition.
    """
    x = np.asarray(image)
    xh = np.asarray(normal)
    check_same_shape(("image", x), ("normal image", xh))
    out = (x.astype(np.float32) - xh.astype(np.float32)) / np.float32(255.0)
    if edit_mask is not None:
        edit = as_mask(edit_mask, "edit mask")
        check_same_shape(("image", x), ("edit mask", edit))
        out[~edit] = 0.0
    return out


def anomaly_mask(anomaly: np.ndarray, tau_ano: float) -> np.ndarray:
    """``A = {x_ano ≥ τ_ano}`` (bool)."""
    a = np.asarray(anomaly)
    if a.ndim != 2:
        raise ValueError(f"anomaly map must be 2-D, got shape {a.shape}")
    return a >= np.float32(tau_ano)
