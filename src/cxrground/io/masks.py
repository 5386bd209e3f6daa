"""Binary masks: validation, COCO RLE (canonical stored form), PNG 0/255, CheXmask/SIIM RLE.

In memory a mask is a 2-D ``numpy`` bool array of shape ``(H, W)``. Every function that takes
more than one mask, or a mask and an expected size, checks shapes and raises
:class:`~cxrground.errors.MaskShapeError` naming both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
from PIL import Image

from cxrground.errors import MaskError, MaskShapeError
from cxrground.io.image import load_pixels

__all__ = [
    "as_mask",
    "check_same_shape",
    "check_shape",
    "column_major_runs",
    "decode_chexmask_rle",
    "decode_rle",
    "encode_chexmask_rle",
    "encode_rle",
    "read_mask_png",
    "rle_counts",
    "rle_overlap",
    "rle_size",
    "rle_string_counts",
    "write_mask_png",
]


def as_mask(array: Any, what: str = "mask", path: str | Path | None = None) -> np.ndarray:
    """Return ``array`` as a 2-D bool mask; bool, integer 0/1 or 0/255 arrays are accepted."""
    arr = np.asarray(array)
    if arr.ndim != 2:
        raise MaskError(f"{what} must be 2-D (H, W), got an array of shape {arr.shape}", path)
    if arr.dtype == bool:
        return arr
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise MaskError(f"{what} has dtype {arr.dtype}; expected bool or an integer 0/1 or 0/255 array", path)
    values = np.unique(arr)
    if not (np.isin(values, (0, 1)).all() or np.isin(values, (0, 255)).all()):
        shown = ", ".join(str(v) for v in values[:6])
        raise MaskError(f"{what} is not binary: values {shown}{'...' if values.size > 6 else ''}", path)
    return arr > 0


def check_shape(mask: np.ndarray, shape: Sequence[int], what: str = "mask", path: str | Path | None = None):
    """Raise :class:`MaskShapeError` unless ``mask.shape == shape``; return the mask."""
    expected = tuple(int(v) for v in shape)
    if tuple(mask.shape) != expected:
        raise MaskShapeError(expected, tuple(mask.shape), what, path)
    return mask


def check_same_shape(*named: tuple[str, np.ndarray]) -> tuple[int, int]:
    """Check that every ``(name, mask)`` has the shape of the first; return that shape."""
    if not named:
        raise ValueError("nothing to check")
    first_name, first = named[0]
    for name, arr in named[1:]:
        if arr.shape != first.shape:
            raise MaskShapeError(first.shape, arr.shape, f"{name} (compared with {first_name})")
    return int(first.shape[0]), int(first.shape[1])


# --- COCO RLE ------------------------------------------------------------------------------------

def column_major_runs(mask: np.ndarray) -> np.ndarray:
    """The uncompressed COCO run lengths of a bool mask: alternating 0- and 1-runs in column-major order, the
    first a (possibly empty) 0-run. Only the mask's bounding box is read pixel by pixel (a large film's
    masks are mostly empty rows and columns), so no column-major copy of the whole image is made."""
    m = as_mask(mask)
    h, w = m.shape
    cols = np.flatnonzero(m.any(axis=0))
    if cols.size == 0:
        return np.asarray([h * w], dtype=np.int64)
    x0, x1 = int(cols[0]), int(cols[-1])
    rows = np.flatnonzero(m[:, x0 : x1 + 1].any(axis=1))
    y0, y1 = int(rows[0]), int(rows[-1])
    crop = m[y0 : y1 + 1, x0 : x1 + 1].T  # one row per image column
    period = crop.shape[1] + 2  # a 0 above and below each column: no run crosses a column in the crop
    padded = np.zeros((crop.shape[0], period), dtype=bool)
    padded[:, 1:-1] = crop
    flat = padded.ravel()
    edges = np.flatnonzero(flat[1:] != flat[:-1]) + 1  # start, end, start, end, ... (column-major order)
    col, row = np.divmod(edges, period)
    at = (x0 + col.astype(np.int64)) * h + y0 + row - 1
    starts, ends = at[0::2], at[1::2]  # ends exclusive
    join = ends[:-1] == starts[1:]  # a run that leaves one column at the bottom and goes on at the next top
    starts, ends = starts[np.concatenate([[True], ~join])], ends[np.concatenate([~join, [True]])]
    bounds = np.empty(2 * starts.size + 2, dtype=np.int64)
    bounds[0], bounds[-1] = 0, h * w
    bounds[1:-1:2], bounds[2:-1:2] = starts, ends
    runs = np.diff(bounds)
    return runs[:-1] if runs[-1] == 0 else runs  # a mask ending in a 1-run has no closing 0-run


def encode_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO RLE ``{"size": [H, W], "counts": str}`` of a bool mask (column-major; the compressed string of
    pycocotools, made from :func:`column_major_runs`)."""
    from pycocotools import mask as coco_mask

    m = as_mask(mask)
    h, w = m.shape
    rle = coco_mask.frPyObjects({"size": [h, w], "counts": column_major_runs(m).tolist()}, h, w)
    return {"size": [int(h), int(w)], "counts": rle["counts"].decode("ascii")}


