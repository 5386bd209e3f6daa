"""Overlays and contact sheets: masks blended onto a CXR, labelled panels, galleries.

The blend is the one of CHEXPERCEPT.md §10.1: ``out = img·(1 − α·m) + colour·α·m`` per channel
with ``img`` in [0, 1] (grey stacked to RGB), saved as 8-bit RGB at the image's size.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Final

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from cxrground.errors import MaskShapeError
from cxrground.io.masks import as_mask, check_shape

__all__ = [
    "ANATOMY_COLOURS",
    "ANATOMY_COLOUR_NAMES",
    "PALETTE",
    "blend",
    "caption_font",
    "contact_sheet",
    "draw_edges",
    "draw_rows",
    "label_panel",
    "mask_edges",
    "overlay_masks",
]

#: Distinct colours (RGB in [0, 1]) for drawing several masks at once.
PALETTE: tuple[tuple[float, float, float], ...] = (
    (0.0, 1.0, 1.0),
    (1.0, 0.2, 0.2),
    (1.0, 0.85, 0.0),
    (0.2, 1.0, 0.2),
    (1.0, 0.3, 1.0),
    (0.3, 0.5, 1.0),
    (1.0, 0.55, 0.0),
    (0.6, 1.0, 0.8),
)


#: The colours (RGB in [0, 1]) of the anatomy on every overlay that draws it (``segment lungs``' overlay.png,
#: ``anatomy zones``' overlays): the patient's right lung (image left) blue, the left lung green, the heart yellow;
#: red is kept for what a reader flags (a zone read as abnormal) and never marks a lung.
ANATOMY_COLOURS: Final[dict[str, tuple[float, float, float]]] = {
    "right_lung": (0.2, 0.6, 1.0),
    "left_lung": (0.2, 1.0, 0.6),
    "heart": (1.0, 0.8, 0.1),
    "flagged": (1.0, 0.1, 0.1),
}
#: The colours' names, as overlay legends write them.
ANATOMY_COLOUR_NAMES: Final[dict[str, str]] = {"right_lung": "blue", "left_lung": "green", "heart": "yellow",
                                               "flagged": "red"}
#: TrueType fonts tried for captions, first found wins (Pillow's own font when none is installed).
_FONT_FILES: Final[tuple[str, ...]] = ("DejaVuSans.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                                       "LiberationSans-Regular.ttf", "Arial.ttf")


def _rgb01(pixels: np.ndarray) -> np.ndarray:
    arr = np.asarray(pixels)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"expected (H, W) or (H, W, 3) pixels, got {arr.shape}")
    return arr.astype(np.float64) / 255.0 if arr.dtype == np.uint8 else arr.astype(np.float64)


def blend(pixels: np.ndarray, mask: np.ndarray, colour: Sequence[float], alpha: float) -> np.ndarray:
    """One mask blended onto grey or RGB ``pixels`` with the §10.1 formula; returns uint8 RGB."""
    img = _rgb01(pixels)
    m = check_shape(as_mask(mask), img.shape[:2], "overlay mask").astype(np.float64)[:, :, None]
    col = np.asarray(colour, dtype=np.float64).reshape(1, 1, 3)
    out = img * (1.0 - alpha * m) + col * alpha * m
    return np.clip(np.rint(out * 255.0), 0, 255).astype(np.uint8)


def overlay_masks(
    pixels: np.ndarray,
    masks: Sequence[np.ndarray],
    colours: Sequence[Sequence[float]] | None = None,
    alpha: float = 0.4,
    outline: bool = True,
    band_rows: int = 256,
) -> np.ndarray:
    """Several masks blended in turn (palette colours by default), optionally with 1-px outlines. Computed in bands
    of ``band_rows`` rows (each with a row of context above and below, so outlines match): the same pixels with a
    working memory of one band, not of the whole image (a 6300² overlay: about 0.4 GB, not 4 GB)."""
    shape = np.asarray(pixels).shape[:2]
    for i, mask in enumerate(masks):  # checked whole, so that an error names the image's shape, not a band's
        if np.shape(mask) != shape:
            raise MaskShapeError(tuple(shape), tuple(np.shape(mask)), f"overlay mask {i}")
    h = shape[0]
    if h <= band_rows:
        return _overlay_whole(pixels, masks, colours, alpha, outline)
    first = _overlay_whole(pixels[: min(h, band_rows + 1)], [m[: band_rows + 1] for m in masks], colours, alpha,
                           outline)
    out = np.empty((h, *first.shape[1:]), dtype=np.uint8)
    out[:band_rows] = first[:band_rows]
    for y0 in range(band_rows, h, band_rows):
        y1 = min(h, y0 + band_rows)
        a, b = y0 - 1, min(h, y1 + 1)
        band = _overlay_whole(pixels[a:b], [m[a:b] for m in masks], colours, alpha, outline)
        out[y0:y1] = band[y0 - a:y1 - a]
    return out


def _overlay_whole(pixels: np.ndarray, masks: Sequence[np.ndarray], colours: Sequence[Sequence[float]] | None,
                   alpha: float, outline: bool) -> np.ndarray:
    """:func:`overlay_masks` of the whole image at once."""
    from scipy import ndimage

    out = _rgb01(pixels)
    out = np.clip(np.rint(out * 255), 0, 255).astype(np.uint8)
    for i, mask in enumerate(masks):
        colour = colours[i] if colours is not None else PALETTE[i % len(PALETTE)]
        out = blend(out, mask, colour, alpha)
        if outline:
            m = as_mask(mask)
            edge = m & ~ndimage.binary_erosion(m)
            out[edge] = np.clip(np.asarray(colour) * 255, 0, 255).astype(np.uint8)
    return out


def mask_edges(mask: np.ndarray, width: int = 1) -> np.ndarray:
    """The pixels of ``mask`` within ``width`` pixels of its border (its inner outline, ``width`` pixels thick)."""
    from scipy import ndimage

    m = as_mask(mask)
    if not m.any():
        return m
    inner = ndimage.binary_erosion(m, iterations=max(1, int(width)), border_value=0)
    return m & ~inner


def draw_edges(rgb: np.ndarray, masks: Sequence[np.ndarray], colours: Sequence[Sequence[float]], width: int = 1
               ) -> np.ndarray:
    """The inner outlines (:func:`mask_edges`, ``width`` pixels) of ``masks`` drawn in turn over an RGB uint8 image in
    their ``colours``; returns a copy."""
    out = np.array(rgb, dtype=np.uint8, copy=True)
    for mask, colour in zip(masks, colours, strict=True):
        out[mask_edges(mask, width)] = np.clip(np.rint(np.asarray(colour, dtype=np.float64) * 255), 0, 255)
    return out


def draw_rows(
    rgb: np.ndarray, segments: Sequence[tuple[int, int, int]], colours: Sequence[Sequence[float]],
    thickness: int | None = None,
) -> np.ndarray:
    """Horizontal segments ``(y, x0, x1)`` (inclusive, pixels of ``rgb``) drawn in turn over an RGB uint8 image,
    each ``thickness`` rows thick (default: 0.4 % of the longer side, at least 1) with end ticks three times as
    tall; returns a copy. Segments with a negative row are skipped."""
    out = np.array(rgb, dtype=np.uint8, copy=True)
    if out.ndim != 3 or out.shape[2] != 3:
        raise ValueError(f"expected (H, W, 3) RGB pixels, got {out.shape}")
    h, w = out.shape[:2]
    t = thickness or max(1, round(0.004 * max(h, w)))
    for (y, x0, x1), colour in zip(segments, colours, strict=True):
        if y < 0:
            continue
        col = np.clip(np.rint(np.asarray(colour, dtype=np.float64) * 255), 0, 255).astype(np.uint8)
        a, b = max(0, min(x0, x1)), min(w - 1, max(x0, x1))
        out[max(0, y - t // 2) : min(h, y - t // 2 + t), a : b + 1] = col
        for x in (a, b):
            out[max(0, y - 3 * t // 2) : min(h, y + 3 * t // 2 + 1), max(0, x - t // 2) : min(w, x - t // 2 + t)] = col
    return out


@functools.lru_cache(maxsize=16)
def caption_font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """A caption font of ``size`` pixels: DejaVu Sans (or another TrueType sans) when installed, else Pillow's
    bundled font at that size (its fixed bitmap font where Pillow has no FreeType)."""
    for name in _FONT_FILES:
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # an old Pillow or one without FreeType
        return ImageFont.load_default()


#: A caption line: plain text (grey), or runs of ``(text, RGB in [0, 1])`` drawn side by side.
CaptionLine = str | Sequence[tuple[str, Sequence[float]]]


def _wrap(draw: ImageDraw.ImageDraw, line: CaptionLine, font: ImageFont.ImageFont | ImageFont.FreeTypeFont,
          width: float, grey: tuple[float, float, float]) -> list[list[tuple[str, Sequence[float]]]]:
    """``line`` as runs, broken into lines no wider than ``width`` pixels (at spaces; a run that does not fit moves
    to the next line whole when it is a coloured run)."""
    runs = [(line, grey)] if isinstance(line, str) else [(t, c) for t, c in line]
    lines: list[list[tuple[str, Sequence[float]]]] = [[]]
    used = 0.0
    for text, colour in runs:
        words = text.split(" ") if isinstance(line, str) else [text]
        for i, word in enumerate(words):
            piece = word if i == 0 or not isinstance(line, str) else " " + word
            size = draw.textlength(piece, font=font)
            if used and used + size > width:
                lines.append([])
                piece, used = piece.lstrip(), 0.0
                size = draw.textlength(piece, font=font)
            lines[-1].append((piece, colour))
            used += size
    return [ln for ln in lines if ln]


def label_panel(rgb: np.ndarray, title: str, lines: Sequence[CaptionLine] = (), width: int | None = None,
                font_size: int | None = None) -> np.ndarray:
    """The image (optionally resized to ``width``) with a caption strip of ``title`` and ``lines`` below; a line is
    text or runs of ``(text, colour)`` (a legend); lines wider than the image wrap. ``font_size``: pixels (default:
    the image width / 40, at least 11; :func:`caption_font`)."""
    im = Image.fromarray(rgb if rgb.ndim == 3 else np.repeat(rgb[:, :, None], 3, axis=2))
    if width is not None and im.width != width:
        im = im.resize((width, max(1, round(im.height * width / im.width))), Image.Resampling.BILINEAR)
    size = font_size or max(11, round(im.width / 40))
    font = caption_font(size)
    pad = max(2, size // 4)
    line_h = size + pad
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    grey = (200 / 255, 200 / 255, 200 / 255)
    rows = [[(title, (1.0, 1.0, 1.0))]] if title else []
    for line in lines:
        rows += _wrap(probe, line, font, im.width - 2 * pad, grey)
    strip = line_h * len(rows) + 2 * pad
    canvas = Image.new("RGB", (im.width, im.height + strip), (16, 16, 16))
    canvas.paste(im, (0, 0))
    draw = ImageDraw.Draw(canvas)
    for i, runs in enumerate(rows):
        x, y = float(pad), im.height + pad + i * line_h
        for text, colour in runs:
            fill = tuple(int(np.clip(round(c * 255), 0, 255)) for c in colour)
            draw.text((x, y), text, fill=fill, font=font)
            x += draw.textlength(text, font=font)
    return np.asarray(canvas)


def contact_sheet(panels: Sequence[np.ndarray], columns: int = 4, gap: int = 4) -> np.ndarray:
    """Panels (RGB uint8, any sizes) laid out in a grid on a dark background."""
    if not panels:
        raise ValueError("no panels to lay out")
    rows = (len(panels) + columns - 1) // columns
    cell_h = max(p.shape[0] for p in panels)
    cell_w = max(p.shape[1] for p in panels)
    sheet = np.full((rows * (cell_h + gap) + gap, columns * (cell_w + gap) + gap, 3), 8, dtype=np.uint8)
    for i, p in enumerate(panels):
        r, c = divmod(i, columns)
        y, x = gap + r * (cell_h + gap), gap + c * (cell_w + gap)
        sheet[y : y + p.shape[0], x : x + p.shape[1]] = p
    return sheet
