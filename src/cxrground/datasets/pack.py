"""Loader for the shared real-data pack ``cxr-pack-v1`` (NIH images, COVID-19 collection images with
lung masks, notes and zone scores, Open-i reports). Files are read in place, never copied.

Licences (ATTRIBUTION.md): only Cohen rows in :data:`SHIPPABLE_LICENCES` may train anything that is
shipped; the NC-SA rows are for tests and evaluation. :meth:`CohenRecord.shippable` says which.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cxrground.errors import InputError
from cxrground.io.files import sha256_file
from cxrground.io.image import CXRImage, read_image
from cxrground.io.masks import read_mask_png

__all__ = [
    "PACK_ENV",
    "PACK_HELP",
    "SHIPPABLE_LICENCES",
    "BrixiaScore",
    "CohenRecord",
    "NIHBox",
    "NIHRecord",
    "Pack",
    "PackMissingError",
    "find_pack",
]

PACK_ENV = "CXRGROUND_PACK"
PACK_NAME = "cxr-pack-v1"
PACK_HELP = "cxr-pack-v1 folder (default: $CXRGROUND_PACK or ../shared/data/cxr-pack-v1)."  # where find_pack looks
SHIPPABLE_LICENCES: frozenset[str] = frozenset({"CC BY 3.0", "CC BY 4.0", "listed as authorized for everyone"})
BRIXIA_ZONES: tuple[str, ...] = ("A", "B", "C", "D", "E", "F")
"""Brixia zones: A/B/C = right upper/mid/lower, D/E/F = left upper/mid/lower."""


class PackMissingError(InputError):
    """The data pack is not where it was looked for."""


def find_pack(path: str | Path | None = None) -> Path:
    """The pack folder: ``path``, else ``$CXRGROUND_PACK``, else ``shared/data/cxr-pack-v1`` in or beside the
    current folder or one above it, or beside the checkout this package is installed from."""
    candidates: list[Path] = []
    if path is not None:
        candidates.append(Path(path))
    elif os.environ.get(PACK_ENV):
        candidates.append(Path(os.environ[PACK_ENV]))
    else:
        here = Path(__file__).resolve()
        for base in (Path.cwd(), *Path.cwd().parents, *here.parents[2:5]):
            candidates.append(base / "shared" / "data" / PACK_NAME)
            candidates.append(base.parent / "shared" / "data" / PACK_NAME)
    for cand in candidates:
        if (cand / "README.md").is_file() and (cand / "cohen").is_dir():
            return cand.resolve()
    where = str(candidates[0]) if path is not None or os.environ.get(PACK_ENV) else "../shared/data/" + PACK_NAME
    raise PackMissingError(f"{PACK_NAME} not found; set {PACK_ENV} to its folder", where)


@dataclass(frozen=True)
class NIHBox:
    """One NIH bounding box, in the 512-px frame of the pack's images."""

    label: str
    x: float
    y: float
    w: float
    h: float


@dataclass(frozen=True)
class NIHRecord:
    """One NIH ChestX-ray14 image with its finding labels (``No Finding`` for normals)."""

    image_path: Path
    labels: tuple[str, ...]
    view: str
    age: int | None
    sex: str
    orig_size: tuple[int, int]
    boxes: tuple[NIHBox, ...] = ()

    @property
    def image_id(self) -> str:
        """File stem, e.g. ``00000075_000``."""
        return self.image_path.stem

    def read(self) -> CXRImage:
        """The image as a :class:`CXRImage` (view filled in from the labels file)."""
        im = read_image(self.image_path)
        return CXRImage(**{**im.__dict__, "view": self.view})


@dataclass(frozen=True)
class BrixiaScore:
    """Brixia zone scores (0-3) by the senior (S) and junior (J) radiologist."""

    senior: dict[str, int]
    junior: dict[str, int]


