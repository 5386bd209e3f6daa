"""Turning a user's inputs into per-study work units (:class:`StudyTask`) with a split each.

Inputs: a folder of images in the MIMIC-CXR-JPG layout with reports in the MIMIC-CXR layout, or
a flat folder with a CSV/JSONL index (``cxrground.datasets.folder``), or reports given as a
JSONL/CSV table (``study_id`` and ``report`` columns). One image per study (ILS §6 proposed
default): prefer PA over AP, then the lexicographically first ``dicom_id``; an image of unknown view comes after
the frontal ones and a lateral (or any other non-frontal view) last. Views come from the index, a view table
(MIMIC-CXR-JPG's ``mimic-cxr-2.0.0-metadata.csv.gz``, :mod:`cxrground.datasets.views`) or, for a study with
several DICOM images, their headers.

Splits: an explicit CSV (``study_id,split``, plain or gzipped; MIMIC's ``mimic-cxr-2.0.0-split.csv.gz`` works, its
``split`` values ``validate`` map to ``val``), MIMIC-CXR-JPG's official split table when it lies beside ``files/``,
or else a deterministic hash of the subject id so that all studies of one subject land in one split.
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cxrground.datasets.folder import (
    films_not_in_index,
    find_release_file,
    key_clash,
    scan_folder,
    scan_store,
    study_key,
)
from cxrground.datasets.views import view_rank, views_by_study
from cxrground.errors import ConfigError, Failure, InputError
from cxrground.io.files import read_csv_text, sha256_bytes, sha256_file, sha256_json
from cxrground.io.store import Store, is_url, local_copy
from cxrground.reports import read_report_table

__all__ = ["DEFAULT_SPLIT_RATIOS", "NOT_IN_INDEX", "SPLIT_FILE_NAMES", "StudyTask", "assign_split", "build_tasks",
           "file_state", "find_split_file", "input_fingerprint", "read_exclusions", "read_split_file", "report_table",
           "split_record", "unindexed_reason"]

_log = logging.getLogger(__name__)

#: Train/val/test shares of the subject-hash split when no split file is given.
DEFAULT_SPLIT_RATIOS: Final[tuple[float, float, float]] = (0.8, 0.1, 0.1)
#: File names of MIMIC-CXR-JPG's official split table, as released.
SPLIT_FILE_NAMES: Final[tuple[str, ...]] = ("mimic-cxr-2.0.0-split.csv.gz", "mimic-cxr-2.0.0-split.csv")

@dataclass(frozen=True, slots=True)
class StudyTask:
    """Everything a worker needs to process one study (picklable; slots keep a MIMIC-size list small)."""

    study_key: str
    subject_id: str
    dicom_id: str
    image_path: str
    relative_image_path: str
    split: str
    report_path: str | None = None
    report_text: str | None = None
    view: str | None = None
    images_in_study: int = 1
    """How many images the study offered; with an unknown ``view`` and more than one, the choice was blind."""
    subject_given: bool = True
    """False when the inputs named no subject (an index without ``subject_id``): ``subject_id`` is then the study
    key, and the study is split on its own."""


#: Hex digits of an input fingerprint (64 bits: it tells one study's inputs from their earlier state).
FINGERPRINT_DIGITS: Final[int] = 16
#: The metadata fields of an object-storage file that change when the object is replaced, in the order looked for
#: (S3: ``ETag``, ``LastModified``; GCS: ``md5Hash``, ``generation``, ``updated``; others: ``mtime``).
_VERSION_FIELDS: Final[tuple[str, ...]] = ("ETag", "etag", "md5Hash", "generation", "LastModified", "last_modified",
                                           "mtime", "updated", "created")


def input_fingerprint(task: StudyTask) -> str:
    """What the work unit of ``task`` is made from, as a short hash (:data:`FINGERPRINT_DIGITS` hex digits).

    - **The report**: the sha256 of the bytes of the report file the task points at (``report_path``, which the
      worker reads when it is set), else of the report text the task holds (``report_text``, from a report table).
    - **The image**: the size and modification time (``st_mtime_ns``) of the chosen image file, not its bytes (a
      stat per study; on object storage the object's size and version field, one metadata request). A copy that
      keeps modification times (``mv``, ``cp -p``, ``rsync -t``) is the same image; a missing or unreadable file is
      a state of its own, so the study is redone once it can be read.
    - **The study's other fields** that the unit records: ``subject_id``, ``dicom_id``, ``relative_image_path`` (a
      different image chosen, e.g. after an image was added to the study), ``split``, ``view`` and
      ``images_in_study``. The split and view are also decided by the build's settings (split file or ratios, view
      table) in ``settings.json``, but an index or a rebuilt folder can change them study by study.

    Left out: the absolute ``image_path`` and ``report_path`` (a moved input folder is the same input; the report is
    compared by content), and the build's options, compared once for the whole build (``settings.json``).
    """
    return sha256_json({
        "report": _report_digest(task), "image": file_state(task.image_path), "subject_id": task.subject_id,
        "dicom_id": task.dicom_id, "relative_image_path": task.relative_image_path, "split": task.split,
        "view": task.view, "images_in_study": task.images_in_study,
    })[:FINGERPRINT_DIGITS]


def _report_digest(task: StudyTask) -> str:
    """sha256 of the report the worker reads (``missing``/``unreadable`` when it cannot be read)."""
    if not task.report_path:
        return sha256_bytes((task.report_text or "").encode("utf-8"))
    try:
        if is_url(task.report_path) and not task.report_path.startswith("file://"):
            base, _, name = task.report_path.rpartition("/")
            return sha256_bytes(Store(base).read_bytes(name))
        return sha256_file(task.report_path.removeprefix("file://"))
    except FileNotFoundError:
        return "missing"
    except (OSError, InputError) as exc:
        return f"unreadable ({type(exc).__name__})"


def file_state(location: str | Path) -> list[Any] | str:
    """``[size, mtime_ns]`` of a local file, ``[size, version]`` of an object (``missing``/``unreadable``)."""
    try:
        location = str(location)
        if is_url(location) and not location.startswith("file://"):
            base, _, name = location.rpartition("/")
            store = Store(base)
            with store._reading(name):  # a failed request: InputError
                info = store.fs.info(store.path(name))
            version = next((info[k] for k in _VERSION_FIELDS if info.get(k) is not None), None)
            return [int(info.get("size") or 0), str(version)]
        st = os.stat(location.removeprefix("file://"))
        return [st.st_size, st.st_mtime_ns]
    except FileNotFoundError:
        return "missing"
    except (OSError, InputError, ConfigError) as exc:
        return f"unreadable ({type(exc).__name__})"


def _is_table(reports: str | Path) -> bool:
    """Whether ``reports`` names a report table (a file) rather than a folder of report files."""
    if is_url(reports):
        return str(reports).rstrip("/").lower().endswith((".jsonl", ".ndjson", ".csv", ".tsv"))
    return Path(reports).is_file()


def report_table(reports: str | Path) -> tuple[dict[str, str], list[Failure]]:
    """A report table (JSONL/CSV with ``study_id`` and ``report``, local or on object storage) as study key
    (:func:`~cxrground.datasets.folder.study_key`) → report text, and its unreadable lines as failures; a row whose
    id becomes a key an earlier row's other id took (``125`` after ``s125``) is a failure naming both rows."""
    with local_copy(reports) as local:
        parsed, bad = read_report_table(local, "study_id", "report", progress=False)
    table: dict[str, str] = {}
    given: dict[str, tuple[str, str]] = {}
    for r in parsed:
        key = study_key(r.report_id)
        if key in given:
            bad.append(Failure(str(r.source), "reports", key_clash(r.report_id, key, *given[key]), "InputError",
                               report=r.report_id))
            continue
        given[key] = (r.report_id, str(r.source))
        table[key] = r.text or ""
    return table, bad


