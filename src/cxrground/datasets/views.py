"""Which view each image shows (PA, AP, LATERAL, ...), from a view table such as MIMIC-CXR-JPG's metadata.

MIMIC-CXR-JPG keeps the view of every image in ``mimic-cxr-2.0.0-metadata.csv.gz`` (columns ``dicom_id`` and
``ViewPosition``), not in the JPEG files, and about half of its studies hold a lateral film beside the frontal one.
Without that table the view of a JPEG is unknown, and the lexicographically first ``dicom_id`` of a study (the ILS
tie-break) can be the lateral film. :func:`find_view_table` looks for the table where the
release puts it (beside ``files/``); :func:`read_view_table` reads it, or any CSV with ``dicom_id`` and ``view``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from cxrground.datasets.folder import StudyInput, find_release_file
from cxrground.errors import InputError
from cxrground.io.files import read_csv_text, sha256_file
from cxrground.io.image import is_dicom
from cxrground.vocab.views import FRONTAL_VIEWS, POSITION_WORDS, is_frontal

__all__ = ["FRONTAL_VIEWS", "POSITION_WORDS", "VIEW_TABLE_NAMES", "find_view_table", "is_frontal", "load_view_table",
           "read_view_table", "view_rank", "view_table_record", "views_by_study"]

#: File names of the MIMIC-CXR-JPG view table, as released.
VIEW_TABLE_NAMES: Final[tuple[str, ...]] = ("mimic-cxr-2.0.0-metadata.csv.gz", "mimic-cxr-2.0.0-metadata.csv")
_VIEW_COLUMNS: Final[tuple[str, ...]] = ("ViewPosition", "view", "view_position")
#: MIMIC-CXR-JPG's coded view (``ViewCodeSequence_CodeMeaning``), read where ``ViewPosition`` is empty.
_CODED_VIEWS: Final[dict[str, str]] = {"postero-anterior": "PA", "antero-posterior": "AP"}


def _coded_view(meaning: str) -> str | None:
    """A view from a coded view meaning (``postero-anterior`` → PA, ``antero-posterior`` → AP, any ``lateral`` →
    LATERAL), or None."""
    text = meaning.strip().lower()
    if "lateral" in text:
        return "LATERAL"
    return _CODED_VIEWS.get(text)


def view_rank(view: str | None, accepted: tuple[str, ...] = FRONTAL_VIEWS) -> int:
    """Preference of an image by its view when a study has several: frontal views in the order of ``accepted``,
    then an unknown view, then any other view (lateral, decubitus, oblique)."""
    if not view:
        return len(accepted)
    if is_frontal(view, accepted):
        return accepted.index(view.upper().replace("_", " ").split()[0])
    return len(accepted) + 1


def find_view_table(images: str | Path) -> Path | None:
    """The MIMIC-CXR-JPG view table in the image folder or its parent (where the release puts it beside
    ``files/``), or None."""
    return find_release_file(images, VIEW_TABLE_NAMES)


def read_view_table(path: str | Path) -> dict[str, str]:
    """``dicom_id -> view`` (upper case) from a CSV, plain or gzipped, with a ``dicom_id`` column and a
    ``ViewPosition`` (MIMIC-CXR-JPG), ``view`` or ``view_position`` column; where ``ViewPosition`` is empty, its
    ``ViewCodeSequence_CodeMeaning`` (postero-anterior, antero-posterior, lateral) gives the view; rows with no view
    are left out (their view stays unknown)."""
    path = Path(path)
    reader = csv.DictReader(io.StringIO(read_csv_text(path, "view table")))
    columns = reader.fieldnames or []
    column = next((c for c in _VIEW_COLUMNS if c in columns), None)
    if "dicom_id" not in columns or column is None:
        raise InputError(f"view table needs a dicom_id column and one of {', '.join(_VIEW_COLUMNS)} (it has "
                         f"{', '.join(columns) or 'no header'})", path)
    views: dict[str, str] = {}
    for row in reader:
        dicom, view = (row.get("dicom_id") or "").strip(), (row.get(column) or "").strip().upper()
        view = view or _coded_view(row.get("ViewCodeSequence_CodeMeaning") or "") or ""
        if dicom and view:
            views[dicom] = view
    return views


def load_view_table(given: str | Path | None, images: str | Path) -> tuple[Path | None, dict[str, str]]:
    """The view table (``given``, else :func:`find_view_table` for the local image folder ``images``) and its
    ``dicom_id -> view``; (None, {}) when there is none."""
    table = Path(given) if given is not None else find_view_table(images)
    return table, (read_view_table(table) if table is not None else {})


def view_table_record(path: str | Path, views: Mapping[str, str]) -> dict[str, Any]:
    """What a build records of the view table it used: its absolute path (the same however it was named), checksum
    and how many images it gives a view."""
    return {"path": str(Path(path).absolute()), "sha256": sha256_file(path), "images": len(views)}


def views_by_study(images: Iterable[StudyInput], views: Mapping[str, str]) -> dict[str, list[StudyInput]]:
    """``study_id -> its images`` (in the given order), each image's unknown view filled by :func:`_with_views`."""
    groups: dict[str, list[StudyInput]] = {}
    for s in images:
        groups.setdefault(s.study_id, []).append(s)
    return {key: _with_views(group, views) for key, group in groups.items()}


def _with_views(images: Sequence[StudyInput], views: Mapping[str, str]) -> list[StudyInput]:
    """One study's images with each unknown view filled from ``views`` (by ``dicom_id``) and, when the study has
    several images, from the DICOM header of those that are DICOM files."""
    out = []
    for s in images:
        view = s.view or views.get(s.dicom_id or "")
        if view is None and len(images) > 1 and is_dicom(s.image_path):
            from cxrground.io.dicom import dicom_view

            view = dicom_view(s.image_path)
        out.append(replace(s, view=view) if view != s.view else s)
    return out
