"""Masks read from files next to the images: the synthetic cohort's truth, the pack's lung masks, or
another tool's output written as PNGs.

``pattern`` is formatted per image and mask with ``{study}`` (the image's parent folder name, the
study id in the MIMIC-CXR layout), ``{stem}`` (the image file name without suffix) and ``{name}``
(``right_lung``, ``left_lung``, ``heart``). Examples: the synthetic cohort
``masks/{study}/{name}.png`` under the cohort folder; the pack ``{stem}_{name}.png`` under
``cohen/masks`` (no heart: it is estimated from the lungs and labelled so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cxrground.anatomy.segment.base import HeartSource, LungHeartMasks
from cxrground.anatomy.segment.builtin import heart_from_lungs
from cxrground.anatomy.segment.heart import HEART_METHOD
from cxrground.anatomy.segment.heart_image import SEEN_HEART_METHOD
from cxrground.errors import InputError
from cxrground.io.image import CXRImage
from cxrground.io.masks import read_mask_png

__all__ = ["MaskFolderSegmenter"]


class MaskFolderSegmenter:
    """Lung (and optional heart) masks from PNG files found by a name pattern."""

    name = "masks"

    def __init__(self, root: str | Path, pattern: str = "{study}/{name}.png", estimate_heart: bool = True,
                 seen_heart: bool = True) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise InputError("mask folder not found", self.root)
        self.pattern = pattern
        self.estimate_heart = estimate_heart if not isinstance(estimate_heart, str) else estimate_heart != "false"
        self.seen_heart = seen_heart if not isinstance(seen_heart, str) else seen_heart != "false"

    def _path(self, image: CXRImage, name: str) -> Path:
        if image.path is None:
            raise InputError("MaskFolderSegmenter needs the image's path")
        p = Path(image.path)
        return self.root / self.pattern.format(study=p.parent.name, stem=p.stem, name=name)

    def segment(self, image: CXRImage) -> LungHeartMasks:
        """Masks of ``image`` read from the folder, checked against its size."""
        right = read_mask_png(self._path(image, "right_lung"), image.shape)
        left = read_mask_png(self._path(image, "left_lung"), image.shape)
        heart_path = self._path(image, "heart")
        heart, source, extra = None, "none", {}
        if heart_path.is_file():
            heart, source = read_mask_png(heart_path, image.shape), "truth"
        elif self.estimate_heart:
            heart, info = heart_from_lungs(right, left, pixels=image.pixels if self.seen_heart else None)
            source, extra = ("estimate" if heart is not None else "none"), {"heart_estimate": info}
        src: HeartSource = source  # type: ignore[assignment]
        return LungHeartMasks(right, left, heart, src, f"masks:{self.root.name}", extra)

    def provenance(self) -> dict[str, Any]:
        """Backend, folder and pattern."""
        return {"backend": self.name, "root": str(self.root), "pattern": self.pattern,
                "heart_method": (f"{HEART_METHOD}+{SEEN_HEART_METHOD}" if self.seen_heart else HEART_METHOD)
                if self.estimate_heart else None}