def read_split_file(path: str | Path) -> dict[str, str]:
    """``study key -> split`` from a CSV, plain or gzipped, with ``study_id`` and ``split`` columns."""
    path = Path(path)
    reader = csv.DictReader(io.StringIO(read_csv_text(path, "split file")))
    if not {"study_id", "split"} <= set(reader.fieldnames or []):
        raise InputError(f"split file needs study_id and split columns (it has "
                         f"{', '.join(reader.fieldnames or []) or 'no header'})", path)
    out: dict[str, str] = {}
    given: dict[str, str] = {}
    for row in reader:
        sid, value = str(row["study_id"] or "").strip(), str(row["split"] or "").strip()
        split = {"validate": "val", "validation": "val"}.get(value, value)
        if split not in ("train", "val", "test"):
            raise InputError(f"unknown split {value!r} for study {sid}", path)
        key = study_key(sid)
        if key in given and given[key] != sid:
            raise InputError(key_clash(sid, key, given[key], "the same file"), path)
        given[key] = sid
        out[key] = split
    return out


#: A MIMIC-CXR study folder inside an image path (``files/p15/p15111236/s57211880/<dicom_id>.jpg``).
_STUDY_IN_PATH = re.compile(r"(?:^|/)(s\d+)/[^/]+$")


def read_exclusions(path: str | Path) -> tuple[str, ...]:
    """Study ids to leave out, in file order without repeats: one id per line, or a CSV (plain or gzipped) with a
    ``study_id`` column or a ``path`` column of MIMIC-CXR image paths, as MS-CXR's
    ``MS_CXR_Local_Alignment_v1.*.csv`` has; a line or row that gives no id is an :class:`InputError` naming it."""
    path = Path(path)
    text = read_csv_text(path, "exclusion list")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ()
    ids: list[str] = []
    if "," not in lines[0]:
        for n, line in enumerate(lines, start=1):
            if "," in line or any(ch.isspace() for ch in line):
                raise InputError(f"exclusion list line {n} is not one study id ({line[:60]!r})", path)
            ids.append(line)
        return tuple(dict.fromkeys(ids))
    reader = csv.DictReader(io.StringIO(text))
    columns = reader.fieldnames or []
    if "study_id" not in columns and "path" not in columns:
        raise InputError(f"exclusion list: a CSV needs a study_id or path column (it has {', '.join(columns)})", path)
    for n, row in enumerate(reader, start=2):
        if "study_id" in columns:
            sid = (row.get("study_id") or "").strip()
        else:
            match = _STUDY_IN_PATH.search((row.get("path") or "").strip().replace("\\", "/"))
            sid = match.group(1) if match else ""
        if not sid:
            raise InputError(f"exclusion list row {n} names no study (study_id or a .../sNNNN/IMAGE path)", path)
        ids.append(sid)
    return tuple(dict.fromkeys(ids))


