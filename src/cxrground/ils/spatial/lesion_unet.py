"""Normal image from the learned lesion segmenter (``--synthesizer lesion-unet``): the film with its lesions taken
out, so the ILS §8 anomaly map is the segmenter's lesion probability.

``x̂ = x − 255 · a`` with ``a = scale · p / t`` inside the lungs minus the heart outline and the mediastinum
(:func:`cxrground.lesions.lesion_zones.lesion_field`), 0 where ``p < floor · t`` (``p``: the shipped
``lesion_unet_v1``'s probability, ``t``: its pixel threshold). With the default ``scale`` 0.10 a pixel at the
segmenter's own threshold sits exactly at Table 7's general ``τ_ano``; ``a`` never exceeds ``x/255`` (x̂ ≥ 0).
Pixels outside the lungs, on the heart and in the mediastinum keep ``x̂ = x``: no lung-lesion signal there. The
built-in ``anomaly`` detector gets a strength midpoint of 0.10 with this map (``DETECTOR_DEFAULTS``).

The build also asks this backend (:meth:`LesionUNetSynthesizer.evidence`) for the image check of its pairs and clips
lung-lesion masks off the heart and mediastinum (``EXCLUDES_CENTRE``); see :mod:`cxrground.ils.image_check`.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from cxrground.errors import ConfigError
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.lesions.lesion_zones import central_mask
from cxrground.lesions.segmenter import LesionSegmenter, load_lesion_segmenter

__all__ = ["LesionEvidence", "LesionUNetSynthesizer"]


@dataclass(frozen=True, eq=False)
class LesionEvidence:
    """The segmenter's reading of one canvas: probability, its pixel threshold and the heart + mediastinum."""

    probability: np.ndarray
    threshold: float
    centre: np.ndarray


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
    _last: tuple[str, LesionEvidence] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    name = "lesion-unet"
    DETECTOR_DEFAULTS: ClassVar[dict[str, dict[str, Any]]] = {"anomaly": {"strength_mid": 0.10}}
    #: Lung-lesion masks of this backend are clipped off the heart outline and the mediastinum.
    EXCLUDES_CENTRE: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.scale <= 0 or not 0 <= self.floor <= 1:
            raise ConfigError(f"lesion-unet needs scale > 0 and floor in [0, 1], got {self.scale}, {self.floor}")

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
        ev = LesionEvidence(seg.probability(x), seg.threshold, central_mask(right, left, heart))
        with self._lock:
            self._last = (key, ev)
        return ev

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
        return {"name": self.name, "settings": {"scale": self.scale, "floor": self.floor},
                "model": self._segmenter().provenance(),
                "method": "x̂ = x − 255·scale·p/t in the lungs minus heart and mediastinum (p ≥ floor·t)"}
