"""The chest X-ray image record :class:`CXRImage`, the display-window type and the linear 8-bit mapping.

Shared by the PNG/JPEG reader (:mod:`cxrground.io.image`) and the DICOM reader (:mod:`cxrground.io.dicom`).
Pixels are always display-ready 8-bit grey ``(H, W)`` at the file's native resolution, with white = dense
(MONOCHROME2 convention).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from cxrground.errors import ImageReadError

__all__ = ["CXRImage", "Window", "to_uint8"]

#: ``"auto"`` = the file's VOI LUT / first window, else the data range; ``"minmax"`` = data range;
#: ``(center, width)`` = that window.
Window = Literal["auto", "minmax"] | tuple[float, float]


@dataclass(frozen=True, eq=False)
class CXRImage:
    """A frontal chest X-ray as 8-bit grey pixels at native resolution, with its provenance."""

    pixels: np.ndarray
    path: str | None = None
    source_format: str = "array"
    spacing: tuple[float, float] | None = None
    """Pixel spacing (row, column) in mm, when the file states it."""
    view: str | None = None
    """View position (``PA``, ``AP``, ``LL`` ...), when known."""
    orientation: tuple[str, str] | None = None
    """DICOM PatientOrientation (row direction, column direction), when known."""
    bits_stored: int = 8
    photometric: str = "MONOCHROME2"
    """Photometric interpretation of the source (pixels here are always MONOCHROME2)."""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        px = self.pixels
        if px.ndim != 2 or px.dtype != np.uint8:
            raise ImageReadError(f"pixels must be a 2-D uint8 array, got {px.dtype} {px.shape}", self.path)
        if px.shape[0] == 0 or px.shape[1] == 0:
            raise ImageReadError(f"image has an empty dimension {px.shape}", self.path)

    @property
    def shape(self) -> tuple[int, int]:
        """``(H, W)``."""
        return int(self.pixels.shape[0]), int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        """Rows."""
        return self.shape[0]

    @property
    def width(self) -> int:
        """Columns."""
        return self.shape[1]

    def rgb(self) -> np.ndarray:
        """The pixels stacked to ``(H, W, 3)`` uint8."""
        return np.repeat(self.pixels[:, :, None], 3, axis=2)


def to_uint8(values: np.ndarray, low: float | None = None, high: float | None = None) -> np.ndarray:
    """Linearly map ``[low, high]`` (default: the data range) to 0..255, clipping outside."""
    data = values.astype(np.float64, copy=False)
    lo = float(np.min(data)) if low is None else float(low)
    hi = float(np.max(data)) if high is None else float(high)
    if hi <= lo:
        return np.zeros(data.shape, dtype=np.uint8)
    scaled = (data - lo) * (255.0 / (hi - lo))
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