def find_split_file(images: str | Path) -> Path | None:
    """MIMIC-CXR-JPG's official split table in the image folder or its parent (beside ``files/``), or None."""
    return find_release_file(images, SPLIT_FILE_NAMES)


def split_record(split_file: str | Path | None, ratios: Sequence[float], without_subject: int = 0) -> dict[str, Any]:
    """What a build records of its split: the file (absolute path) with its checksum, or the subject-hash ratios
    and how many studies named no subject (``without_subject``: each hashed on its study key, recorded when > 0)."""
    if split_file is not None:
        path = str(split_file) if is_url(split_file) else str(Path(split_file).absolute())
        return {"source": "file", "path": path, "sha256": sha256_file(split_file)}
    record: dict[str, Any] = {"source": "subject hash", "ratios": [float(r) for r in ratios]}
    if without_subject:
        record["studies_without_subject"] = without_subject
    return record


#: The start of the failure reason of a film under the image folder that no row of the index names.
NOT_IN_INDEX: Final[str] = "film not in the index"


def unindexed_reason(index: str | Path) -> str:
    """The failure reason of a film under ``--images`` that no row of ``index`` names (it is not used)."""
    return (f"{NOT_IN_INDEX} (no row of {Path(index).absolute()} names it, so it is not used: add a row for it, or "
            "move it out of the image folder)")


def assign_split(subject_id: str, ratios: Sequence[float]) -> str:
    """Deterministic subject-level split from ``(train, val, test)`` ratios."""
    if len(ratios) != 3 or any(r < 0 for r in ratios) or sum(ratios) <= 0:
        raise ConfigError(f"split ratios must be three non-negative numbers, got {ratios}")
    u = int(hashlib.sha256(subject_id.encode()).hexdigest()[:12], 16) / 16**12 * sum(ratios)
    if u < ratios[0]:
        return "train"
    return "val" if u < ratios[0] + ratios[1] else "test"


