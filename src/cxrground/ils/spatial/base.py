"""Interfaces of the ILS spatial-extraction step (ILS §8): normal-image synthesis and lesion boxes.

All arrays are on the working canvas (see :class:`cxrground.io.transform.Letterbox`): grey uint8
``(h, w)`` images, bool masks of the same shape, boxes in canvas pixel coordinates.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from cxrground.errors import BackendError
from cxrground.registry import backend_label, call_backend, check_returned

__all__ = ["Box", "BoxDetector", "NormalSynthesizer", "box_problem", "detect_boxes", "synthesize_normal"]


@dataclass(frozen=True)
class Box:
    """An axis-aligned box with inclusive pixel bounds, a confidence in [0, 1] and a class label."""

    x0: int
    y0: int
    x1: int
    y1: int
    confidence: float
    label: str = "lesion"

    def mask(self, shape: tuple[int, int]) -> np.ndarray:
        """The box as a filled bool rectangle on a canvas of ``shape`` (clipped to it)."""
        out = np.zeros(shape, dtype=bool)
        y0, y1 = max(0, self.y0), min(shape[0] - 1, self.y1)
        x0, x1 = max(0, self.x0), min(shape[1] - 1, self.x1)
        if y1 >= y0 and x1 >= x0:
            out[y0 : y1 + 1, x0 : x1 + 1] = True
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


class NormalSynthesizer(Protocol):
    """Produces a "normal" version ``x̂`` of a CXR inside an edit mask (RadEdit or a built-in estimate)."""

    name: str

    def synthesize(self, image: np.ndarray, edit_mask: np.ndarray,
                   regions: Sequence[np.ndarray] | None = None) -> np.ndarray:
        """``x̂`` (uint8, same shape); pixels outside ``edit_mask`` equal the input.

        ``regions`` are the bool masks ``(right_lung, left_lung, heart)`` on the canvas (the heart all False when
        the study has none); the ILS pipeline always passes them (``edit_mask`` is their union), and a backend
        may model each region on its own or ignore them.
        """
        ...

    def provenance(self) -> dict[str, Any]:
        """Backend name, version, weights hash and settings."""
        ...


class BoxDetector(Protocol):
    """Proposes lesion boxes with confidences (a YOLO checkpoint or a built-in proposal step)."""

    name: str

    def detect(self, image: np.ndarray, anomaly: np.ndarray | None = None) -> list[Box]:
        """Boxes on the canvas; ``anomaly`` is the signed anomaly map ``(x − x̂)/255`` when available."""
        ...

    def provenance(self) -> dict[str, Any]:
        """Backend name, version, weights hash and settings."""
        ...


def synthesize_normal(synthesizer: NormalSynthesizer, image: np.ndarray, edit_mask: np.ndarray,
                      regions: Sequence[np.ndarray]) -> np.ndarray:
    """``synthesizer``'s ``x̂`` of ``image``; a :class:`~cxrground.errors.BackendError` naming the synthesizer when
    it fails with an error of its own or returns anything but a uint8 array of the image's shape."""
    x_hat = call_backend("synthesizer", synthesizer, "synthesize", np.ndarray, "a uint8 numpy array", image, edit_mask,
                         regions=regions)
    if x_hat.shape != image.shape or x_hat.dtype != np.uint8:
        raise BackendError(f"{backend_label('synthesizer', synthesizer)} returned a {x_hat.dtype} image of "
                           f"{x_hat.shape} for a uint8 image of {image.shape} (expected uint8 of the same shape)")
    return x_hat


def detect_boxes(detector: BoxDetector, image: np.ndarray, anomaly: np.ndarray | None) -> list[Box]:
    """``detector``'s boxes on ``image``; a :class:`~cxrground.errors.BackendError` naming the detector when it
    fails with an error of its own, returns anything but a list of :class:`Box`, or a box that breaks the contract
    (:func:`box_problem`)."""
    boxes = call_backend("detector", detector, "detect", (list, tuple), "a list of Box", image, anomaly)
    shape = (int(np.shape(image)[0]), int(np.shape(image)[1]))
    for i, b in enumerate(boxes, start=1):
        check_returned("detector", detector, "detect", b, Box, "a list of Box (one of its items)")
        problem = box_problem(b, shape)
        if problem is not None:
            raise BackendError(f"{backend_label('detector', detector)}: detect() returned box {i} {_box_text(b)} "
                               f"with {problem}")
    return list(boxes)


def box_problem(box: Box, shape: tuple[int, int]) -> str | None:
    """Why ``box`` breaks the box contract on a canvas of ``shape``, or None: integer bounds with ``x0 <= x1`` and
    ``y0 <= y1`` that overlap the canvas (a box partly outside is clipped), a confidence in [0, 1]."""
    bounds = (box.x0, box.y0, box.x1, box.y1)
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in bounds):
        return "bounds that are not all integers (inclusive pixel bounds)"
    if box.x0 > box.x1 or box.y0 > box.y1:
        return "x0 > x1 or y0 > y1 (expected x0 <= x1 and y0 <= y1)"
    h, w = shape
    if box.x1 < 0 or box.y1 < 0 or box.x0 >= w or box.y0 >= h:
        return f"no pixel on the {h}×{w} canvas"
    c = box.confidence
    if not isinstance(c, numbers.Real) or isinstance(c, bool) or not 0.0 <= float(c) <= 1.0:
        return f"confidence {c!r} (expected a number in [0, 1])"
    return None


def _box_text(box: Box) -> str:
    """``(x0, y0, x1, y1)`` of ``box`` as written in errors."""
    return "(" + ", ".join(str(v) for v in (box.x0, box.y0, box.x1, box.y1)) + ")"
