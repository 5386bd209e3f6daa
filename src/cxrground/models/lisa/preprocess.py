"""Pre- and post-processing of the LISA model (ILS.md §17.2), with explicit, invertible frames.

- **SAM branch**: grey → RGB uint8 → longest side to ``sam_size`` (aspect kept; :meth:`Letterbox.longest_side`,
  area-averaging when shrinking, bilinear when enlarging) → normalise with the SAM pixel mean/std → zero-pad
  bottom/right to ``sam_size``² (padding is 0 *after* normalisation, as in SAM).
- **CLIP branch**: ``center_crop`` (shortest side to the CLIP size, bicubic, centre crop, as the CLIP ViT-L/14
  processor; crops the long axis of non-square CXRs) or ``pad`` (centred pad-to-square with the CLIP mean
  colour, then resize; ILS.md §18.10), then CLIP mean/std.
- **GT mask**: the same longest-side frame with nearest-neighbour sampling, padding = background;
  negatives are all-zero.
- **Post-processing**: SAM low-resolution logits → bilinear to ``sam_size``² → crop the un-padded region →
  bilinear to the native ``H×W`` → mask = logits ``> 0``.
- **Augmentation**: histogram equalisation of the 8-bit image with probability ``p`` (training only).
"""

from __future__ import annotations

from typing import Final

import numpy as np
from PIL import Image

from cxrground.io.masks import as_mask
from cxrground.io.transform import Letterbox

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "SAM_MEAN",
    "SAM_STD",
    "clip_pixels",
    "equalize",
    "gt_mask_canvas",
    "logits_to_native",
    "sam_frame",
    "sam_pixels",
]

SAM_MEAN: Final[tuple[float, float, float]] = (123.675, 116.28, 103.53)
SAM_STD: Final[tuple[float, float, float]] = (58.395, 57.12, 57.375)
CLIP_MEAN: Final[tuple[float, float, float]] = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD: Final[tuple[float, float, float]] = (0.26862954, 0.26130258, 0.27577711)


def _rgb(grey: np.ndarray) -> np.ndarray:
    grey = np.asarray(grey)
    if grey.ndim != 2 or grey.dtype != np.uint8:
        raise ValueError(f"expected a 2-D uint8 image, got {grey.dtype} {grey.shape}")
    return np.repeat(grey[:, :, None], 3, axis=2)


def equalize(grey: np.ndarray) -> np.ndarray:
    """Histogram equalisation of a uint8 image (cumulative-histogram lookup table, PIL ``ImageOps`` style)."""
    from PIL import ImageOps

    return np.asarray(ImageOps.equalize(Image.fromarray(np.asarray(grey, dtype=np.uint8))))


def sam_frame(src_hw: tuple[int, int], sam_size: int) -> Letterbox:
    """The SAM canvas frame: longest side to ``sam_size``, padded bottom/right."""
    return Letterbox.longest_side(src_hw, sam_size)


def sam_pixels(grey: np.ndarray, sam_size: int) -> tuple[np.ndarray, Letterbox]:
    """``(3, S, S)`` float32 SAM input and its frame."""
    box = sam_frame(grey.shape, sam_size)
    canvas = box.image_to_canvas(_rgb(grey)).astype(np.float32)
    canvas = (canvas - np.asarray(SAM_MEAN, np.float32)) / np.asarray(SAM_STD, np.float32)
    valid = np.zeros(box.canvas_hw, dtype=bool)
    valid[box.valid_region()] = True
    canvas[~valid] = 0.0
    return np.ascontiguousarray(canvas.transpose(2, 0, 1)), box


def clip_pixels(grey: np.ndarray, size: int, mode: str = "center_crop") -> np.ndarray:
    """``(3, size, size)`` float32 CLIP input (``center_crop`` or ``pad``, see the module docstring)."""
    rgb = _rgb(grey)
    h, w = rgb.shape[:2]
    if mode == "center_crop":
        scale = size / min(h, w)
        rh, rw = max(size, round(h * scale)), max(size, round(w * scale))
        resized = np.asarray(Image.fromarray(rgb).resize((rw, rh), Image.Resampling.BICUBIC))
        top, left = (rh - size) // 2, (rw - size) // 2
        out = resized[top:top + size, left:left + size]
    elif mode == "pad":
        side = max(h, w)
        fill = tuple(round(m * 255) for m in CLIP_MEAN)
        square = np.empty((side, side, 3), dtype=np.uint8)
        square[:] = fill
        top, left = (side - h) // 2, (side - w) // 2
        square[top:top + h, left:left + w] = rgb
        out = np.asarray(Image.fromarray(square).resize((size, size), Image.Resampling.BICUBIC))
    else:
        raise ValueError(f"clip mode must be 'center_crop' or 'pad', got {mode!r}")
    arr = out.astype(np.float32) / 255.0
    arr = (arr - np.asarray(CLIP_MEAN, np.float32)) / np.asarray(CLIP_STD, np.float32)
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def gt_mask_canvas(mask: np.ndarray | None, box: Letterbox) -> np.ndarray:
    """The GT mask on the SAM canvas (nearest, padding background); ``None`` = negative (all zero)."""
    if mask is None:
        return np.zeros(box.canvas_hw, dtype=np.float32)
    return box.mask_to_canvas(as_mask(mask)).astype(np.float32)


def logits_to_native(low_res: np.ndarray, box: Letterbox) -> np.ndarray:
    """SAM low-resolution logits ``(h, w)`` → float logits at the native ``H×W`` (threshold at 0 for the mask)."""
    import torch
    import torch.nn.functional as F

    t = torch.as_tensor(np.asarray(low_res, dtype=np.float32))[None, None]
    canvas = F.interpolate(t, size=box.canvas_hw, mode="bilinear", align_corners=False)[0, 0].numpy()
    return box.logits_to_native(canvas)
