"""VinDr-CXR box annotations: reading ``train.csv``, the class mapping, fusing the readers' boxes, the split.

**File.** One row per box and reader: ``image_id, class_name, x_min, y_min, x_max, y_max, rad_id`` (VinDr-CXR's
``annotations_train.csv`` and the VinBigData ``train.csv``; columns are found by name, others such as ``class_id``
are ignored). A ``No finding`` row, with empty coordinates, says that reader saw no lesion on the image.
Coordinates are pixel edges of the original DICOM. Optional ``width``/``height`` columns give that original size
when the images read are resized copies (PNG conversions): boxes are then scaled to the image read.

**Classes.** :func:`class_list` is the detector's class list: ``kept`` (default) = the ten hyperintense classes of
ILS §8 in VinDr's spelling (:data:`~cxrground.ils.spatial.boxes.KEPT_CLASSES`), ``all`` = the fourteen VinDr box
classes. Rows of other classes are dropped. Which ILS lesion each kept class may ground is
:data:`~cxrground.ils.spatial.boxes.BOX_CLASS_LESIONS`.

**Fusion** (:func:`fuse_readers`). VinDr's training images carry the boxes of three radiologists. Per image and
class the boxes are fused by *weighted boxes fusion* (Solovyev et al., 2021) with equal reader weights: boxes are
taken largest first (ties: reader, then position); each joins the fused cluster whose current fused box it
overlaps most with IoU ≥ ``iou`` (default 0.4), else starts a cluster; a fused box is the mean of its members'
coordinates. A fused box is kept when at least ``min_readers`` different readers support it (default 1: every
finding any reader marked). Its ``support`` is the share of the image's readers that marked it.

**Split** (:func:`assign_split`). By group: the patient id from an ``image_id,patient_id`` file when given (all
images of a patient fall in one split), else the image id. A group goes to ``test``/``val``/``train`` by a
seeded hash of its id, so the split does not depend on the order of the rows or on the other images.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from cxrground.errors import ConfigError, InputError
from cxrground.ils.spatial.boxes import KEPT_CLASSES, VINDR_CXR_CLASSES, normalize_class_name
from cxrground.io.files import read_csv_text

__all__ = [
    "IMAGE_SUFFIXES",
    "NO_FINDING",
    "FusedBox",
    "ReaderBox",
    "assign_split",
    "class_list",
    "find_images",
    "fuse_readers",
    "read_annotations",
    "read_patients",
]

NO_FINDING: Final = "No finding"
#: Image files looked up for an ``image_id`` (VinDr ships ``.dicom``; PNG/JPEG conversions are common).
IMAGE_SUFFIXES: Final[tuple[str, ...]] = (".dicom", ".dcm", ".png", ".jpg", ".jpeg")
_REQUIRED: Final = ("image_id", "class_name", "x_min", "y_min", "x_max", "y_max")


@dataclass(frozen=True)
class ReaderBox:
    """One reader's box in original pixel-edge coordinates (``class_name`` in VinDr's spelling)."""

    image_id: str
    class_name: str
    x0: float
    y0: float
    x1: float
    y1: float
    rad_id: str = ""


@dataclass(frozen=True)
class FusedBox:
    """A box after fusing the readers; ``support`` = share of the image's readers behind it."""

    class_name: str
    x0: float
    y0: float
    x1: float
    y1: float
    readers: int
    support: float

    def scaled(self, sx: float, sy: float, ox: float = 0.0, oy: float = 0.0) -> FusedBox:
        """The box with x scaled by ``sx`` then shifted by ``ox`` (y likewise)."""
        return FusedBox(self.class_name, self.x0 * sx + ox, self.y0 * sy + oy, self.x1 * sx + ox, self.y1 * sy + oy,
                        self.readers, self.support)


def class_list(which: Literal["kept", "all"] = "kept") -> tuple[str, ...]:
    """The detector's classes in VinDr's spelling: the ten kept by ILS §8, or all fourteen box classes."""
    boxes = tuple(c for c in VINDR_CXR_CLASSES if c != NO_FINDING)
    if which == "all":
        return boxes
    if which == "kept":
        kept = {normalize_class_name(k) for k in KEPT_CLASSES}
        return tuple(c for c in boxes if normalize_class_name(c) in kept)
    raise ConfigError(f"classes must be 'kept' or 'all', got {which!r}")


def _number(value: str, column: str, path: Path, line: int) -> float:
    try:
        number = float(value)
    except ValueError:
        raise InputError(f"line {line}: {column} {value!r} is not a number", path) from None
    if not math.isfinite(number):
        raise InputError(f"line {line}: {column} {value!r} is not finite", path)
    return number


def _size(value: str, column: str, path: Path, line: int) -> int:
    size = int(_number(value, column, path, line))
    if size <= 0:
        raise InputError(f"line {line}: {column} {value!r} is not a positive size in pixels", path)
    return size


