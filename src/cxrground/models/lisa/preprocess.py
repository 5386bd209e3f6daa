"""Pre- and post-processing of the LISA model (ILS.md §17.2), with explicit, invertible frames.

- **SAM branch**: grey → RGB uint8 → longest side to ``sam_size`` as SAM's ``ResizeLongestSide`` does it (sizes
  ``int(side · sam_size / longest + 0.5)``; PIL bilinear, which antialiases when shrinking, as torchvision's
  ``resize`` of a PIL image) → normalise with the SAM pixel mean/std → zero-pad bottom/right to ``sam_size``²
  (padding is 0 *after* normalisation, as in SAM).
- **CLIP branch**: ``center_crop`` (shortest side to the CLIP size with the long side ``int(size · long / short)``,
  PIL bicubic, centre crop: ``transformers``' ``CLIPImageProcessor`` for CLIP ViT-L/14; crops the long axis of
  non-square CXRs) or ``pad`` (centred pad-to-square with the CLIP mean colour, then resize; ILS.md §18.10),
  then CLIP mean/std.
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
    """The SAM canvas frame: longest side to ``sam_size``, padded bottom/right. The resized size is SAM's
    ``ResizeLongestSide.get_preprocess_shape``: ``int(side · sam_size / max(H, W) + 0.5)`` per side."""
    h, w = (int(v) for v in src_hw)
    if min(h, w, sam_size) < 1:
        raise ValueError(f"sizes must be positive: src {src_hw}, canvas {sam_size}")
    scale = sam_size * 1.0 / max(h, w)
    rh, rw = (max(1, min(sam_size, int(side * scale + 0.5))) for side in (h, w))
    return Letterbox((h, w), (sam_size, sam_size), (rh, rw), (0, 0))


def sam_pixels(grey: np.ndarray, sam_size: int) -> tuple[np.ndarray, Letterbox]:
    """``(3, S, S)`` float32 SAM input and its frame (PIL bilinear resize, as SAM's ``ResizeLongestSide``)."""
    box = sam_frame(grey.shape, sam_size)
    rh, rw = box.resized_hw
    resized = np.asarray(Image.fromarray(_rgb(grey)).resize((rw, rh), Image.Resampling.BILINEAR), dtype=np.float32)
    canvas = np.zeros((*box.canvas_hw, 3), dtype=np.float32)  # the padding is 0 after normalisation
    canvas[:rh, :rw] = (resized - np.asarray(SAM_MEAN, np.float32)) / np.asarray(SAM_STD, np.float32)
    return np.ascontiguousarray(canvas.transpose(2, 0, 1)), box


def clip_pixels(grey: np.ndarray, size: int, mode: str = "center_crop") -> np.ndarray:
    """``(3, size, size)`` float32 CLIP input (``center_crop`` or ``pad``, see the module docstring)."""
    rgb = _rgb(grey)
    h, w = rgb.shape[:2]
    if mode == "center_crop":
        # transformers' get_resize_output_image_size (shortest_edge): the long side is truncated, not rounded
        short, long = (w, h) if w <= h else (h, w)
        new_long = int(size * long / short)
        rh, rw = (new_long, size) if w <= h else (size, new_long)
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
