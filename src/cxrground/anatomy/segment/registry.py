"""Backends by name: :data:`SEGMENTERS` and :func:`get_segmenter`."""

from __future__ import annotations

from typing import Any

from cxrground.anatomy.segment.adapters import CXASSegmenter, HybridGNetSegmenter
from cxrground.anatomy.segment.base import LungHeartSegmenter
from cxrground.anatomy.segment.builtin import GivenMasksSegmenter, UNetLungSegmenter
from cxrground.anatomy.segment.folder import MaskFolderSegmenter
from cxrground.errors import ConfigError

__all__ = ["SEGMENTERS", "get_segmenter"]

#: Name → backend class. ``unet``: the shipped lung U-Net (heart estimated); ``given``: supplied masks;
#: ``masks``: PNG masks found by a name pattern;
#: ``cxas``: the CXAS package; ``hybridgnet``: a CheXmask HybridGNet checkpoint supplied by the user.
SEGMENTERS: dict[str, type] = {
    "unet": UNetLungSegmenter,
    "given": GivenMasksSegmenter,
    "masks": MaskFolderSegmenter,
    "cxas": CXASSegmenter,
    "hybridgnet": HybridGNetSegmenter,
}


def get_segmenter(name: str, **kwargs: Any) -> LungHeartSegmenter:
    """Construct the backend called ``name`` with ``kwargs``; unknown names raise :class:`ConfigError`."""
    try:
        cls = SEGMENTERS[name]
    except KeyError:
        raise ConfigError(f"unknown segmenter {name!r}; choose one of {sorted(SEGMENTERS)}") from None
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"bad options for segmenter {name!r}: {exc}") from exc
