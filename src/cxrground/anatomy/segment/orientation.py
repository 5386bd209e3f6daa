"""Is this film upside down? A check the lung-shape QC cannot make.

A lung U-Net draws upright-shaped lungs even on a film stored upside down (turned 180°), so
:func:`~cxrground.anatomy.segment.plausibility.segment_checked` passes most such films: 644 of the pack's 826 films
turned 180° pass it (``bench/orientation.py``). What does differ is how sure the U-Net is: on an upright film it
reads the lungs more confidently, and more lung-shaped, than in the same film turned 180°.
:func:`orientation_evidence` segments the film both ways round on a small grid and compares the two readings; the
film looks upside down when the turned film wins on both (:attr:`OrientationEvidence.upside_down`). Read after the
lung checks, as ``ils build --qc-orientation`` does, it flags 2 of the 819 upright pack films that pass them (0.2 %)
and 620 of the 644 turned films that pass them (96.3 %), leaving 24 of 826 turned films undetected.

It needs a segmenter that exposes its probabilities (the built-in U-Net); it costs two more U-Net passes per film.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from cxrground.anatomy.segment.plausibility import shipped_lung_shape
from cxrground.io.cxr_image import CXRImage

__all__ = ["ORIENTATION_GRID", "OrientationEvidence", "orientation_evidence", "upside_down_problem"]

#: The grid (rows, columns) the two readings are made on.
ORIENTATION_GRID: Final[tuple[int, int]] = (256, 256)


@dataclass(frozen=True)
class OrientationEvidence:
    """The U-Net's reading of a film as stored and turned 180°: confidence (mean lung probability where it calls
    lung) and shape IoU with the mean annotated lungs (0 when a lung is missing)."""

    confidence: float
    turned_confidence: float
    shape_iou: float
    turned_shape_iou: float

    @property
    def upside_down(self) -> bool:
        """The turned film reads as lungs both more confidently and more lung-shaped."""
        return self.turned_confidence > self.confidence and self.turned_shape_iou > self.shape_iou


def _reading(segmenter: Any, pixels: np.ndarray, image: CXRImage) -> tuple[float, float]:
    """(confidence, shape IoU) of the segmenter's lungs on ``pixels``."""
    from cxrground.anatomy.segment.builtin import postprocess_lungs

    p_right, p_left, _ = segmenter.probabilities(dataclasses.replace(image, pixels=pixels), ORIENTATION_GRID)
    right, left = postprocess_lungs(p_right, p_left, segmenter.threshold)
    iou = shipped_lung_shape().iou(right, left) if right.any() and left.any() else 0.0
    p = np.maximum(p_right, p_left)
    lung = p > 0.5
    return (float(p[lung].mean()) if lung.any() else 0.0), float(iou)


def orientation_evidence(segmenter: Any, image: CXRImage) -> OrientationEvidence | None:
    """The film read as stored and turned 180°, or None when the segmenter does not expose probabilities."""
    if not callable(getattr(segmenter, "probabilities", None)):
        return None
    conf, iou = _reading(segmenter, image.pixels, image)
    turned_conf, turned_iou = _reading(segmenter, np.ascontiguousarray(image.pixels[::-1, ::-1]), image)
    return OrientationEvidence(conf, turned_conf, iou, turned_iou)


def upside_down_problem(segmenter: Any, image: CXRImage) -> str | None:
    """Why the film looks upside down, or None (also when the segmenter cannot tell)."""
    ev = orientation_evidence(segmenter, image)
    if ev is None or not ev.upside_down:
        return None
    return (f"film looks upside down: its lungs read more confidently ({ev.turned_confidence:.3f} vs "
            f"{ev.confidence:.3f}) and more lung-shaped (shape IoU {ev.turned_shape_iou:.2f} vs {ev.shape_iou:.2f}) "
            "with the film turned 180°; store it upright")
