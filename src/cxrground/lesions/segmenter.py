"""The learned lesion segmenter: a small U-Net that gives every pixel of a film a probability of lung opacity.

Trained on lesions inserted into real NIH films by :mod:`cxrground.lesions.lesion_sim` (exact pixel truth; recipe
and rebuild command in :mod:`cxrground.lesions.segmenter_fit`). It reads the whole film, not the lungs alone: the
caller decides where a lesion may be (lungs, not heart or mediastinum). The architecture and file format are the
lung U-Net's (:mod:`cxrground.anatomy.segment.unet`), with one output class ``lesion``.

:class:`LesionSegmenter` loads the shipped ``lesion_unet_v1`` (or a file) once and returns probability maps at the
film's native size; its sidecar's ``threshold`` is the pixel threshold chosen on held-out simulated films.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.anatomy.segment.unet import load_model, predict_logits, prepare_input
from cxrground.errors import ConfigError, InputError

__all__ = ["LESION_UNET", "LesionSegmenter", "load_lesion_segmenter", "shipped_lesion_unet_path"]

#: File stem of the shipped weights under ``cxrground/lesions/weights/``.
LESION_UNET: Final[str] = "lesion_unet_v1"


def shipped_lesion_unet_path() -> Path:
    """Path of the shipped ``lesion_unet_v1.safetensors`` (its ``.json`` sidecar beside it)."""
    return Path(str(resources.files("cxrground.lesions") / "weights" / f"{LESION_UNET}.safetensors"))


class LesionSegmenter:
    """Pixel probability of a lung lesion (opacity, consolidation, effusion) on a grey film."""

    def __init__(self, weights: str | Path | None = None, threads: int | None = 1) -> None:
        path = Path(weights) if weights else shipped_lesion_unet_path()
        if not path.with_suffix(".safetensors").is_file():
            raise ConfigError(f"lesion segmenter weights {path} not found")
        self.path = path
        self.model, self.meta = load_model(path)
        if list(self.meta.get("classes", [])) != ["lesion"]:
            raise ConfigError(f"{path}: not a lesion segmenter (classes {self.meta.get('classes')})")
        self.size = int(self.meta["architecture"]["input_size"])
        self.threshold = float(self.meta.get("threshold", 0.5))
        self.threads = threads

    def probability(self, pixels: np.ndarray) -> np.ndarray:
        """float32 ``(H, W)`` probabilities in [0, 1] for an 8-bit grey film ``(H, W)``."""
        img = np.asarray(pixels)
        if img.ndim != 2 or min(img.shape) < 8:
            raise InputError(f"lesion segmenter needs a 2-D grey image, got shape {img.shape}")
        canvas, box = prepare_input(img, self.size)
        logits = predict_logits(self.model, canvas[None], self.threads)[0, 0]
        native = box.logits_to_native(logits)
        return (1.0 / (1.0 + np.exp(-native.astype(np.float64)))).astype(np.float32)

    def provenance(self) -> dict[str, Any]:
        """Name, file, sha256 and threshold of the loaded weights."""
        return {"name": self.meta.get("name"), "weights": str(self.path), "sha256": self.meta.get("sha256"),
                "threshold": self.threshold}


@functools.lru_cache(maxsize=4)
def load_lesion_segmenter(weights: str | None = None, threads: int | None = 1) -> LesionSegmenter:
    """A cached :class:`LesionSegmenter` (weights loaded once per process)."""
    return LesionSegmenter(weights, threads)
