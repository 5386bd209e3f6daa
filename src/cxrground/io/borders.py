"""Uniform borders around a film's exposed field: black or grey letterbox bands, white scanner margins.

Exported chest films often sit inside a band of one grey level (a film letterboxed to a square, a figure cut from
a paper, a scanned film's margin). :func:`content_box` finds such bands so that a model can read the exposed
field alone; :class:`ContentBox` records what was cut and maps arrays between the film and the box.
Rule and constants: ``bench/records/film_borders_preregistration.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

__all__ = ["BORDER_SHARE", "BORDER_TOLERANCE", "MAX_CUT", "MIN_BAND", "MIN_KEPT", "ContentBox", "content_box"]

#: A line is border when at least this share of its pixels lies within :data:`BORDER_TOLERANCE` of its median.
BORDER_SHARE: Final[float] = 0.90
#: Grey levels (0-255) a border pixel may differ from its line's median, and a line's median from the band's.
BORDER_TOLERANCE: Final[int] = 6
#: A side is cut only when its band is at least this share of the dimension (and at least 2 px).
MIN_BAND: Final[float] = 0.01
#: No side is cut by more than this share of the dimension.
MAX_CUT: Final[float] = 0.30
#: Nothing is cut when the box left would be under this share of the film's height or width.
MIN_KEPT: Final[float] = 0.5


@dataclass(frozen=True)
class ContentBox:
    """Pixels cut from each side of a ``shape`` film (all 0: the whole film)."""

    shape: tuple[int, int]
    top: int = 0
    bottom: int = 0
    left: int = 0
    right: int = 0

    @property
    def empty(self) -> bool:
        """True when nothing is cut."""
        return not (self.top or self.bottom or self.left or self.right)

    @property
    def slices(self) -> tuple[slice, slice]:
        """The box as (rows, columns) slices of the film."""
        h, w = self.shape
        return slice(self.top, h - self.bottom), slice(self.left, w - self.right)

    def crop(self, array: np.ndarray) -> np.ndarray:
        """``array`` (the film's shape in its first two axes) inside the box."""
        return array[self.slices]

    def place(self, inside: np.ndarray, fill: float = 0) -> np.ndarray:
        """An array of the film's shape holding ``inside`` (the box's shape) in the box and ``fill`` elsewhere."""
        out = np.full(self.shape + inside.shape[2:], fill, dtype=inside.dtype)
        out[self.slices] = inside
        return out

    def on_grid(self, shape: tuple[int, int]) -> ContentBox:
        """The same box on a ``shape`` grid over the whole film (cuts scaled and rounded)."""
        sy, sx = shape[0] / self.shape[0], shape[1] / self.shape[1]
        return ContentBox((int(shape[0]), int(shape[1])), round(self.top * sy), round(self.bottom * sy),
                          round(self.left * sx), round(self.right * sx))

    def to_list(self) -> list[int]:
        """``[top, bottom, left, right]``, as the segmentation records it."""
        return [self.top, self.bottom, self.left, self.right]


def _band(lines: np.ndarray) -> int:
    """How many leading lines of ``lines`` (one line per row) form one uniform band."""
    ref: float | None = None
    n = 0
    for line in lines:
        med = float(np.median(line))
        if ref is None:
            ref = med
        if abs(med - ref) > BORDER_TOLERANCE:
            break
        if np.mean(np.abs(line.astype(np.int16) - med) <= BORDER_TOLERANCE) < BORDER_SHARE:
            break
        n += 1
    return n


def content_box(pixels: np.ndarray) -> ContentBox:
    """The film's exposed field: the uniform bands at its edges cut (8-bit grey ``(H, W)`` pixels)."""
    px = np.asarray(pixels)
    if px.ndim != 2:
        raise ValueError(f"content_box needs a 2-D grey film, got shape {px.shape}")
    h, w = px.shape
    cuts = []
    for lines, dim in ((px, h), (px[::-1], h), (px.T, w), (px.T[::-1], w)):
        limit = int(MAX_CUT * dim)
        n = _band(lines[: limit + 1])
        cuts.append(0 if n < max(2, MIN_BAND * dim) else min(n, limit))
    top, bottom, left, right = cuts
    if h - top - bottom < MIN_KEPT * h or w - left - right < MIN_KEPT * w:
        return ContentBox((h, w))
    return ContentBox((h, w), top, bottom, left, right)
