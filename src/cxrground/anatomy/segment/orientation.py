"""Is this film stored in a wrong pose (upside down, flipped, turned 90°)? A check the lung-shape QC cannot make.

A lung U-Net draws upright-shaped lungs on many films stored in a wrong pose, so
:func:`~cxrground.anatomy.segment.plausibility.segment_checked` passes them: 644 of the pack's 826 films turned
180° pass it, and 633 flipped top-bottom (``bench/orientation.py``). What does differ is how sure the U-Net is: on
an upright film it reads the lungs more confidently, and more lung-shaped, than in the same film put in another
pose. :func:`orientation_evidence` reads the film as stored and after each correction of :data:`POSES` on a small
grid; the film looks wrongly posed when some correction wins on both (:attr:`OrientationEvidence.best_correction`).
:func:`orientation_problem` tries :data:`CHECKED_POSES`: on the pack it flags 97 % of the films turned 180° that pass
the lung checks, 96 % of those flipped top-bottom, 95 % of those turned 90°, and 2 of 819 upright films (0.2 %). A
film mirrored left-right is not detected: the U-Net reads it as well as the film itself (the pose reader,
:mod:`~cxrground.anatomy.segment.pose_net`, finds most of them, as a warning).

The readings come from the segmenter when it exposes its probabilities (the built-in U-Net), else from the shipped
built-in U-Net, whatever segmenter drew the masks; each pose costs one U-Net pass on the small grid.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from cxrground.anatomy.segment.plausibility import shipped_lung_shape
from cxrground.io.cxr_image import CXRImage

__all__ = ["CHECKED_POSES", "ORIENTATION_GRID", "POSES", "OrientationEvidence", "Reading", "lung_reading",
           "orientation_evidence", "orientation_problem", "pose_pixels"]

#: The grid (rows, columns) the readings are made on.
ORIENTATION_GRID: Final[tuple[int, int]] = (256, 256)

#: The corrections tried, by name: each maps the stored pixels to the film put right, were it stored the other way.
POSES: Final[Mapping[str, Callable[[np.ndarray], np.ndarray]]] = {
    "turned 180°": lambda p: p[::-1, ::-1],
    "mirrored left-right": lambda p: p[:, ::-1],
    "flipped top-bottom": lambda p: p[::-1, :],
    "turned 90° clockwise": lambda p: np.rot90(p, -1),
    "turned 90° counter-clockwise": lambda p: np.rot90(p, 1),
}

#: The corrections :func:`orientation_problem` tries: each catches at least 80 % of the pack's films stored in its
#: pose that pass the lung checks (``bench/orientation.py``). Mirrored left-right (63 %, and it flags 45 upright
#: films) and turned 90° counter-clockwise (75 %) do not: a mirrored film is not detected.
CHECKED_POSES: Final[tuple[str, ...]] = ("turned 180°", "flipped top-bottom", "turned 90° clockwise")


def pose_pixels(pixels: np.ndarray, correction: str) -> np.ndarray:
    """``pixels`` after the named correction of :data:`POSES` (a contiguous copy)."""
    return np.ascontiguousarray(POSES[correction](pixels))


@dataclass(frozen=True)
class Reading:
    """The U-Net's reading of a film in one pose: confidence (mean lung probability where it calls lung) and shape
    IoU with the mean annotated lungs (0 when a lung is missing)."""

    confidence: float
    shape_iou: float

    def beaten_by(self, other: Reading) -> bool:
        """``other`` reads as lungs both more confidently and more lung-shaped."""
        return other.confidence > self.confidence and other.shape_iou > self.shape_iou


@dataclass(frozen=True)
class OrientationEvidence:
    """The film read as stored and after each correction tried."""

    stored: Reading
    corrected: Mapping[str, Reading]

    @property
    def best_correction(self) -> str | None:
        """The correction that beats the stored film on both readings (the most lung-shaped of those), or None."""
        winners = [(r.shape_iou, name) for name, r in self.corrected.items() if self.stored.beaten_by(r)]
        return max(winners)[1] if winners else None

    @property
    def upside_down(self) -> bool:
        """The film turned 180° beats the film as stored on both readings."""
        turned = self.corrected.get("turned 180°")
        return turned is not None and self.stored.beaten_by(turned)


def lung_reading(segmenter: Any, pixels: np.ndarray, image: CXRImage) -> Reading:
    """The lungs read on ``pixels`` (``image``'s pixels in some pose) by a segmenter exposing probabilities."""
    from cxrground.anatomy.segment.builtin import postprocess_lungs

    p_right, p_left, _ = segmenter.probabilities(dataclasses.replace(image, pixels=pixels), ORIENTATION_GRID)
    right, left = postprocess_lungs(p_right, p_left, segmenter.threshold)
    iou = shipped_lung_shape().iou(right, left) if right.any() and left.any() else 0.0
    p = np.maximum(p_right, p_left)
    lung = p > 0.5
    return Reading(float(p[lung].mean()) if lung.any() else 0.0, float(iou))


@functools.cache
def _shipped_unet() -> Any:
    """The built-in U-Net with its shipped weights, loaded once per process."""
    from cxrground.anatomy.segment.registry import get_segmenter

    return get_segmenter("unet")


def _probability_reader(segmenter: Any) -> Any:
    """``segmenter`` when it exposes lung probabilities, else the shipped built-in U-Net."""
    return segmenter if callable(getattr(segmenter, "probabilities", None)) else _shipped_unet()


def orientation_evidence(segmenter: Any, image: CXRImage, poses: tuple[str, ...] | None = None
                         ) -> OrientationEvidence:
    """The film read as stored and after each correction (default: all of :data:`POSES`), by ``segmenter`` when it
    exposes probabilities, else by the shipped built-in U-Net."""
    segmenter = _probability_reader(segmenter)
    names = tuple(POSES) if poses is None else poses
    unknown = [n for n in names if n not in POSES]
    if unknown:
        raise ValueError(f"unknown pose correction(s) {unknown}; known: {list(POSES)}")
    stored = lung_reading(segmenter, image.pixels, image)
    corrected = {n: lung_reading(segmenter, pose_pixels(image.pixels, n), image) for n in names}
    return OrientationEvidence(stored, corrected)


def orientation_problem(segmenter: Any, image: CXRImage) -> str | None:
    """Why the film looks stored in a wrong pose, or None."""
    ev = orientation_evidence(segmenter, image, CHECKED_POSES)
    name = ev.best_correction
    if name is None:
        return None
    r = ev.corrected[name]
    return (f"film looks stored in a wrong pose: its lungs read more confidently ({r.confidence:.3f} vs "
            f"{ev.stored.confidence:.3f}) and more lung-shaped (shape IoU {r.shape_iou:.2f} vs "
            f"{ev.stored.shape_iou:.2f}) with the film {name}; store it upright")
