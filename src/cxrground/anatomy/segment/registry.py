"""Backends by name: :data:`SEGMENTERS` and :func:`get_segmenter`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from cxrground.anatomy.segment.adapters import CXASSegmenter, HybridGNetSegmenter
from cxrground.anatomy.segment.base import LungHeartSegmenter
from cxrground.anatomy.segment.builtin import GivenMasksSegmenter, UNetLungSegmenter
from cxrground.anatomy.segment.folder import MaskFolderSegmenter
from cxrground.errors import ConfigError
from cxrground.registry import Registry

__all__ = ["SEGMENTERS", "TORCH_WEIGHTS", "WEIGHTS_OPTION", "get_segmenter", "segmenter_settings", "weights_options"]

#: What the networks read with torch need: torch and the weights format (the 'models' extra).
TORCH_WEIGHTS: Final[tuple[str, ...]] = ("torch", "safetensors")

#: Lung/heart segmentation backends by name (the classes load their networks lazily).
SEGMENTERS: Final[Registry[LungHeartSegmenter]] = Registry("segmenter")
SEGMENTERS.register("unet", UNetLungSegmenter, help="the shipped lung U-Net, heart estimated from the lungs",
                    needs=TORCH_WEIGHTS)
SEGMENTERS.register("given", GivenMasksSegmenter,
                    help="masks supplied per image (Python API; segment lungs --right/--left)")
SEGMENTERS.register("masks", MaskFolderSegmenter, help="mask PNGs found in a folder by a name pattern (root=DIR)")
SEGMENTERS.register("cxas", CXASSegmenter, help="the CXAS network, local weights folder (weights_dir=DIR)", gpu=True,
                    needs=("torch",))
SEGMENTERS.register("hybridgnet", HybridGNetSegmenter, gpu=True, needs=("torch",),
                    help="CheXmask HybridGNet, local weights (weights_path=FILE: bestMSE.pt or an exported model)")

#: The option through which a backend takes its weights file or folder (``segment lungs --weights``).
WEIGHTS_OPTION: Final[dict[str, str]] = {"unet": "weights", "hybridgnet": "weights_path", "cxas": "weights_dir"}


def get_segmenter(name: str, **kwargs: Any) -> LungHeartSegmenter:
    """Construct the backend called ``name`` with ``kwargs`` (checked by :data:`SEGMENTERS`)."""
    return SEGMENTERS.create(name, **kwargs)


def weights_options(name: str, weights: str | Path | None) -> dict[str, Any]:
    """``{option: weights}`` for backend ``name`` (empty without weights); a backend without weights is refused."""
    if weights is None:
        return {}
    SEGMENTERS.get(name)
    if name not in WEIGHTS_OPTION:
        raise ConfigError(f"segmenter {name!r} takes no weights; backends with weights: {', '.join(WEIGHTS_OPTION)}")
    return {WEIGHTS_OPTION[name]: weights}


def segmenter_settings(segmenter: LungHeartSegmenter) -> dict[str, Any]:
    """What decides a segmenter's masks (its provenance without the weights' path, metrics and training summary),
    JSON-ready: two runs with other options or weights differ here."""
    prov = segmenter.provenance() if hasattr(segmenter, "provenance") else {"backend": segmenter.name}
    kept = {k: v for k, v in prov.items() if k not in ("weights", "metrics", "training_data")}
    return json.loads(json.dumps(kept, default=str, sort_keys=True))
