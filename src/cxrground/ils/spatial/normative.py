"""The default normal-image estimate of ``ils build``: a normative model of the normal chest (``normative``).

:class:`NormativeSynthesizer` (``normative``) uses a :class:`cxrground.lesions.normative.NormativeModel`: by
default (``model=cohort``) the one ``ils build`` fits on the build's own report-normal studies before any study
is processed (:mod:`cxrground.ils.cohort_normative`), else the shipped ``normative_v1`` (``model=shipped``,
learned from NIH normal films) or a model file (``model=PATH``). Inside each lung, the normal image ``x̂`` is
the film with everything brighter than the top of the normal band removed,

``x̂ = x − E``, ``E = max(0, S − U)``, ``U = lo + (median(v, u) + k · scale(v, u)) · span``,

where ``S`` is the smoothed film, ``(v, u)`` the lung-shape coordinates, ``lo`` / ``span`` the film's
aerated-lung level and lung-to-mediastinum span, and ``k`` = ``band`` (default 0: the normal image is the
per-location normal median wherever the film is brighter; before issue 14 it was 2 robust standard deviations).
The built-in ``anomaly`` detector gets a strength midpoint of 0.14 with this synthesizer (``DETECTOR_DEFAULTS``).
Excess below ``noise_floor`` grey levels is set to 0, so ``x̂ = x`` wherever the lung is within normal
limits, and the ILS §8 anomaly map ``(x − x̂)/255`` is the part of the film that no normal film shows at
that place. Regions that are not lung (the heart) and films without both lungs fall back to the
pseudo-normal estimate (:class:`.pseudo_normal.PseudoNormalSynthesizer`), as does everything when
``regions`` is not given.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from scipy import ndimage

from cxrground.errors import ConfigError
from cxrground.ils.spatial.pseudo_normal import PseudoNormalSynthesizer
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.lesions.normative import NORMATIVE_METHOD, SMOOTH_FRACTION, NormativeModel

__all__ = ["COHORT", "SHIPPED", "NormativeSynthesizer"]

#: ``model`` values: fitted by the build on its report-normal studies, or the shipped ``normative_v1``.
COHORT = "cohort"
SHIPPED = "shipped"


@dataclass
class NormativeSynthesizer:
    """Normal image from the normative model inside the lungs; pseudo-normal elsewhere."""

    model: str = COHORT
    """``cohort``: fitted by ``ils build`` on the build's report-normal studies (``OUT/normative_fitted.npz``);
    ``shipped``: ``normative_v1``; else the path of a normative ``.npz``."""
    band: float = 0.0
    """Top of the normal band in robust standard deviations above the per-location median (0: the median, a
    normal film's typical level; chosen with the detector's strength on NIH films, ``bench/ils_normal_band.py``)."""
    noise_floor: float = 3.0
    """Excess below this many grey levels counts as normal (x̂ = x there)."""
    min_normals: int = 10
    """``cohort``: fewer report-normal studies with both lungs than this and the build uses the shipped model (the
    relative standard error of a scaled MAD is about ``sqrt(1.36 / n)``: 37 % at 10 films)."""
    max_normals: int = 200
    """``cohort``: at most this many report-normal studies are read (drawn in a seeded order)."""
    shrink: bool = True
    """``cohort``: shrink the cohort statistics toward the shipped model by their noise (empirical Bayes)."""
    trim: str = "cohort"
    """``cohort``: leave out report-normal films that do not look normal: ``cohort`` (their zone score under the
    fit on all of them exceeds the shipped zone threshold), ``prior`` (under the shipped model), ``off``."""
    fitted: str | None = None
    """Set by the build for ``cohort``: the fitted model file."""
    sha256: str | None = None
    """When set, the model file must have this sha256 (the build pins the file it fitted)."""
    _model: NormativeModel | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    name = "normative"
    #: Built-in detector settings for this anomaly map (:func:`cxrground.ils.spatial.detector_defaults`; the user's
    #: detector options win): the excess over the normal median is weaker than the pseudo-normal residue the
    #: detector was calibrated on, so its strength midpoint is lower (Youden's J on NIH opacity-labelled vs
    #: out-of-fold No Finding films, ``bench/ils_normal_band.py``; 0.14 and 0.10 tie, the one nearer 0.26 kept).
    DETECTOR_DEFAULTS: ClassVar[dict[str, dict[str, Any]]] = {"anomaly": {"strength_mid": 0.14}}

    def model_path(self) -> Path | None:
        """The model file to read (None: the shipped one); ``cohort`` before the build fitted it is an error."""
        if self.model == COHORT:
            if self.fitted is None:
                raise ConfigError("normative model=cohort is fitted by `ils build` on the build's report-normal "
                                  "studies; outside a build use model=shipped or model=PATH")
            return Path(self.fitted)
        return None if self.model == SHIPPED else Path(self.model)

    def _ensure(self) -> NormativeModel:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    model = NormativeModel.load(self.model_path())
                    if self.sha256 and model.meta.get("sha256") != self.sha256:
                        raise ConfigError(f"normative model {model.meta.get('path')} is not the file this build "
                                          f"fitted (sha256 {model.meta.get('sha256')} != {self.sha256})")
                    self._model = model
        return self._model

    def synthesize(self, image: np.ndarray, edit_mask: np.ndarray,
                   regions: Sequence[np.ndarray] | None = None) -> np.ndarray:
        """``x̂`` (uint8, same shape); pixels outside ``edit_mask`` equal ``image``.

        ``regions`` = ``(right_lung, left_lung[, heart])``; the lungs get the normative estimate.
        """
        x = np.asarray(image)
        edit = as_mask(edit_mask, "edit mask")
        check_same_shape(("image", x), ("edit mask", edit))
        if regions is None or len(regions) < 2:
            return PseudoNormalSynthesizer().synthesize(x, edit, regions)
        right = as_mask(regions[0], "right lung") & edit
        left = as_mask(regions[1], "left lung") & edit & ~right
        if not right.any() or not left.any():
            return PseudoNormalSynthesizer().synthesize(x, edit, regions)
        base = PseudoNormalSynthesizer().synthesize(x, edit & ~(right | left), regions[2:])
        upper = self._ensure().normal_upper(x, right, left, self.band)
        lungs = right | left
        smooth = ndimage.gaussian_filter(x.astype(np.float64), SMOOTH_FRACTION * max(x.shape))
        excess = np.where(lungs, np.maximum(smooth - np.nan_to_num(upper, nan=np.inf), 0.0), 0.0)
        excess[excess < self.noise_floor] = 0.0
        out = np.where(lungs, x.astype(np.float64) - excess, base.astype(np.float64))
        return np.clip(np.round(out), 0, 255).astype(np.uint8)

    def provenance(self) -> dict[str, Any]:
        """Backend name, method, settings and the model file's sha256 and training summary (a fitted cohort
        model is named by its file name, so the record does not depend on the output folder)."""
        model = self._ensure().provenance()
        if self.model == COHORT:
            model = {**model, "path": Path(model["path"]).name if model.get("path") else None,
                     "source": self._model.meta.get("source") if self._model else None}
        settings: dict[str, Any] = {"band": self.band, "noise_floor": self.noise_floor, "model": self.model}
        if self.model == COHORT:
            settings.update(min_normals=self.min_normals, max_normals=self.max_normals, shrink=self.shrink,
                            trim=self.trim)
        return {"name": self.name, "method": NORMATIVE_METHOD, "settings": settings, "model": model,
                "fallback": "pseudo-normal outside the lungs"}