def build_tasks(
    images: str | Path,
    reports: str | Path | None = None,
    index: str | Path | None = None,
    split_file: str | Path | None = None,
    split_ratios: Sequence[float] = DEFAULT_SPLIT_RATIOS,
    exclude: Sequence[str] = (),
    limit: int | None = None,
    views: Mapping[str, str] | None = None,
) -> tuple[list[StudyTask], list[Failure]]:
    """Work units sorted by study key, and the inputs that could not become one (``views``: ``dicom_id -> view``,
    e.g. :func:`~cxrground.datasets.views.read_view_table`, for images whose view the index does not give)."""
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be at least 1, got {limit}")
    table: dict[str, str] = {}
    failures: list[Failure] = []
    reports_dir = None
    remote = is_url(images) and not str(images).startswith("file://")
    if reports is not None and _is_table(reports):
        table, bad = report_table(reports)
        failures.extend(bad)
    elif reports is not None:
        reports_dir = reports
    if remote:
        if index is not None:
            raise ConfigError("--index works with a local image folder only; use the MIMIC-CXR layout on object "
                              "storage")
        studies, bad = scan_store(str(images), None if reports_dir is None else str(reports_dir),
                                  require_reports=not table)
    else:
        studies, bad = scan_folder(str(images).removeprefix("file://"), reports_dir, index,
                                   require_reports=not table)
        if index is not None and (unlisted := films_not_in_index(index, str(images).removeprefix("file://"))):
            _log.warning("%d films under %s are not in the index %s and are not used (each is recorded as a failure, "
                         "%r), e.g. %s", len(unlisted), images, index, NOT_IN_INDEX, unlisted[0])
            bad = [*bad, *(Failure(str(p), "scan", unindexed_reason(index), "InputError") for p in unlisted)]
    failures.extend(bad)
    splits = read_split_file(split_file) if split_file else {}
    excluded = {study_key(s) for s in exclude}

    by_study = views_by_study(studies, views or {})
    if excluded and not excluded & by_study.keys():
        _log.warning("none of the %d excluded study ids is among the %d studies found under %s", len(excluded),
                     len(by_study), images)
    tasks: list[StudyTask] = []
    for key in sorted(by_study):
        if key in excluded:
            continue
        offered = by_study[key]
        chosen = min(offered, key=lambda s: (view_rank(s.view), s.dicom_id or ""))
        text = table.get(key) if table else chosen.report_text
        if table and text is None and chosen.report_path is None:
            failures.append(Failure(str(chosen.image_path), "scan", f"no report for {chosen.shown_id()} in {reports}",
                                    "InputError"))
            continue
        subject = chosen.subject_id or key
        if split_file and key not in splits:
            failures.append(Failure(str(chosen.image_path), "scan", f"{key} is not in the split file", "InputError"))
            continue
        tasks.append(StudyTask(
            study_key=key,
            subject_id=subject,
            dicom_id=chosen.dicom_id or Path(chosen.image_path).stem,
            image_path=str(chosen.image_path) if remote else os.path.abspath(chosen.image_path),  # a link as given
            relative_image_path=chosen.relative_image_path or Path(chosen.image_path).name,
            split=splits.get(key) or assign_split(subject, split_ratios),
            report_path=str(chosen.report_path) if chosen.report_path and not table else None,
            report_text=text,
            view=chosen.view,
            images_in_study=len(offered),
            subject_given=chosen.subject_id is not None,
        ))
    if limit is not None:
        tasks = tasks[:limit]
    unnamed = studies_without_subject(tasks)
    if unnamed and not split_file:
        _log.warning("%d of %d studies have no subject id (no subject_id in the index): each is split on its own, so "
                     "one patient's studies may fall in different splits; give subject_id to keep them together",
                     unnamed, len(tasks))
    return tasks, failures


def studies_without_subject(tasks: Iterable[StudyTask]) -> int:
    """How many of ``tasks`` name no subject (their split is drawn per study)."""
    return sum(1 for t in tasks if not t.subject_given)


def in_key_order(tasks: Iterable[StudyTask]) -> Iterable[StudyTask]:
    """``tasks`` in study-key order: a list is sorted (references only); any other iterable must already be."""
    if isinstance(tasks, Sequence):
        return sorted(tasks, key=lambda t: t.study_key)
    return _checked_order(tasks)


def _checked_order(tasks: Iterable[StudyTask]) -> Iterator[StudyTask]:
    last = None
    for t in tasks:
        if last is not None and t.study_key <= last:
            raise ConfigError(f"build tasks must come in study-key order: {t.study_key} after {last}")
        last = t.study_key
        yield t
