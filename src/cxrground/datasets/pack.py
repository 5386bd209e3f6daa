"""Loader for the shared real-data pack ``cxr-pack-v1`` (NIH images, COVID-19 collection images with
lung masks, notes and zone scores, Open-i reports). Files are read in place, never copied.

Licences (ATTRIBUTION.md): only Cohen rows in :data:`SHIPPABLE_LICENCES` may train anything that is
shipped; the NC-SA rows are for tests and evaluation. :meth:`CohenRecord.shippable` says which.
"""

from __future__ import annotations

import csv
import io
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

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
T = TypeVar("T")
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
    if path is not None:
        raise PackMissingError(f"not the {PACK_NAME} folder (it has no README.md and cohen/ folder)", path)
    if os.environ.get(PACK_ENV):
        raise PackMissingError(f"not the {PACK_NAME} folder named by ${PACK_ENV} (it has no README.md and cohen/ "
                               "folder)", candidates[0])
    raise PackMissingError(f"{PACK_NAME} not found; set {PACK_ENV} to its folder or give its path",
                           "../shared/data/" + PACK_NAME)


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
        """All NIH records with their boxes attached; an :class:`InputError` naming the file and line of the first
        row that cannot be read (:meth:`verify` lists them all)."""
        return _first_problem_raised(*self._nih())

    def _nih(self) -> tuple[list[NIHRecord], list[InputError]]:
        """The NIH records and the problems of the rows that cannot be read."""
        found, bad = _parse(self.root / "nih" / "boxes_512.csv", lambda row: (row["image"], NIHBox(
            row["label"], float(row["x"]), float(row["y"]), float(row["w"]), float(row["h"]))))
        boxes: dict[str, list[NIHBox]] = {}
        for image, box in found:
            boxes.setdefault(image, []).append(box)

        def record(row: dict[str, str]) -> NIHRecord:
            size = row["orig_size"].split("x")
            if len(size) != 2 or not all(v.strip().isdigit() for v in size):
                raise ValueError(f"orig_size {row['orig_size']!r} is not WIDTHxHEIGHT")
            w, h = (int(v) for v in size)
            return NIHRecord(
                image_path=self.root / "nih" / "images" / row["image"],
                labels=tuple(row["labels"].split("|")),
                view=row["view"],
                age=int(row["age"]) if row["age"].strip() else None,
                sex=row["sex"],
                orig_size=(h, w),
                boxes=tuple(boxes.get(row["image"], ())),
            )

        out, more = _parse(self.root / "nih" / "labels.csv", record)
        return out, [*bad, *more]

    def cohen(self, shippable_only: bool = False) -> list[CohenRecord]:
        """All Cohen records (or only those whose licence allows shipping derived weights); an :class:`InputError`
        naming the file and line of the first row that cannot be read (:meth:`verify` lists them all)."""
        records = _first_problem_raised(*self._cohen())
        return [r for r in records if r.shippable or not shippable_only]

    def _cohen(self) -> tuple[list[CohenRecord], list[InputError]]:
        """The Cohen records and the problems of the rows that cannot be read."""
        base = self.root / "cohen"
        scores, bad = _parse(base / "brixia_scores.csv", lambda row: (row["filename"], _brixia(row)))
        severities, more = _parse(base / "severity_scores.csv", lambda row: (row["filename"], {
            k: float(v) for k, v in row.items() if k != "filename" and v}))
        brixia, severity = dict(scores), dict(severities)

        def record(row: dict[str, str]) -> CohenRecord:
            stem = Path(row["image"]).stem
            ignore = base / "masks" / f"{stem}_ignore.png"
            return CohenRecord(
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

        out, rows = _parse(base / "metadata.csv", record)
        return out, [*bad, *more, *rows]

    def describe(self) -> list[str]:
        """What the pack holds, as lines: images, boxes, labels, masks, notes, scores, licences, reports. The counts
        are of the tables' rows; the files they name are checked to exist (``verify`` checks their content)."""
        nih, cohen = self.nih(), self.cohen()
        labels = Counter(lab for r in nih for lab in r.labels)
        licences = Counter(r.license for r in cohen)
        named = [r.image_path for r in nih] + [p for r in cohen for p in (r.image_path, r.right_mask_path,
                                                                          r.left_mask_path)]
        missing = [p.relative_to(self.root).as_posix() for p in named if not p.is_file()]
        lines = [f"pack: {self.root}",
                 "counts of the tables' rows (nih/labels.csv, nih/boxes_512.csv, cohen/*.csv); --verify checks every "
                 "file against MANIFEST.sha256",
                 f"nih: {len(nih)} images, {sum(len(r.boxes) for r in nih)} boxes",
                 "  labels: " + ", ".join(f"{k} {v}" for k, v in labels.most_common()),
                 f"cohen: {len(cohen)} images with right/left lung masks, "
                 f"{sum(r.ignore_mask_path is not None for r in cohen)} ignore masks, "
                 f"{sum(bool(r.notes) for r in cohen)} with notes, {sum(r.brixia is not None for r in cohen)} Brixia, "
                 f"{sum(bool(r.severity) for r in cohen)} severity scores",
                 "  licences: " + ", ".join(f"{k} {v}" for k, v in licences.most_common()),
                 f"  shippable (may train shipped weights): {sum(r.shippable for r in cohen)}",
                 f"iu_reports: {len(self.iu_report_paths())} Open-i XML reports"]
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            lines.append(f"missing: {len(missing)} image or mask files the tables name: {', '.join(missing[:5])}{more}")
        return lines

    def iu_report_paths(self) -> list[Path]:
        """Paths of the Open-i XML reports, sorted by numeric id."""
        paths = list((self.root / "iu_reports").glob("*.xml"))
        return sorted(paths, key=lambda p: (int(p.stem) if p.stem.isdigit() else 10**9, p.stem))

    def verify(self) -> list[str]:
        """Every problem of the pack, each as ``FILE: reason``; empty when it is whole. ``MANIFEST.sha256``: a file
        it lists that is missing or whose checksum differs, a line that is not ``SHA256  NAME``, a file of the pack
        it does not list; the tables: a row that cannot be read (``FILE: line N: reason``), an image or mask a row
        names that is missing."""
        problems: list[tuple[str, str]] = []
        manifest = self.root / "MANIFEST.sha256"
        listed: set[str] = {manifest.name}
        try:
            lines = manifest.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append((manifest.name, f"cannot be read ({getattr(exc, 'strerror', None) or exc})"))
            lines = []
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            parts = line.split(maxsplit=1)
            if len(parts) != 2 or len(parts[0]) != 64:
                problems.append((f"{manifest.name}:{n}", "not a line 'SHA256  NAME'"))
                continue
            digest, name = parts[0], parts[1].strip().lstrip("*")
            listed.add(name)
            path = self.root / name
            if not path.is_file():
                problems.append((name, "missing (listed in MANIFEST.sha256)"))
            elif sha256_file(path) != digest:
                problems.append((name, "checksum differs from MANIFEST.sha256"))
        if lines:
            for path in sorted(p for p in self.root.rglob("*") if p.is_file()):
                name = path.relative_to(self.root).as_posix()
                if name not in listed:
                    problems.append((name, "not in MANIFEST.sha256 (a file added to the pack)"))
        nih, bad = self._nih()
        cohen, more = self._cohen()
        problems += [(Path(exc.path or "").relative_to(self.root).as_posix(), exc.reason) for exc in (*bad, *more)]
        named = {name for name, _ in problems}
        for path in [r.image_path for r in nih] + [p for r in cohen for p in (r.image_path, r.right_mask_path,
                                                                              r.left_mask_path)]:
            name = path.relative_to(self.root).as_posix()
            if not path.is_file() and name not in named:
                problems.append((name, "missing (named by a table row)"))
        return [f"{name}: {reason}" for name, reason in problems]


def _parse(path: Path, build: Callable[[dict[str, str]], T]) -> tuple[list[T], list[InputError]]:
    """``build`` of each row of the pack table ``path``, and an :class:`InputError` naming the file and line of each
    row it cannot read (a value missing or malformed); a missing table is an error."""
    out: list[T] = []
    bad: list[InputError] = []
    for line, row in _rows(path):
        short = [k for k, v in row.items() if v is None]
        if None in row or short:
            why = "more values than the header" if None in row else f"no value for {', '.join(map(str, short))}"
            bad.append(InputError(f"line {line}: {why}", path))
            continue
        try:
            out.append(build(row))
        except KeyError as exc:
            bad.append(InputError(f"line {line}: no column {exc}", path))
        except (ValueError, TypeError, AttributeError) as exc:
            bad.append(InputError(f"line {line}: {exc}", path))
    return out, bad


def _first_problem_raised(records: list[T], problems: list[InputError]) -> list[T]:
    """``records``, or the first of ``problems`` raised (with how many more there are)."""
    if problems:
        rest = len(problems) - 1
        more = f" (and {rest} more problem{'s' if rest > 1 else ''})" if rest else ""
        raise problems[0].with_reason(f"{problems[0].reason}{more}; cxrground pack info --verify lists every problem")
    return records


def _rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, row) of each row of a pack table; an :class:`InputError` when it is missing or not UTF-8."""
    if not path.is_file():
        raise InputError("pack file missing", path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"pack table cannot be read ({exc})", path) from exc
    reader = csv.DictReader(io.StringIO(text, newline=""))
    start = 2
    for row in reader:
        yield start, row
        start = reader.line_num + 1


def _brixia(row: dict[str, str]) -> BrixiaScore:
    return BrixiaScore(
        senior={z: int(row[f"S-{z}"]) for z in BRIXIA_ZONES},
        junior={z: int(row[f"J-{z}"]) for z in BRIXIA_ZONES},
    )
