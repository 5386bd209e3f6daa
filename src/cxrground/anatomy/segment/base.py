"""Interface of lung/heart segmentation backends (built-in U-Net, CXAS, HybridGNet, given masks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

import numpy as np

from cxrground.errors import BackendError, MaskError
from cxrground.io.image import CXRImage, as_cxr_image
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.registry import backend_label, call_backend

__all__ = ["HEART_SOURCES", "HeartSource", "LungHeartMasks", "LungHeartSegmenter", "segment_image"]

HeartSource = Literal["model", "estimate", "truth", "none"]
#: The values :attr:`LungHeartMasks.heart_source` may have.
HEART_SOURCES: tuple[str, ...] = get_args(HeartSource)


@dataclass(frozen=True, eq=False)
class LungHeartMasks:
    """Right lung, left lung and heart at the image's native size (right lung = image left), kept as bool masks
    (bool, or 0/1 or 0/255 numbers, given); anything else, masks that differ in shape, a ``heart_source`` not in
    :data:`HEART_SOURCES` or a ``source`` that is not text is a :class:`~cxrground.errors.MaskError`."""

    right_lung: np.ndarray
    left_lung: np.ndarray
    heart: np.ndarray | None
    heart_source: HeartSource
    """``estimate`` when the heart was derived from the lung geometry rather than segmented."""
    source: str
    """Backend that produced the lungs."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        named = [("right lung mask", as_mask(self.right_lung, "right lung mask")),
                 ("left lung mask", as_mask(self.left_lung, "left lung mask"))]
        if self.heart is not None:
            named.append(("heart mask", as_mask(self.heart, "heart mask")))
        check_same_shape(*named)
        for attr, (_, mask) in zip(("right_lung", "left_lung", "heart"), named, strict=False):
            object.__setattr__(self, attr, mask)
        if self.heart_source not in HEART_SOURCES:
            raise MaskError(f"heart_source {self.heart_source!r} is not one of {', '.join(HEART_SOURCES)}")
        if not isinstance(self.source, str):
            raise MaskError(f"source {self.source!r} is not text (the name of the backend that made the lungs)")

    @property
    def shape(self) -> tuple[int, int]:
        """``(H, W)``."""
        return int(self.right_lung.shape[0]), int(self.right_lung.shape[1])


class LungHeartSegmenter(Protocol):
    """Segments the lungs (and the heart, or estimates it) of a frontal CXR."""

    name: str

    def segment(self, image: CXRImage) -> LungHeartMasks:
        """Masks at the image's native size."""
        ...

    def provenance(self) -> dict[str, Any]:
        """Backend name, version, weights path and sha256, settings."""
        ...


def segment_image(segmenter: LungHeartSegmenter, image: CXRImage | str | Path | np.ndarray) -> LungHeartMasks:
    """``segmenter``'s masks of ``image`` (a :class:`CXRImage`, a file path or 2-D uint8 pixels: see
    :func:`~cxrground.io.image.as_cxr_image`); a :class:`~cxrground.errors.BackendError` naming the segmenter when it
    fails with an error of its own, builds malformed masks (not binary, shapes that differ, an unknown
    ``heart_source`` or a ``source`` that is not text) or returns anything but :class:`LungHeartMasks` at the image's
    size."""
    image = as_cxr_image(image)
    try:
        masks = call_backend("segmenter", segmenter, "segment", LungHeartMasks, "LungHeartMasks", image)
    except MaskError as exc:
        if exc.path is not None:  # a mask file it was given (e.g. the masks segmenter): the file is named
            raise
        # in-memory masks it built its LungHeartMasks from: the backend's fault
        raise BackendError(f"{backend_label('segmenter', segmenter)} returned unusable masks: {exc}") from exc
    size = tuple(int(v) for v in image.pixels.shape[:2])
    if masks.shape != size:
        raise BackendError(f"{backend_label('segmenter', segmenter)} returned masks of {masks.shape} for a {size} "
                           "image (masks must be at the image's native size)")
    return masks