def rle_size(rle: Mapping[str, Any]) -> tuple[int, int]:
    """The ``(H, W)`` a COCO RLE object declares (two non-negative integers); raises :class:`MaskError`."""
    try:
        size = rle["size"]
        if isinstance(size, str | bytes) or len(size) != 2:
            raise TypeError(f"size must be [H, W], got {size!r}")
        h, w = size
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (h, w)):
            raise ValueError(f"size must be two non-negative integers, got {list(size)!r}")
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise MaskError(f"not a COCO RLE object ({exc})") from exc
    return int(h), int(w)


def rle_string_counts(counts: str | bytes) -> list[int]:
    """The run lengths of a compressed COCO RLE string (pycocotools' ``rleFrString``); raises :class:`MaskError`."""
    runs = _string_runs(counts)
    return runs.tolist() if isinstance(runs, np.ndarray) else runs


def _string_runs(counts: str | bytes) -> np.ndarray | list[int]:
    """:func:`rle_string_counts`, decoded with numpy into an int64 array; a string that reading cannot take as it
    stands (a character outside '0'..'o', a string ending inside a run length, a value over 60 bits, values near
    int64's range) is read by :func:`_string_runs_loop`, which names the fault or gives Python integers."""
    if isinstance(counts, str):
        try:
            data = counts.encode("ascii")
        except UnicodeEncodeError as exc:
            raise MaskError(f"RLE counts string is not ASCII ({exc})") from exc
    else:
        data = bytes(counts)
    c = np.frombuffer(data, dtype=np.uint8).astype(np.int64) - 48
    if c.size == 0:
        return np.zeros(0, dtype=np.int64)
    if ((c < 0) | (c >= 64)).any() or c[-1] & 0x20:
        return _string_runs_loop(data)
    last = np.flatnonzero((c & 0x20) == 0)  # the last character of each value
    first = np.concatenate([[0], last[:-1] + 1])
    width = last - first + 1
    if width.max() > 12:  # more than 60 bits
        return _string_runs_loop(data)
    shift = 5 * (np.arange(c.size) - np.repeat(first, width))
    x = np.add.reduceat((c & 0x1F) << shift, first)
    negative = (c[last] & 0x10) != 0
    x[negative] -= np.left_shift(np.int64(1), 5 * width[negative])  # x |= -1 << 5k: x is below 2**5k
    if x.size and int(np.abs(x).max()) >= 2**40:  # cumulative sums could leave int64
        return _string_runs_loop(data)
    runs = x.copy()
    runs[3::2] = np.cumsum(x[1::2])[1:]  # from the fourth value on, each adds the one two before it
    runs[4::2] = np.cumsum(x[2::2])[1:]
    return runs


def _string_runs_loop(data: bytes) -> list[int]:
    """pycocotools' ``rleFrString`` character by character (the reading that names a corrupt string's fault)."""
    runs: list[int] = []
    p = 0
    while p < len(data):
        x, k, more = 0, 0, True
        while more:
            if p >= len(data):
                raise MaskError("corrupt RLE counts (the string ends inside a run length)")
            c = data[p] - 48
            if not 0 <= c < 64:
                raise MaskError(f"corrupt RLE counts (character {chr(data[p])!r} at {p} is outside '0'..'o')")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x)
    return runs