@dataclass(frozen=True)
class CohenRecord:
    """One COVID-19 collection image with right/left lung masks, licence, notes and optional scores."""

    image_path: Path
    right_mask_path: Path
    left_mask_path: Path
    ignore_mask_path: Path | None
    finding: str
    view: str
    sex: str
    age: float | None
    license: str
    source_url: str
    doi: str
    notes: str
    patient_id: str
    brixia: BrixiaScore | None = None
    severity: dict[str, float] = field(default_factory=dict)

    @property
    def image_id(self) -> str:
        """File stem of the image."""
        return self.image_path.stem

    @property
    def shippable(self) -> bool:
        """True when the licence allows shipping derived artefacts (trained weights)."""
        return self.license in SHIPPABLE_LICENCES

    def read(self) -> CXRImage:
        """The image as a :class:`CXRImage`."""
        im = read_image(self.image_path)
        return CXRImage(**{**im.__dict__, "view": self.view or None})

    def lungs(self, shape: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(right, left) lung masks; checked against ``shape`` (default: the image's size)."""
        if shape is None:
            shape = self.read().shape
        return read_mask_png(self.right_mask_path, shape), read_mask_png(self.left_mask_path, shape)

    def ignore(self, shape: tuple[int, int]) -> np.ndarray | None:
        """The annotators' "ignore" region, if any."""
        return None if self.ignore_mask_path is None else read_mask_png(self.ignore_mask_path, shape)


class Pack:
    """Typed access to the pack's three parts."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = find_pack(root)

    def nih(self) -> list[NIHRecord]:
        """All NIH records with their boxes attached."""
        boxes: dict[str, list[NIHBox]] = {}
        for row in _rows(self.root / "nih" / "boxes_512.csv"):
            boxes.setdefault(row["image"], []).append(
                NIHBox(row["label"], float(row["x"]), float(row["y"]), float(row["w"]), float(row["h"]))
            )
        out = []
        for row in _rows(self.root / "nih" / "labels.csv"):
            w, h = (int(v) for v in row["orig_size"].split("x"))
            out.append(NIHRecord(
                image_path=self.root / "nih" / "images" / row["image"],
                labels=tuple(row["labels"].split("|")),
                view=row["view"],
                age=int(row["age"]) if row["age"].strip() else None,
                sex=row["sex"],
                orig_size=(h, w),
                boxes=tuple(boxes.get(row["image"], ())),
            ))
        return out

    def cohen(self, shippable_only: bool = False) -> list[CohenRecord]:
        """All Cohen records (or only those whose licence allows shipping derived weights)."""
        base = self.root / "cohen"
        brixia = {row["filename"]: _brixia(row) for row in _rows(base / "brixia_scores.csv")}
        severity = {
            row["filename"]: {k: float(v) for k, v in row.items() if k != "filename" and v}
            for row in _rows(base / "severity_scores.csv")
        }
        out = []
        for row in _rows(base / "metadata.csv"):
            stem = Path(row["image"]).stem
            ignore = base / "masks" / f"{stem}_ignore.png"
            rec = CohenRecord(
                image_path=base / "images" / row["image"],
                right_mask_path=base / "masks" / f"{stem}_right_lung.png",
                left_mask_path=base / "masks" / f"{stem}_left_lung.png",
                ignore_mask_path=ignore if ignore.is_file() else None,
                finding=row["finding"],
                view=row["view"],
                sex=row["sex"],
                age=float(row["age"]) if row["age"].strip() else None,
                license=row["license"],
                source_url=row["source_url"],
                doi=row["doi"],
                notes=row["notes"].strip(),
                patient_id=row["patientid"],
                brixia=brixia.get(row["source_filename"]) or brixia.get(row["image"]),
                severity=severity.get(row["source_filename"]) or severity.get(row["image"]) or {},
            )
            if rec.shippable or not shippable_only:
                out.append(rec)
        return out

    def describe(self) -> list[str]:
        """What the pack holds, as lines: images, boxes, labels, masks, notes, scores, licences, reports."""
        nih, cohen = self.nih(), self.cohen()
        labels = Counter(lab for r in nih for lab in r.labels)
        licences = Counter(r.license for r in cohen)
        return [f"pack: {self.root}",
                f"nih: {len(nih)} images, {sum(len(r.boxes) for r in nih)} boxes",
                "  labels: " + ", ".join(f"{k} {v}" for k, v in labels.most_common()),
                f"cohen: {len(cohen)} images with right/left lung masks, "
                f"{sum(r.ignore_mask_path is not None for r in cohen)} ignore masks, "
                f"{sum(bool(r.notes) for r in cohen)} with notes, {sum(r.brixia is not None for r in cohen)} Brixia, "
                f"{sum(bool(r.severity) for r in cohen)} severity scores",
                "  licences: " + ", ".join(f"{k} {v}" for k, v in licences.most_common()),
                f"  shippable (may train shipped weights): {sum(r.shippable for r in cohen)}",
                f"iu_reports: {len(self.iu_report_paths())} Open-i XML reports"]

    def iu_report_paths(self) -> list[Path]:
        """Paths of the Open-i XML reports, sorted by numeric id."""
        paths = list((self.root / "iu_reports").glob("*.xml"))
        return sorted(paths, key=lambda p: (int(p.stem) if p.stem.isdigit() else 10**9, p.stem))

    def verify(self) -> list[str]:
        """Check ``MANIFEST.sha256``; returns the files whose checksum differs or that are missing."""
        bad = []
        for line in (self.root / "MANIFEST.sha256").read_text().splitlines():
            if not line.strip():
                continue
            digest, name = line.split(maxsplit=1)
            path = self.root / name.strip().lstrip("*")
            if not path.is_file() or sha256_file(path) != digest:
                bad.append(name.strip())
        return bad


def _rows(path: Path) -> Iterator[dict[str, str]]:
    if not path.is_file():
        raise InputError("pack file missing", path)
    with path.open(newline="", encoding="utf-8") as fh:
        yield from csv.DictReader(fh)


def _brixia(row: dict[str, str]) -> BrixiaScore:
    return BrixiaScore(
        senior={z: int(row[f"S-{z}"]) for z in BRIXIA_ZONES},
        junior={z: int(row[f"J-{z}"]) for z in BRIXIA_ZONES},
    )
