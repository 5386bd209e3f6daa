"""Normal image from the learned lesion segmenter (``--synthesizer lesion-unet``): the film with its lesions taken
out, so the ILS §8 anomaly map is the segmenter's lesion probability.

``x̂ = x − 255 · a`` with ``a = scale · p / t`` inside the lungs minus the heart outline and the mediastinum
(:func:`cxrground.lesions.lesion_zones.lesion_field`), 0 where ``p < floor · t`` (``p``: the shipped
``lesion_unet_v1``'s probability, ``t``: its pixel threshold). With the default ``scale`` 0.10 a pixel at the
segmenter's own threshold sits exactly at Table 7's general ``τ_ano``; ``a`` never exceeds ``x/255`` (x̂ ≥ 0).
Pixels outside the lungs, on the heart and in the mediastinum keep ``x̂ = x``: no lung-lesion signal there. The
built-in ``anomaly`` detector gets a strength midpoint of 0.10 with this map (``DETECTOR_DEFAULTS``).

The build also asks this backend (:meth:`LesionUNetSynthesizer.evidence`) for the image check of its pairs and clips
lung-lesion masks off the heart and mediastinum (``EXCLUDES_CENTRE``); see :mod:`cxrground.ils.image_check`. With
``zone_reader=zone_sim_v1`` the check of negatives also uses the shipped zone reader's flags.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from cxrground.errors import ConfigError
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.lesions.lesion_zones import central_mask
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS, NormativeModel
from cxrground.lesions.segmenter import LesionSegmenter, load_lesion_segmenter
from cxrground.lesions.zone_classifier import SHIPPED_ZONE_READER, ZoneClassifier, shipped_zone_reader_path
from cxrground.lesions.zone_features import feature_columns, film_zone_features

__all__ = ["LesionEvidence", "LesionUNetSynthesizer"]


@functools.cache
def _zone_models() -> tuple[NormativeModel, ZoneClassifier]:
    """The shipped normative model and zone reader (loaded once per process)."""
    return NormativeModel.load(), ZoneClassifier.load(shipped_zone_reader_path())


@dataclass(frozen=True, eq=False)
class LesionEvidence:
    """The segmenter's reading of one canvas: probability, its pixel threshold and the heart + mediastinum."""

    probability: np.ndarray
    threshold: float
    centre: np.ndarray
    zone_flags: dict[str, bool] | None = None
    """Brixia zones A–F flagged by the optional zone reader (``zone_reader``); None when not used."""


@dataclass
class LesionUNetSynthesizer:
    """Normal image = film minus the lesion segmenter's lesions (lungs only, heart and mediastinum excluded)."""

    weights: str | None = None
    """A lesion U-Net ``.safetensors`` (its ``.json`` beside it); None: the shipped ``lesion_unet_v1``."""
    scale: float = 0.10
    """Anomaly at ``p = t`` (the pixel threshold of the weights)."""
    floor: float = 0.5
    """Probabilities below ``floor · t`` give no anomaly."""
    threads: int = 1
    zone_reader: str = "none"
    """``none``, or ``zone_sim_v1``: negatives are also checked against the shipped zone reader's flags."""
    _last: tuple[str, LesionEvidence] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    name = "lesion-unet"
    DETECTOR_DEFAULTS: ClassVar[dict[str, dict[str, Any]]] = {"anomaly": {"strength_mid": 0.10}}
    #: Lung-lesion masks of this backend are clipped off the heart outline and the mediastinum.
    EXCLUDES_CENTRE: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.scale <= 0 or not 0 <= self.floor <= 1:
            raise ConfigError(f"lesion-unet needs scale > 0 and floor in [0, 1], got {self.scale}, {self.floor}")
        if self.zone_reader not in ("none", SHIPPED_ZONE_READER):
            raise ConfigError(f"lesion-unet zone_reader must be none or {SHIPPED_ZONE_READER}, "
                              f"got {self.zone_reader!r}")

    def _segmenter(self) -> LesionSegmenter:
        return load_lesion_segmenter(self.weights, self.threads)

    def evidence(self, image: np.ndarray, regions: Sequence[np.ndarray]) -> LesionEvidence:
        """The segmenter's probability on ``image`` with the heart + mediastinum of ``regions`` (right, left,
        heart); cached for the last canvas, so the build's image check reuses the synthesis' reading."""
        x = np.asarray(image)
        right, left = as_mask(regions[0], "right lung"), as_mask(regions[1], "left lung")
        heart = as_mask(regions[2], "heart") if len(regions) > 2 and regions[2] is not None else None
        key = hashlib.sha1(x.tobytes() + right.tobytes() + left.tobytes()
                           + (heart.tobytes() if heart is not None else b"")).hexdigest()
        with self._lock:
            if self._last is not None and self._last[0] == key:
                return self._last[1]
        seg = self._segmenter()
        flags = self._zone_flags(x, right, left) if self.zone_reader != "none" else None
        ev = LesionEvidence(seg.probability(x), seg.threshold, central_mask(right, left, heart), flags)
        with self._lock:
            self._last = (key, ev)
        return ev

    def _zone_flags(self, x: np.ndarray, right: np.ndarray, left: np.ndarray) -> dict[str, bool]:
        """The shipped zone reader's flags A–F on this canvas (shipped normative model)."""
        model, clf = _zone_models()
        feats, _ = film_zone_features(model, x, right, left)
        prob = clf.probability(feats[:, feature_columns(clf.feature_names)])
        return {z: bool(p >= clf.threshold) for z, p in zip(BRIXIA_ZONE_LABELS, prob, strict=True)}

    def synthesize(self, image: np.ndarray, edit_mask: np.ndarray,
                   regions: Sequence[np.ndarray] | None = None) -> np.ndarray:
        """``x̂`` (uint8, same shape); equal to ``image`` outside ``edit_mask ∩ lungs`` minus the centre."""
        x = np.asarray(image)
        edit = as_mask(edit_mask, "edit mask")
        check_same_shape(("image", x), ("edit mask", edit))
        if regions is None or len(regions) < 2:
            raise ConfigError("the lesion-unet synthesizer needs the lung masks (regions=(right, left[, heart]))")
        ev = self.evidence(x, regions)
        lungs = (as_mask(regions[0], "right lung") | as_mask(regions[1], "left lung")) & edit & ~ev.centre
        p = ev.probability
        a = np.where(lungs & (p >= self.floor * ev.threshold), self.scale * p / ev.threshold, 0.0)
        xf = x.astype(np.float64)
        out = xf - np.minimum(255.0 * a, xf)
        return np.clip(np.round(out), 0, 255).astype(np.uint8)

    def provenance(self) -> dict[str, Any]:
        """Backend name, settings and the segmenter's weights (name, sha256, threshold)."""
        return {"name": self.name, "settings": {"scale": self.scale, "floor": self.floor,
                                                "zone_reader": self.zone_reader},
                "model": self._segmenter().provenance(),
                "method": "x̂ = x − 255·scale·p/t in the lungs minus heart and mediastinum (p ≥ floor·t)"}