def _check_runs(runs: Sequence[int] | np.ndarray, size: tuple[int, int]) -> None:
    """Raise :class:`MaskError` unless the run lengths are non-negative and cover exactly ``H*W`` pixels."""
    negative = runs[runs < 0] if isinstance(runs, np.ndarray) else [r for r in runs if r < 0]
    if len(negative):
        raise MaskError(f"RLE has a negative run length ({negative[0]})")
    if isinstance(runs, np.ndarray):  # int64 sums without overflow unless a run alone is already too long
        total = sum(runs.tolist()) if runs.size and runs.max() > size[0] * size[1] else int(runs.sum())
    else:
        total = sum(runs)
    if total != size[0] * size[1]:
        raise MaskError(f"RLE counts sum to {total}, expected {size[0] * size[1]} for size {list(size)} "
                        f"(the runs cover {'less' if total < size[0] * size[1] else 'more'} than the image)")


def rle_counts(rle: Mapping[str, Any], shape: Sequence[int] | None = None) -> np.ndarray:
    """The run lengths of a COCO RLE (compressed string or uncompressed list counts) as an int64 array: alternating
    0- and 1-runs in column-major order, the first a 0-run. The declared size is checked against ``shape`` and the
    runs must be non-negative and cover exactly ``H*W`` pixels (:class:`MaskError` or :class:`MaskShapeError`)."""
    if not isinstance(rle, Mapping) or "counts" not in rle:
        raise MaskError("not a COCO RLE object (it needs 'size' and 'counts')")
    size = rle_size(rle)
    if shape is not None and size != tuple(int(v) for v in shape):
        raise MaskShapeError(tuple(shape), size, "RLE mask")
    counts = rle["counts"]
    if isinstance(counts, list):
        if any(isinstance(c, bool) or not isinstance(c, int) for c in counts):
            raise MaskError("RLE list counts must be integers")
        runs: Sequence[int] | np.ndarray = counts
    elif isinstance(counts, str | bytes):
        runs = _string_runs(counts)
    else:
        raise MaskError(f"RLE counts must be a string or a list, got {type(counts).__name__}")
    _check_runs(runs, size)
    return np.asarray(runs, dtype=np.int64)


def decode_rle(rle: Mapping[str, Any], shape: Sequence[int] | None = None) -> np.ndarray:
    """Bool mask from COCO RLE (compressed string or uncompressed list counts); checks ``shape``.

    The declared size is checked against ``shape`` and the run lengths (non-negative, covering exactly ``H*W``)
    before anything is decoded (:func:`rle_counts`).
    """
    from pycocotools import mask as coco_mask

    runs = rle_counts(rle, shape)
    h, w = rle_size(rle)
    counts = rle["counts"]
    if isinstance(counts, list):
        obj = coco_mask.frPyObjects({"size": [h, w], "counts": runs.tolist()}, h, w)
    else:
        obj = {"size": [h, w], "counts": counts.encode("ascii") if isinstance(counts, str) else counts}
    try:
        out = coco_mask.decode(obj)
    except Exception as exc:  # pycocotools raises bare exceptions on corrupt strings
        raise MaskError(f"corrupt RLE counts ({exc})") from exc
    return out.astype(bool)


def rle_overlap(a: Mapping[str, Any], b: Mapping[str, Any], shape: Sequence[int]) -> tuple[int, int, int]:
    """``(|A|, |B|, |A∩B|)`` in pixels of two COCO RLE masks of ``shape``, from their runs (nothing is decoded to
    pixels; checked as :func:`rle_counts` checks)."""
    starts, ends, areas = [], [], []
    for rle in (a, b):
        bounds = np.cumsum(rle_counts(rle, shape))
        n = len(bounds) // 2  # 1-runs: [bounds[2j], bounds[2j + 1])
        starts.append(bounds[0 : 2 * n : 2])
        ends.append(bounds[1 : 2 * n : 2])
        areas.append(int((ends[-1] - starts[-1]).sum()))
    at = np.concatenate([*starts, *ends])
    step = np.concatenate([np.ones(len(starts[0]) + len(starts[1]), np.int64),
                           -np.ones(len(ends[0]) + len(ends[1]), np.int64)])
    order = np.argsort(at, kind="stable")
    at, depth = at[order], np.cumsum(step[order])  # depth 2 between two events: inside both masks
    both = int(((at[1:] - at[:-1]) * (depth[:-1] == 2)).sum()) if at.size else 0
    return areas[0], areas[1], both


# --- CheXmask / SIIM RLE -------------------------------------------------------------------------

def encode_chexmask_rle(mask: np.ndarray) -> str:
    """Row-major, 1-indexed ``"start length start length ..."`` string (CheXmask, SIIM-ACR)."""
    flat = as_mask(mask).ravel(order="C").astype(np.int8)
    padded = np.concatenate([[0], flat, [0]])
    changes = np.flatnonzero(padded[1:] != padded[:-1]) + 1
    starts, ends = changes[0::2], changes[1::2]
    return " ".join(f"{s} {e - s}" for s, e in zip(starts, ends, strict=True))