def read_annotations(path: str | Path) -> tuple[dict[str, list[ReaderBox]], dict[str, set[str]],
                                                dict[str, tuple[int, int]]]:
    """Boxes per image (every class, VinDr spelling), readers per image, and original ``(H, W)`` when given.

    Every image of the file appears in the first two maps, ``No finding`` images with no box. A missing column,
    a non-numeric or inverted box, a width or height that is not positive is an
    :class:`~cxrground.errors.InputError` naming the file and line.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError("annotations file not found", p)
    canonical = {normalize_class_name(c): c for c in VINDR_CXR_CLASSES}
    boxes: dict[str, list[ReaderBox]] = defaultdict(list)
    readers: dict[str, set[str]] = defaultdict(set)
    sizes: dict[str, tuple[int, int]] = {}
    reader = csv.DictReader(io.StringIO(read_csv_text(p, "annotations file"), newline=""))
    missing = [c for c in _REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise InputError(f"missing column(s) {missing}; expected {', '.join(_REQUIRED)}, rad_id", p)
    for row in reader:
        line = reader.line_num  # the file line (a row with a quoted line break: its last line)
        image_id = (row["image_id"] or "").strip()
        if not image_id:
            raise InputError(f"line {line}: empty image_id", p)
        rad = (row.get("rad_id") or "").strip()
        readers[image_id].add(rad)
        if row.get("width") and row.get("height"):
            sizes[image_id] = (_size(row["height"], "height", p, line), _size(row["width"], "width", p, line))
        name = canonical.get(normalize_class_name(row["class_name"] or ""))
        if name is None:
            raise InputError(f"line {line}: unknown class {row['class_name']!r} (VinDr-CXR classes: "
                             f"{', '.join(VINDR_CXR_CLASSES)})", p)
        if name == NO_FINDING:
            boxes.setdefault(image_id, [])
            continue
        x0, y0, x1, y1 = (_number(row[c] or "", c, p, line) for c in ("x_min", "y_min", "x_max", "y_max"))
        if x1 <= x0 or y1 <= y0:
            raise InputError(f"line {line}: empty box ({x0}, {y0}, {x1}, {y1})", p)
        boxes[image_id].append(ReaderBox(image_id, name, x0, y0, x1, y1, rad))
    if not readers:
        raise InputError("no annotation rows", p)
    return dict(boxes), dict(readers), sizes


def read_patients(path: str | Path) -> dict[str, str]:
    """``image_id → patient_id`` from a CSV with those two columns."""
    p = Path(path)
    reader = csv.DictReader(io.StringIO(read_csv_text(p, "patients file"), newline=""))
    if not {"image_id", "patient_id"} <= set(reader.fieldnames or []):
        raise InputError("expected columns image_id, patient_id", p)
    patients: dict[str, str] = {}
    for row in reader:
        image, patient = (row["image_id"] or "").strip(), (row["patient_id"] or "").strip()
        if not image or not patient:
            raise InputError(f"line {reader.line_num}: empty image_id or patient_id", p)
        patients[image] = patient
    return patients


def _iou(a: Sequence[float], b: Sequence[float]) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def fuse_readers(boxes: Iterable[ReaderBox], n_readers: int, iou: float = 0.4,
                 min_readers: int = 1) -> list[FusedBox]:
    """Weighted boxes fusion of one image's reader boxes, per class (see the module docstring)."""
    if not 0.0 < iou <= 1.0:
        raise ConfigError(f"fusion IoU must be in (0, 1], got {iou}")
    by_class: dict[str, list[ReaderBox]] = defaultdict(list)
    for b in boxes:
        by_class[b.class_name].append(b)
    out: list[FusedBox] = []
    for name in sorted(by_class):
        ordered = sorted(by_class[name], key=lambda b: (-(b.x1 - b.x0) * (b.y1 - b.y0), b.rad_id, b.y0, b.x0))
        clusters: list[list[ReaderBox]] = []
        fused: list[tuple[float, float, float, float]] = []
        for b in ordered:
            coords = (b.x0, b.y0, b.x1, b.y1)
            scores = [_iou(coords, f) for f in fused]
            best = max(range(len(scores)), key=scores.__getitem__, default=-1)
            if best >= 0 and scores[best] >= iou:
                clusters[best].append(b)
                members = clusters[best]
                fused[best] = tuple(sum(getattr(m, k) for m in members) / len(members)  # type: ignore[assignment]
                                    for k in ("x0", "y0", "x1", "y1"))
            else:
                clusters.append([b])
                fused.append(coords)
        for members, (x0, y0, x1, y1) in zip(clusters, fused, strict=True):
            n = len({m.rad_id for m in members})
            if n >= min_readers:
                out.append(FusedBox(name, x0, y0, x1, y1, n, round(min(1.0, n / max(1, n_readers)), 4)))
    return out


def assign_split(group: str, seed: int, val: float, test: float) -> str:
    """``train``/``val``/``test`` for a group id by a seeded hash (stable, order-free)."""
    if val < 0 or test < 0 or val + test >= 1:
        raise ConfigError(f"val and test fractions must be >= 0 and sum below 1, got {val} and {test}")
    u = int.from_bytes(hashlib.sha256(f"{seed}:{group}".encode()).digest()[:8], "big") / 2**64
    return "test" if u < test else "val" if u < test + val else "train"


def find_images(folder: str | Path, ids: Iterable[str]) -> dict[str, Path]:
    """``image_id → file`` for the ids found under ``folder`` (recursively; ``.dicom``/``.dcm`` before PNG/JPEG)."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError("image folder not found", root)
    wanted = set(ids)
    rank = {s: i for i, s in enumerate(IMAGE_SUFFIXES)}
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*")):
        suffix = path.suffix.lower()
        if suffix in rank and path.stem in wanted and path.is_file():
            old = found.get(path.stem)
            if old is None or rank[suffix] < rank[old.suffix.lower()]:
                found[path.stem] = path
    return found
