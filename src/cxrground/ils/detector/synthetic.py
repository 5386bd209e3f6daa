"""The synthetic cohort's drawn lesions as a VinDr-CXR annotations file (TEST DATA for the detector commands).

Each drawn lesion (present, with a mask; reported or not, as a radiologist reading the film would see it) gives
one box per simulated reader: the bounding box of its mask in pixel edges, each edge moved by a normal error of
``jitter`` × the box side, and left out by a reader with probability ``miss`` (never by every reader). An
enlarged heart gives a ``Cardiomegaly`` box around the heart mask. Films without any box get one ``No finding``
row per reader, as in VinDr-CXR. Lesion → VinDr class (:data:`SYNTHETIC_CLASS`) follows what a VinDr reader
would call the drawn pattern and is one of the classes that may ground that lesion
(:data:`~cxrground.ils.spatial.boxes.BOX_CLASS_LESIONS`). ``patients.csv`` maps each image to its subject. A study
whose film is missing (or empty) is left out of both files and recorded in ``failures.jsonl``.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np

from cxrground.datasets.folder import image_file_problem
from cxrground.datasets.synthetic import load_truth
from cxrground.errors import ConfigError, Failure, InputError
from cxrground.io.files import atomic_write_text
from cxrground.io.masks import decode_rle

__all__ = ["ANNOTATION_COLUMNS", "FAILURES_NAME", "SYNTHETIC_CLASS", "SyntheticExport", "export_synthetic_vindr"]

#: The studies left out of the export, one :class:`~cxrground.errors.Failure` per line.
FAILURES_NAME: Final = "failures.jsonl"

#: Column order of the written file (VinDr-CXR's columns; readers find them by name).
ANNOTATION_COLUMNS: Final = ("image_id", "class_name", "x_min", "y_min", "x_max", "y_max", "rad_id")

#: VinDr-CXR class of each drawn ILS lesion.
SYNTHETIC_CLASS: Final[dict[str, str]] = {
    "effusion": "Pleural effusion",
    "atelectasis": "Atelectasis",
    "consolidation": "Consolidation",
    "pneumonia": "Consolidation",
    "opacity": "Lung Opacity",
    "edema": "Infiltration",
    "cardiomegaly": "Cardiomegaly",
}


def _edges(mask: np.ndarray) -> tuple[int, int, int, int]:
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


@dataclass(frozen=True)
class SyntheticExport:
    """What :func:`export_synthetic_vindr` wrote: films, rows and boxes of ``train.csv``, and the studies left out
    (their film missing or unusable), also in ``failures.jsonl``."""

    images: int
    rows: int
    boxes: int
    failures: list[Failure] = field(default_factory=list)

    def __getitem__(self, key: str) -> int:
        """The counts by name (``images``, ``rows``, ``boxes``, ``failures``), as the earlier dict gave them."""
        if key not in ("images", "rows", "boxes", "failures"):
            raise KeyError(key)
        return len(self.failures) if key == "failures" else int(getattr(self, key))

    def summary_lines(self, out: Path) -> list[str]:
        """What was written, then one line per failure."""
        lines = [f"{out / 'train.csv'}: {self.boxes} boxes on {self.images} films ({self.rows} rows); "
                 f"{out / 'patients.csv'}; {len(self.failures)} failed ({out / FAILURES_NAME})"]
        return lines + [f"  failed: {f.path}: {f.reason}" for f in self.failures]


#: The files :func:`export_synthetic_vindr` writes.
_EXPORT_FILES = ("train.csv", "patients.csv", FAILURES_NAME)


def _check_out(out: Path) -> None:
    """A :class:`ConfigError` when ``out`` holds files the export does not write, or a ``train.csv`` without the
    export's ``patients.csv`` (a real VinDr-CXR folder): the export would replace its annotations."""
    if not out.is_dir():
        return
    names = {p.name for p in out.iterdir()}
    other = sorted(names.difference(_EXPORT_FILES))
    if other or ("train.csv" in names and "patients.csv" not in names):
        shown = ", ".join(other[:5] or ["train.csv"]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        raise ConfigError(f"--out {out} holds {shown}, not an export of a synthetic cohort; the export would write "
                          "train.csv there: use a new or empty folder")


def export_synthetic_vindr(cohort: str | Path, out: str | Path, readers: int = 3, jitter: float = 0.03,
                           miss: float = 0.1, seed: int = 0) -> SyntheticExport:
    """Write ``out/train.csv`` (VinDr-CXR format), ``out/patients.csv`` and ``out/failures.jsonl``; a study whose
    film is missing or unusable (:func:`~cxrground.datasets.folder.image_file_problem`) is a failure, not
    exported. Returns the counts and the failures."""
    if readers < 1 or not 0 <= miss < 1 or jitter < 0:
        raise ValueError(f"need readers >= 1, 0 <= miss < 1, jitter >= 0; got {readers}, {miss}, {jitter}")
    _check_out(Path(out))
    rng = np.random.default_rng(seed)
    rad_ids = [f"R{i + 1}" for i in range(readers)]
    rows: list[list[object]] = []
    patients: list[tuple[str, str]] = []
    failures: list[Failure] = []
    boxes_written = 0
    truths = load_truth(cohort)
    if not truths:
        raise InputError("no truth records in truth/: an empty synthetic cohort", cohort)
    for t in truths:
        shape = (t.height, t.width)
        found = [(SYNTHETIC_CLASS[f.lesion], decode_rle(f.mask.rle, shape)) for f in t.present_findings
                 if f.mask is not None and f.lesion in SYNTHETIC_CLASS]
        if t.heart_status == "enlarged" and "heart" in t.anatomy:
            found.append((SYNTHETIC_CLASS["cardiomegaly"], decode_rle(t.anatomy["heart"].rle, shape)))
        image_rows = []
        for name, mask in found:
            if not mask.any():
                continue
            x0, y0, x1, y1 = _edges(mask)
            seen = rng.random(readers) >= miss
            seen[int(rng.integers(readers))] = True
            for rad, keep in zip(rad_ids, seen, strict=True):
                err = rng.normal(0.0, jitter, 4) * np.array([x1 - x0, y1 - y0, x1 - x0, y1 - y0])
                if not keep:
                    continue
                bx0, by0 = max(0.0, x0 + err[0]), max(0.0, y0 + err[1])
                bx1, by1 = min(float(t.width), x1 + err[2]), min(float(t.height), y1 + err[3])
                if bx1 - bx0 >= 1 and by1 - by0 >= 1:
                    image_rows.append([t.dicom_id, name, f"{bx0:.1f}", f"{by0:.1f}", f"{bx1:.1f}", f"{by1:.1f}", rad])
        film = Path(cohort) / t.image_path
        problem = image_file_problem(film)  # after the draws: the other films' boxes do not depend on this one
        if problem is not None:
            failures.append(Failure(str(film), "detector-export", f"film of study {t.study_id}: {problem}",
                                    "InputError"))
            continue
        patients.append((t.dicom_id, t.subject_id))
        rows += image_rows or [[t.dicom_id, "No finding", "", "", "", "", rad] for rad in rad_ids]
        boxes_written += len(image_rows)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(ANNOTATION_COLUMNS)
    writer.writerows(rows)
    atomic_write_text(folder / "train.csv", buf.getvalue())
    pbuf = io.StringIO()
    pw = csv.writer(pbuf, lineterminator="\n")
    pw.writerow(("image_id", "patient_id"))
    pw.writerows(patients)
    atomic_write_text(folder / "patients.csv", pbuf.getvalue())
    atomic_write_text(folder / FAILURES_NAME, "".join(json.dumps(f.to_dict()) + "\n" for f in failures))
    return SyntheticExport(len(patients), len(rows), boxes_written, failures)