def decode_chexmask_rle(text: str, shape: Sequence[int]) -> np.ndarray:
    """Bool mask of ``shape`` from a row-major 1-indexed ``start length`` RLE string."""
    h, w = (int(v) for v in shape)
    out = np.zeros(h * w, dtype=bool)
    text = (text or "").strip()
    if not text or text == "-1":  # SIIM writes -1 for an empty mask
        return out.reshape(h, w)
    try:
        values = np.array([int(v) for v in text.split()], dtype=np.int64)
    except ValueError as exc:
        raise MaskError(f"CheXmask RLE contains a non-integer token ({exc})") from exc
    if values.size % 2:
        raise MaskError(f"CheXmask RLE has an odd number of values ({values.size})")
    starts, lengths = values[0::2] - 1, values[1::2]
    if (starts < 0).any() or (lengths < 0).any() or (starts + lengths > h * w).any():
        raise MaskError(f"CheXmask RLE runs fall outside a {h}x{w} mask")
    for s, n in zip(starts, lengths, strict=True):
        out[s : s + n] = True
    return out.reshape(h, w)


# --- PNG -----------------------------------------------------------------------------------------

#: :func:`read_mask_png` refuses an image with more than this share of pixels strictly between 0 and its maximum.
MAX_GREY_SHARE: Final[float] = 0.5


def _refuse_colour(im: Image.Image, path: Path) -> None:
    """A :class:`MaskError` for a colour image (channels that differ): a mask is one grey channel."""
    rgb = np.asarray(im.convert("RGB"))
    if not (np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 1], rgb[..., 2])):
        raise MaskError(f"not a mask: a colour image (mode {im.mode}); a mask image is single-channel 0/255", path)


def read_mask_png(path: str | Path, shape: Sequence[int] | None = None, threshold: int = 255) -> np.ndarray:
    """Read a single-channel 0/255 (or 0/1) PNG as a bool mask (``value >= threshold``); checks ``shape`` (from the
    header, before decoding). A colour image, or one whose pixels are mostly grey levels between 0 and its maximum
    (a film rather than a mask; :data:`MAX_GREY_SHARE`), is a :class:`~cxrground.errors.MaskError`."""
    path = Path(path)
    try:
        with Image.open(path) as im:
            if shape is not None and (im.height, im.width) != tuple(int(v) for v in shape):
                raise MaskShapeError(tuple(shape), (im.height, im.width), "mask", path)
            load_pixels(im)
            if im.mode not in ("L", "1", "P", "I", "I;16"):
                _refuse_colour(im, path)
                im = im.convert("L")
            arr = np.asarray(im)
    except FileNotFoundError as exc:
        raise MaskError("mask file not found", path) from exc
    except Image.DecompressionBombError as exc:
        raise MaskError(f"too many pixels to decode safely ({exc})", path) from exc
    except OSError as exc:
        raise MaskError(f"cannot decode mask image ({exc})", path) from exc
    if arr.ndim != 2:
        raise MaskError(f"mask image must be single-channel, got shape {arr.shape}", path)
    if arr.dtype == bool:
        mask = arr
    else:
        top = arr.max(initial=0)
        if top == 1:  # 0/1 PNGs are common in the wild
            threshold = 1
        elif 0 < top < threshold:  # e.g. a 0/128 mask: read at 255 it would be silently empty
            raise MaskError(f"mask values go from 0 to {int(top)}, and none reaches {threshold}: a mask image holds "
                            "0 and 255 (or 0 and 1)", path)
        between = float(np.count_nonzero((arr > 0) & (arr < top))) / max(arr.size, 1)
        if between > MAX_GREY_SHARE:  # soft edges are a few per cent at most; a film is mostly grey levels
            raise MaskError(f"not a mask: {between:.0%} of its pixels are grey levels between 0 and {int(top)} (a mask "
                            "image holds two values, 0 and 255 or 0 and 1)", path)
        mask = arr >= threshold
    if shape is not None:
        check_shape(mask, shape, "mask", path)
    return mask


def write_mask_png(path: str | Path, mask: np.ndarray) -> Path:
    """Write a bool mask as an 8-bit single-channel PNG with values 0/255."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(as_mask(mask).astype(np.uint8) * 255, mode="L").save(path, optimize=False)
    return path
