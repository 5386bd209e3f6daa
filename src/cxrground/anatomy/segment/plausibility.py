"""Are these lungs plausible? A check of a lung segmentation before anything is measured on it.

A lung segmenter can fail without an error: on a rotated paediatric portable it may call the arm, the body outline
or a film marker "lung", or run into the abdomen or over the shoulder. Every later number (zones, CTR, the heart
estimate, ILS location masks) would then be measured on that. :func:`lung_problems` returns the reasons a pair of
lung masks is implausible (empty list: plausible):

- a lung is missing, or the two lungs together cover less than :data:`MIN_LUNG_FRACTION` of the image;
- the lungs are on the wrong sides (the patient's right lung is on the image left on a frontal film);
- **shape**: the two masks, resampled into their common bounding box (:data:`GRID` × :data:`GRID` per lung), overlap
  the mean annotated lung shape (:class:`LungShape`, ``lung_shape_v1.npz``) with an IoU below
  :data:`MIN_SHAPE_IOU`. The mean shape is the average of the human lung annotations of the shippable COVID-19
  collection rows of cxr-pack-v1 (CC BY; recipe ``bench/lung_shape_fit.py``); the lowest IoU of any of those
  annotations with it is 0.59, so the threshold leaves a margin for unusual but real lungs (children, large
  effusions) while it catches lungs that leak into the abdomen, the shoulder or outside the body.

:func:`segment_checked` segments a film and, when its lungs are implausible but those of its grey-level negative are
clearly lung-shaped (shape IoU at least :data:`INVERT_MIN_SHAPE_IOU`, the 5th percentile of the human annotations,
stricter than :data:`MIN_SHAPE_IOU`: reading a film inverted is a strong step, and a segmenter can find lung-like
shapes in the negative of a correctly stored film), returns the negative and its masks: a film exported with
inverted grey levels (bones dark, lungs bright; a PNG or JPEG cannot say so, unlike a DICOM's MONOCHROME1) is then
read the right way round, and says so in its metadata. A film whose lungs are plausible as stored but brighter than
the mediastinum between them (:func:`looks_inverted`: aerated lung is darker than the heart and spine on a film
stored the right way round) is read as its negative too, when the negative's lungs are plausible and darker than
its mediastinum (``bench/records/film_polarity_preregistration.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np
from scipy import ndimage

from cxrground.anatomy.segment.base import LungHeartMasks, LungHeartSegmenter, segment_image
from cxrground.anatomy.segment.heart import _medial_edges
from cxrground.anatomy.segment.tilt import turn
from cxrground.errors import InputError
from cxrground.io.cxr_image import CXRImage

__all__ = ["GRID", "INVERTED_BRIGHT_NOTE", "INVERTED_NOTE", "INVERT_MIN_SHAPE_IOU", "MAX_FILM_ASPECT", "MIN_FILM_SIDE",
           "MIN_LUNG_FRACTION", "MIN_SHAPE_IOU", "LungShape", "blank_problem", "film_size_problem", "looks_inverted",
           "lung_problems", "reading_problems", "segment_checked", "shape_descriptor", "shipped_lung_shape"]

#: Side of the per-lung grid the masks are resampled to inside their common bounding box.
GRID: Final[int] = 32
#: The two lungs together must cover at least this share of the image.
MIN_LUNG_FRACTION: Final[float] = 0.05
#: Lungs whose shape descriptor overlaps the mean annotated shape less than this are implausible.
MIN_SHAPE_IOU: Final[float] = 0.50
#: A film is read as its grey-level negative only when the negative's lungs reach this shape IoU: the 5th
#: percentile of the 97 human annotations the mean shape was fitted on (``bench/lung_shape_fit.py``).
INVERT_MIN_SHAPE_IOU: Final[float] = 0.685
SHAPE_NAME: Final[str] = "lung_shape_v1"
#: ``CXRImage.metadata["polarity"]`` of a film :func:`segment_checked` read as its negative.
INVERTED_NOTE: Final[str] = ("grey levels inverted by cxrground: the film's lungs were implausible as stored and "
                             "plausible in its negative")
#: The same note for a film whose lungs were plausible as stored but brighter than its mediastinum.
INVERTED_BRIGHT_NOTE: Final[str] = ("grey levels inverted by cxrground: the film's lungs were brighter than its "
                                    "mediastinum as stored, and darker in its negative")


def shape_descriptor(right: np.ndarray, left: np.ndarray) -> np.ndarray:
    """``(2, GRID, GRID)`` booleans: each lung resampled into the bounding box of both (right lung first)."""
    r, lft = np.asarray(right, bool), np.asarray(left, bool)
    ys, xs = np.nonzero(r | lft)
    if not len(ys):
        raise ValueError("no lung pixel")
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    out = []
    for m in (r, lft):
        crop = m[y0:y1, x0:x1].astype(np.float32)
        zoomed = ndimage.zoom(crop, (GRID / crop.shape[0], GRID / crop.shape[1]), order=1, grid_mode=True,
                              mode="nearest")
        out.append(zoomed[:GRID, :GRID] > 0.5)
    return np.stack(out)


@dataclass(frozen=True)
class LungShape:
    """The mean annotated lung shape: ``mean`` ``(2, GRID, GRID)`` in [0, 1] (share of annotations covering each
    cell), and its provenance."""

    mean: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        m = np.asarray(self.mean)
        if m.shape != (2, GRID, GRID) or not np.all(np.isfinite(m)) or m.min() < 0 or m.max() > 1:
            raise ValueError(f"a lung shape is a (2, {GRID}, {GRID}) array in [0, 1], got {m.shape}")

    @classmethod
    def fit(cls, pairs: list[tuple[np.ndarray, np.ndarray]], meta: dict[str, Any] | None = None) -> LungShape:
        """The mean of the descriptors of annotated ``(right, left)`` lung masks."""
        if not pairs:
            raise ValueError("need at least one annotated pair of lungs")
        mean = np.mean([shape_descriptor(r, lft) for r, lft in pairs], axis=0)
        return cls(mean, {**(meta or {}), "annotations": len(pairs)})

    def iou(self, right: np.ndarray, left: np.ndarray) -> float:
        """IoU of the lungs' descriptor with the mean shape (thresholded at one half)."""
        d = shape_descriptor(right, left)
        t = self.mean > 0.5
        return float((d & t).sum() / max(1, (d | t).sum()))

    def save(self, path: str | Path) -> Path:
        """Write ``mean`` (float16) and the provenance (JSON) to an ``.npz``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, mean=self.mean.astype(np.float16), meta=np.array(json.dumps(self.meta)))
        return path

    @classmethod
    def load(cls, path: str | Path) -> LungShape:
        """Read a shape written by :meth:`save`."""
        path = Path(path)
        if not path.is_file():
            raise InputError("lung shape file not found", path)
        try:
            with np.load(path) as data:
                return cls(data["mean"].astype(np.float32), {**json.loads(str(data["meta"])), "path": str(path)})
        except (ValueError, KeyError, OSError) as exc:
            raise InputError(f"not a lung shape file ({exc})", path) from exc


def shipped_shape_path() -> Path:
    """Path of the shipped ``lung_shape_v1.npz``."""
    return Path(str(resources.files("cxrground.anatomy.segment") / "weights" / f"{SHAPE_NAME}.npz"))


@functools.cache
def shipped_lung_shape() -> LungShape:
    """The shipped mean annotated lung shape, loaded once per process."""
    return LungShape.load(shipped_shape_path())


def lung_problems(right: np.ndarray, left: np.ndarray, shape: LungShape | None = None,
                  min_iou: float = MIN_SHAPE_IOU, min_fraction: float = MIN_LUNG_FRACTION) -> list[str]:
    """Why the lung masks ``right`` and ``left`` (same grid, right lung = image left) are implausible (module
    docstring); an empty list when they are plausible. ``shape``: the mean shape (default: the shipped one);
    ``min_iou`` 0 skips the shape check."""
    r, lft = np.asarray(right, bool), np.asarray(left, bool)
    if not r.any() or not lft.any():
        return ["one lung not found"]
    share = float((r | lft).mean())
    if share < min_fraction:
        return [f"lungs cover {share:.1%} of the image (less than {min_fraction:.0%})"]
    problems = []
    if np.nonzero(r)[1].mean() >= np.nonzero(lft)[1].mean():
        problems.append("the right lung is not on the image left of the left lung")
    iou = (shape or shipped_lung_shape()).iou(r, lft) if min_iou > 0 else 1.0
    if iou < min_iou:
        problems.append(f"lung shape unlike annotated lungs (IoU {iou:.2f} with the mean annotated shape, "
                        f"below {min_iou:.2f})")
    return problems


def looks_inverted(pixels: np.ndarray, right: np.ndarray, left: np.ndarray) -> bool:
    """True when the lungs are brighter than the mediastinum between them (median grey levels), as on a film stored
    with inverted grey levels; False when the gap between the lungs holds under 1 % of the lung pixels."""
    px, r, lft = np.asarray(pixels), np.asarray(right, bool), np.asarray(left, bool)
    lungs = r | lft
    a, b = _medial_edges(r, "right")[:, None], _medial_edges(lft, "left")[:, None]  # NaN where a lung is missing
    cols = np.arange(r.shape[1])[None, :]
    gap = (cols > a) & (cols < b)  # strictly between the medial edges, on rows that hold both lungs
    if not lungs.any() or gap.sum() < 0.01 * lungs.sum():
        return False
    return bool(np.median(px[lungs]) > np.median(px[gap]))


def reading_problems(masks: LungHeartMasks, min_iou: float = MIN_SHAPE_IOU,
                     min_fraction: float = MIN_LUNG_FRACTION) -> list[str]:
    """:func:`lung_problems` of a reading's lungs, judged upright: turned by ``extra["tilt"]`` first when the
    segmenter read the film turned upright (``extra["tilt_kept"]``; the mean shape is an upright one)."""
    right, left = masks.right_lung, masks.left_lung
    if masks.extra.get("tilt_kept"):
        tilt = float(masks.extra["tilt"])
        right, left = turn(right, tilt, mask=True), turn(left, tilt, mask=True)
    return lung_problems(right, left, min_iou=min_iou, min_fraction=min_fraction)


#: Smallest side (pixels) and largest side ratio of an image read as a chest film.
MIN_FILM_SIDE: Final[int] = 64
MAX_FILM_ASPECT: Final[float] = 4.0


def film_size_problem(shape: tuple[int, ...]) -> str | None:
    """Why an image of ``shape`` (H, W) cannot be a chest film: a side under :data:`MIN_FILM_SIDE` pixels or sides
    more than :data:`MAX_FILM_ASPECT` times apart; None otherwise."""
    h, w = int(shape[0]), int(shape[1])
    if min(h, w) < MIN_FILM_SIDE:
        return f"image is {w}x{h} pixels: too small to read a chest film (at least {MIN_FILM_SIDE} px a side)"
    if max(h, w) > MAX_FILM_ASPECT * min(h, w):
        return f"image is {w}x{h} pixels: too narrow to be a chest film (sides at most {MAX_FILM_ASPECT:g}:1)"
    return None


def blank_problem(pixels: np.ndarray) -> str | None:
    """Why ``pixels`` hold no picture (every pixel the same grey level: a blank or uniform image), or None."""
    lo, hi = int(np.min(pixels)), int(np.max(pixels))
    return f"image is blank (one grey level, {lo})" if lo == hi else None


def segment_checked(segmenter: LungHeartSegmenter, image: CXRImage, min_iou: float = MIN_SHAPE_IOU,
                    min_fraction: float = MIN_LUNG_FRACTION,
                    invert_min_iou: float = INVERT_MIN_SHAPE_IOU) -> tuple[CXRImage, LungHeartMasks, list[str]]:
    """Segment ``image``; returns the film to read, its masks and their problems (:func:`lung_problems`; empty when
    plausible). The film to read is its grey-level negative (``metadata["polarity"]`` and the masks'
    ``extra["polarity"]`` say why) when the stored film's lungs are implausible and the negative's are plausible
    with a shape IoU of at least ``invert_min_iou``, or when the stored film's lungs are plausible but
    :func:`looks_inverted` and the negative's are plausible and do not; otherwise ``image`` itself. An image too
    small or too narrow to be a film (:func:`film_size_problem`), or blank (:func:`blank_problem`), is an
    :class:`InputError`, not segmented."""
    small = film_size_problem(image.pixels.shape) or blank_problem(image.pixels)
    if small is not None:
        raise InputError(small, image.path or "<image>")
    masks = segment_image(segmenter, image)
    problems = reading_problems(masks, min_iou=min_iou, min_fraction=min_fraction)
    bright = not problems and looks_inverted(image.pixels, masks.right_lung, masks.left_lung)
    if not problems and not bright:
        return image, masks, problems
    note = INVERTED_BRIGHT_NOTE if bright else INVERTED_NOTE
    negative = dataclasses.replace(image, pixels=255 - image.pixels, metadata={**image.metadata, "polarity": note})
    flipped = segment_image(segmenter, negative)
    if bright:
        accept = (not reading_problems(flipped, min_iou=min_iou, min_fraction=min_fraction)
                  and not looks_inverted(negative.pixels, flipped.right_lung, flipped.left_lung))
    else:
        accept = not reading_problems(flipped, min_iou=max(min_iou, invert_min_iou),
                                   min_fraction=min_fraction)
    if not accept:
        return image, masks, problems
    flipped.extra["polarity"] = note
    return negative, flipped, []
