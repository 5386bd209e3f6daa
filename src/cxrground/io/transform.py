"""Native <-> working-canvas transforms with an explicit, serialisable record.

:class:`Letterbox` resizes an ``(H, W)`` image so that it fits a working canvas (aspect kept),
then pads. Every mask produced on the canvas maps back to native pixels through the same record:
a native pixel takes the value of the canvas pixel that contains its centre. Hence a canvas mask
taken to native and back is unchanged when the canvas is the smaller grid, and a native mask
taken to the canvas and back is unchanged when the canvas is the larger grid (both tested).
``Letterbox.stretch`` describes the "whole image stretched to a square" frame of the released
MIMIC-ILS masks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from PIL import Image

from cxrground.io.masks import as_mask, check_shape

__all__ = ["Letterbox"]

Align = Literal["center", "topleft"]


@dataclass(frozen=True)
class Letterbox:
    """Where a native ``src`` image sits on a working canvas: resized size and padding offset."""

    src_hw: tuple[int, int]
    canvas_hw: tuple[int, int]
    resized_hw: tuple[int, int]
    offset_yx: tuple[int, int]

    # --- construction ----------------------------------------------------------------------------
    @classmethod
    def fit(cls, src_hw: Sequence[int], canvas: int | Sequence[int], align: Align = "center") -> Letterbox:
        """Fit ``src_hw`` into a canvas (an int = square side) keeping aspect; pad centred or bottom/right."""
        h, w = (int(v) for v in src_hw)
        ch, cw = (int(canvas), int(canvas)) if isinstance(canvas, int) else (int(v) for v in canvas)
        if min(h, w, ch, cw) < 1:
            raise ValueError(f"sizes must be positive: src {src_hw}, canvas {canvas}")
        scale = min(ch / h, cw / w)
        rh, rw = max(1, min(ch, round(h * scale))), max(1, min(cw, round(w * scale)))
        if align == "center":
            off = ((ch - rh) // 2, (cw - rw) // 2)
        elif align == "topleft":
            off = (0, 0)
        else:
            raise ValueError(f"align must be 'center' or 'topleft', got {align!r}")
        return cls((h, w), (ch, cw), (rh, rw), off)

    @classmethod
    def longest_side(cls, src_hw: Sequence[int], size: int, pad: bool = True) -> Letterbox:
        """SAM-style: longest side to ``size``, padded bottom/right to ``size``² (or unpadded)."""
        box = cls.fit(src_hw, size, align="topleft")
        return box if pad else cls(box.src_hw, box.resized_hw, box.resized_hw, (0, 0))

    @classmethod
    def stretch(cls, src_hw: Sequence[int], canvas: int | Sequence[int]) -> Letterbox:
        """The whole image stretched to the canvas, no padding (aspect not kept)."""
        h, w = (int(v) for v in src_hw)
        ch, cw = (int(canvas), int(canvas)) if isinstance(canvas, int) else (int(v) for v in canvas)
        return cls((h, w), (ch, cw), (ch, cw), (0, 0))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Letterbox:
        """Inverse of :meth:`to_dict`."""
        return cls(*(tuple(int(v) for v in data[k]) for k in ("src_hw", "canvas_hw", "resized_hw", "offset_yx")))

    def to_dict(self) -> dict[str, list[int]]:
        """JSON-ready record of the transform."""
        return {k: list(v) for k, v in asdict(self).items()}

    # --- geometry --------------------------------------------------------------------------------
    @property
    def scale_yx(self) -> tuple[float, float]:
        """Canvas pixels per native pixel along rows and columns."""
        return self.resized_hw[0] / self.src_hw[0], self.resized_hw[1] / self.src_hw[1]

    def valid_region(self) -> tuple[slice, slice]:
        """Canvas slices covering the resized (un-padded) image."""
        (oy, ox), (rh, rw) = self.offset_yx, self.resized_hw
        return slice(oy, oy + rh), slice(ox, ox + rw)

    def points_to_canvas(self, xy: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
        """Native ``[x, y]`` pixel coordinates (pixel centres at integers) to canvas coordinates."""
        pts = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
        sy, sx = self.scale_yx
        return np.stack([(pts[:, 0] + 0.5) * sx - 0.5 + self.offset_yx[1],
                         (pts[:, 1] + 0.5) * sy - 0.5 + self.offset_yx[0]], axis=1)

    def points_to_native(self, xy: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
        """Canvas ``[x, y]`` coordinates to native coordinates (inverse of :meth:`points_to_canvas`)."""
        pts = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
        sy, sx = self.scale_yx
        return np.stack([(pts[:, 0] - self.offset_yx[1] + 0.5) / sx - 0.5,
                         (pts[:, 1] - self.offset_yx[0] + 0.5) / sy - 0.5], axis=1)

    # --- rasters ---------------------------------------------------------------------------------
    def image_to_canvas(self, pixels: np.ndarray, fill: int | float = 0) -> np.ndarray:
        """Resize (bilinear; area-averaging when shrinking) and pad an ``(H, W[, C])`` image."""
        check_shape(pixels[..., 0] if pixels.ndim == 3 else pixels, self.src_hw, "image")
        rh, rw = self.resized_hw
        resample = Image.Resampling.BOX if rh < self.src_hw[0] else Image.Resampling.BILINEAR
        if pixels.dtype == np.uint8:
            resized = np.asarray(Image.fromarray(pixels).resize((rw, rh), resample=resample))
        else:
            chans = pixels[..., None] if pixels.ndim == 2 else pixels
            resized = np.stack(
                [np.asarray(Image.fromarray(chans[..., c].astype(np.float32), mode="F").resize((rw, rh), resample))
                 for c in range(chans.shape[-1])], axis=-1,
            ).astype(pixels.dtype)
            resized = resized[..., 0] if pixels.ndim == 2 else resized
        out = np.full((*self.canvas_hw, *pixels.shape[2:]), fill, dtype=pixels.dtype)
        out[self.valid_region()] = resized
        return out

    def mask_to_canvas(self, mask: np.ndarray) -> np.ndarray:
        """Nearest-neighbour mapping of a native mask onto the canvas (padding is False)."""
        m = check_shape(as_mask(mask), self.src_hw, "native mask")
        rows, cols = self._canvas_to_native_index()
        out = np.zeros(self.canvas_hw, dtype=bool)
        out[self.valid_region()] = m[np.ix_(rows, cols)]
        return out

    def mask_to_native(self, mask: np.ndarray) -> np.ndarray:
        """Nearest-neighbour mapping of a canvas mask back to native pixels (padding is discarded)."""
        m = check_shape(as_mask(mask), self.canvas_hw, "canvas mask")
        rows, cols = self._native_to_canvas_index()
        return m.take(rows, axis=0).take(cols, axis=1)  # = m[np.ix_(rows, cols)], faster on large images

    def logits_to_native(self, logits: np.ndarray) -> np.ndarray:
        """Crop the un-padded region of canvas-sized float logits and resize bilinearly to native."""
        check_shape(logits, self.canvas_hw, "canvas logits")
        crop = np.asarray(logits, dtype=np.float32)[self.valid_region()]
        h, w = self.src_hw
        return np.asarray(Image.fromarray(crop, mode="F").resize((w, h), Image.Resampling.BILINEAR))

    def _native_to_canvas_index(self) -> tuple[np.ndarray, np.ndarray]:
        # canvas pixel containing each native pixel centre
        (h, w), (rh, rw), (oy, ox) = self.src_hw, self.resized_hw, self.offset_yx
        rows = np.minimum(np.floor((np.arange(h) + 0.5) * rh / h).astype(np.int64), rh - 1) + oy
        cols = np.minimum(np.floor((np.arange(w) + 0.5) * rw / w).astype(np.int64), rw - 1) + ox
        return rows, cols

    def _canvas_to_native_index(self) -> tuple[np.ndarray, np.ndarray]:
        # native pixel containing each (un-padded) canvas pixel centre
        (h, w), (rh, rw) = self.src_hw, self.resized_hw
        rows = np.minimum(np.floor((np.arange(rh) + 0.5) * h / rh).astype(np.int64), h - 1)
        cols = np.minimum(np.floor((np.arange(rw) + 0.5) * w / rw).astype(np.int64), w - 1)
        return rows, cols
