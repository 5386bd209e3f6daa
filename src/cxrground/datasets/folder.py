"""A user's own images plus reports, as :class:`StudyInput` records.

Recognised layouts:

- **MIMIC-CXR-JPG**: ``files/pXX/pXXXXXXXX/sXXXXXXXX/<dicom_id>.jpg`` with reports in the MIMIC-CXR
  layout ``pXX/pXXXXXXXX/sXXXXXXXX.txt``: under ``--reports`` when it is given (a study whose report is not
  there is a failure naming the study and the folder; a report beside the study folder is then not used), else
  beside the study folders;
- **flat folder + index**: a CSV or JSONL index with an ``image`` column (path relative to the
  image folder) and ``study_id``, plus either ``report_path`` or ``report`` (the text); optional
  ``subject_id``, ``dicom_id``, ``view``.

Images are not opened here; reading happens in the stages that need the pixels. Only what a file-system
check shows is refused here, each with a :class:`~cxrground.errors.Failure` naming the file: a 0-byte image
(so a study's next image is chosen instead), a symbolic link loop and a link whose target does not exist, and in
the MIMIC-CXR layout every skipped item: a study folder without an image, a folder named like an image, and an
image in a format the build does not read (GIF, BMP, TIFF, WebP). The films are found as every folder reader finds
them (:func:`~cxrground.io.image.film_kind`): by their PNG, JPEG or DICOM suffix, and DICOM files without an image
suffix (UID-named exports) by their ``DICM`` marker. :func:`check_studies` (``scan --check``) reads
every image and report as ``ils build`` does and lists those that fail.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import io
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cxrground.errors import Failure, InputError
from cxrground.io.files import decode_text, link_problem, read_csv_text, walk_files
from cxrground.io.image import (
    DICOM_HEAD,
    IMAGE_SUFFIXES,
    NOT_FILM_SUFFIXES,
    UNSUPPORTED_IMAGE_SUFFIXES,
    film_kind,
    is_dicom_head,
)

if TYPE_CHECKING:
    from cxrground.io.store import Store

__all__ = ["MIMIC_IMAGE_RE", "UNSUPPORTED_IMAGE_SUFFIXES", "StudyInput", "check_studies", "films_not_in_index",
           "find_release_file", "image_file_problem", "key_clash", "read_index", "scan_folder", "scan_lines",
           "scan_store", "study_key"]

_STUDY_DIR_RE = re.compile(r"(?:^|/)p\d{2}/p\d+/s\d+$")

MIMIC_IMAGE_RE = re.compile(r"(?:^|/)(p\d{2})/(p\d+)/(s\d+)/([^/]+)\.(?:jpe?g|png|dcm|dicom)$", re.IGNORECASE)
#: A film's place in the MIMIC-CXR layout, whatever its name (a DICOM file may have no image suffix).
_MIMIC_FILM_RE = re.compile(r"(?:^|/)(p\d{2})/(p\d+)/(s\d+)/([^/]+)$")


def study_key(study_id: str) -> str:
    """The key a study goes by in the dataset (``s{study_id}`` of ILS §12, the names of its mask folder and files): a
    user's study id with an ``s`` in front, unless it starts with one already (MIMIC-CXR's ids are ``s`` + digits,
    written with or without it); ``125`` and ``s125`` therefore name one study (the readers refuse a second id that
    becomes a key taken by another id)."""
    study_id = str(study_id).strip()
    return study_id if study_id.startswith("s") else f"s{study_id}"


def key_clash(given: str, key: str, other: str, where: str) -> str:
    """The failure reason of a study id ``given`` whose key ``key`` another id ``other`` (at ``where``) took."""
    return (f"study id {given!r} and study id {other!r} in {where} both name study {key} (an id without a leading "
            "'s' gets one): give the two studies distinct ids")


@dataclass(frozen=True)
class StudyInput:
    """One image of a study with where its report is (a file, inline text, or none found)."""

    study_id: str
    image_path: Path
    subject_id: str | None = None
    dicom_id: str | None = None
    view: str | None = None
    report_path: Path | None = None
    report_text: str | None = None
    relative_image_path: str | None = None
    """Path relative to the image root (MIMIC ``files/``-relative for that layout)."""
    given_study_id: str | None = None
    """The study id as the index gave it (``study_id`` is its :func:`study_key`); None in the MIMIC-CXR layout, where
    the study folder's name is the id."""

    def shown_id(self) -> str:
        """The study for a message: its key, with the id the index gave when that differs (``125 (study s125)``)."""
        given = self.given_study_id
        return self.study_id if given in (None, self.study_id) else f"{given} (study {self.study_id})"


def scan_folder(
    images: str | Path,
    reports: str | Path | None = None,
    index: str | Path | None = None,
    require_reports: bool = True,
) -> tuple[list[StudyInput], list[Failure]]:
    """Find the studies under ``images``; images without a locatable report become failures
    (unless ``require_reports`` is False, for reports that come from elsewhere, e.g. a table)."""
    root = Path(images).absolute()  # every path found, and so every failure, named absolute (as the readers do)
    if not root.is_dir():
        raise InputError("image folder not found", images)
    if index is not None:
        return read_index(index, root, require_reports=require_reports)
    studies: list[StudyInput] = []
    failures: list[Failure] = []
    report_root = Path(reports).absolute() if reports is not None else None
    images_found: set[Path] = set()
    tree = walk_files(root, folders=True)  # links to folders followed (MIMIC's pXX folders on other disks)
    for path in tree:
        kind = film_kind(path)
        if kind is None:
            continue
        images_found.add(path.parent)
        if path.is_dir():
            failures.append(Failure(str(path), "scan", "a folder named like an image (not a file)", "InputError"))
            continue
        if kind == "unsupported":
            failures.append(Failure(str(path), "scan", f"unsupported image format {path.suffix.lower()} (use JPEG, "
                                    "PNG or DICOM)", "InputError"))
            continue
        rel = path.relative_to(root).as_posix()
        match = _MIMIC_FILM_RE.search(rel)
        if match is None:
            failures.append(Failure(str(path), "scan", "not in the MIMIC-CXR layout and no index given", "InputError"))
            continue
        problem = image_file_problem(path)
        if problem is not None:
            failures.append(Failure(str(path), "scan", problem, "InputError"))
            continue
        group, subject, study, name = match.groups()
        dicom = Path(name).stem if path.suffix.lower() in IMAGE_SUFFIXES else name  # a DICOM named by its UID
        report = _find_mimic_report(path, group, subject, study, report_root) if require_reports else None
        if report is None and require_reports:
            failures.append(Failure(str(path), "scan", _no_report(group, subject, study, report_root),
                                    "InputError"))
            continue
        mimic_rel = f"{group}/{subject}/{study}/{path.name}"
        studies.append(StudyInput(study, path, subject, dicom, None, report, None, mimic_rel))
    for folder in _study_folders(root, tree):
        if folder not in images_found:
            failures.append(Failure(str(folder), "scan", _imageless_folder(folder, images_found), "InputError"))
    if not studies and not failures:  # as the report and film commands treat a folder with nothing to read
        raise InputError("no films (PNG, JPEG or DICOM) in this folder or its subfolders", images)
    studies, clashes = _one_subject_per_study(studies)
    return studies, [*failures, *clashes]


def _imageless_folder(folder: Path, images_found: set[Path]) -> str:
    """Why the study folder ``folder`` gave no image: a folder link that leads back to a folder above it (a loop,
    not entered), a link to a folder whose images were found under its own path, or a folder holding none."""
    if folder.is_symlink():
        real, above = os.path.realpath(folder), os.path.realpath(folder.parent)
        if above == real or above.startswith(real.rstrip(os.sep) + os.sep):
            return f"symbolic link loop: the folder link leads back to {real}, a folder above it"
        if real in {os.path.realpath(f) for f in images_found}:
            return f"a link to the folder {real}, whose images are read once, under that path"
    return "study folder holds no image (JPEG, PNG or DICOM)"


def _one_subject_per_study(studies: list[StudyInput]) -> tuple[list[StudyInput], list[Failure]]:
    """``studies`` less the images of a study id met again under another subject (MIMIC-CXR layout: two patients'
    folders ``p10/p10000001/s5000`` and ``p11/p11000009/s5000``, each with its own report), with one failure per
    such study folder naming the folder kept: the first subject's, in path order. A study id names one study."""
    first: dict[str, StudyInput] = {}
    kept: list[StudyInput] = []
    failures: list[Failure] = []
    named: set[tuple[str, str | None]] = set()
    for s in studies:
        other = first.setdefault(s.study_id, s)
        if other.subject_id == s.subject_id:
            kept.append(s)
            continue
        if (s.study_id, s.subject_id) not in named:
            named.add((s.study_id, s.subject_id))
            failures.append(Failure(str(Path(s.image_path).parent), "scan", f"study {s.study_id} is also under subject "
                                    f"{other.subject_id} ({Path(other.image_path).parent}): a study id belongs to "
                                    "one patient, and this folder is not used", "InputError"))
    return kept, failures


def scan_store(images: str, reports: str | None = None, require_reports: bool = True
               ) -> tuple[list[StudyInput], list[Failure]]:
    """:func:`scan_folder` for an image folder on object storage (an fsspec URL, MIMIC-CXR layout), from one
    listing of ``images`` (and one of ``reports``); image and report paths become URLs. Films are found as
    :func:`~cxrground.io.image.film_kind` finds them in a folder: DICOM files without an image suffix by their
    ``DICM`` marker (:func:`_marked_dicoms`: the first 132 bytes of such objects, read by ranged requests)."""
    from cxrground.io.store import Store

    store = Store(images)
    files = store.find()
    if not files:
        raise InputError("image folder not found or empty", images)
    report_store = Store(reports) if reports is not None else None
    report_files = report_store.find() if report_store is not None else {}
    studies: list[StudyInput] = []
    failures: list[Failure] = []
    dicoms, unread = _marked_dicoms(store, files)
    failures += unread
    for rel, size in files.items():
        suffix = Path(rel).suffix.lower()
        url = store.url(rel)
        if suffix in UNSUPPORTED_IMAGE_SUFFIXES:
            failures.append(Failure(url, "scan", f"unsupported image format {suffix} (use JPEG, PNG or DICOM)",
                                    "InputError"))
            continue
        if suffix not in IMAGE_SUFFIXES and rel not in dicoms:
            continue
        match = _MIMIC_FILM_RE.search(rel)
        if match is None:
            failures.append(Failure(url, "scan", "not in the MIMIC-CXR layout and no index given", "InputError"))
            continue
        if size == 0:
            failures.append(Failure(url, "scan", "image file is empty (0 bytes)", "InputError"))
            continue
        group, subject, study, name = match.groups()
        dicom = name if rel in dicoms else Path(name).stem  # a DICOM named by its UID keeps its whole name
        report = None
        if require_reports:
            beside = rel.rsplit("/", 2)[0] + f"/{study}.txt"
            named = [f"{base}{group}/{subject}/{study}.txt" for base in ("", "files/")]
            if report_store is not None:  # the named folder only, never a report beside the image
                report = next((report_store.url(c) for c in named if c in report_files), None)
            else:
                report = store.url(beside) if beside in files else None
            if report is None:
                failures.append(Failure(url, "scan", _no_report(group, subject, study, reports), "InputError"))
                continue
        studies.append(StudyInput(study, url, subject, dicom, None, report, None,  # type: ignore[arg-type]
                                  f"{group}/{subject}/{study}/{Path(rel).name}"))
    studies, clashes = _one_subject_per_study(studies)
    return studies, [*failures, *clashes]


#: Objects whose first bytes :func:`scan_store` reads at once (one ranged request each) to find DICOM files without
#: an image suffix.
PROBE_THREADS = 16


def _marked_dicoms(store: Store, files: dict[str, int]) -> tuple[set[str], list[Failure]]:
    """The objects of ``files`` (path relative to ``store`` -> size) without an image suffix that are DICOM files, as
    :func:`~cxrground.io.image.film_kind` finds them in a folder: the ``DICM`` marker at byte 128. Only objects of
    another suffix (none, or a UID's last number) that could hold the marker are read, each its first
    :data:`DICOM_HEAD` bytes and no more, :data:`PROBE_THREADS` at a time; an object that cannot be read is a
    failure naming it."""
    from concurrent.futures import ThreadPoolExecutor

    candidates = [rel for rel, size in files.items() if size >= DICOM_HEAD and _may_be_marked_dicom(rel)]
    if not candidates:
        return set(), []

    def head(rel: str) -> bytes | InputError:
        try:
            return store.read_head(rel, DICOM_HEAD)
        except FileNotFoundError:  # removed since the listing
            return b""
        except InputError as exc:
            return exc

    with ThreadPoolExecutor(min(PROBE_THREADS, len(candidates))) as pool:
        heads = list(pool.map(head, candidates))
    found = {rel for rel, data in zip(candidates, heads, strict=True)
             if isinstance(data, bytes) and is_dicom_head(data)}
    failures = [Failure(store.url(rel), "scan", data.reason, "InputError")
                for rel, data in zip(candidates, heads, strict=True) if isinstance(data, InputError)]
    return found, failures


def _may_be_marked_dicom(rel: str) -> bool:
    """Whether an object's name leaves it to its first bytes to tell whether it is a DICOM file: no image suffix, no
    suffix of another kind (a report, a table), no hidden name."""
    name = rel.rsplit("/", 1)[-1]
    suffix = Path(name).suffix.lower()
    return not name.startswith(".") and suffix not in IMAGE_SUFFIXES and suffix not in UNSUPPORTED_IMAGE_SUFFIXES \
        and suffix not in NOT_FILM_SUFFIXES


def _study_folders(root: Path, tree: list[Path]) -> list[Path]:
    """The ``pXX/pXXXXXXXX/sXXXXXXXX`` folders among ``tree`` (paths under ``root``; MIMIC-CXR layout)."""
    return sorted(p for p in tree if p.is_dir() and _STUDY_DIR_RE.search(p.relative_to(root).as_posix()))


def read_index(index: str | Path, image_root: str | Path,
               require_reports: bool = True) -> tuple[list[StudyInput], list[Failure]]:
    """Studies listed in a CSV/JSONL index; rows with a missing image or report become failures (a row without
    report is accepted when ``require_reports`` is False: the reports come from elsewhere, e.g. a table)."""
    index, root = Path(index).absolute(), Path(image_root).absolute()  # paths and failures named absolute
    studies: list[StudyInput] = []
    failures: list[Failure] = []
    first_report: dict[str, tuple[str, Path | None, object]] = {}  # study -> (its first row, report file, text)
    given_ids: dict[str, tuple[str, str]] = {}  # study key -> (the id given for it first, that row)
    subjects: dict[str, tuple[str | None, str]] = {}  # study key -> (its subject, the row that gave it)
    listed: dict[str, tuple[str, str]] = {}  # image (absolute) -> (its study key, the row that named it first)
    digests: dict[str, str] = {}  # study -> digest of its first report (made when a second row names the study)
    for n, row in _index_rows(index):
        where = f"{index}:{n}"
        if not isinstance(row, dict):
            failures.append(Failure(where, "scan", f"row is a JSON {_json_kind(row)}, not an object with 'image', "
                                    "'study_id' and 'report_path' or 'report'", "InputError"))
            continue
        wrong = [f"'{k}' is a JSON {_json_kind(v)}" for k, v in row.items()
                 if k in _INDEX_TEXT_COLUMNS and v is not None and (isinstance(v, bool) or
                                                                    not isinstance(v, str | int | float))]
        if wrong:
            failures.append(Failure(where, "scan", f"{'; '.join(wrong)}, not text", "InputError"))
            continue
        image = str(row.get("image") or row.get("image_path") or "").strip()
        study = str(row.get("study_id") or "").strip()
        if not image or not study:
            failures.append(Failure(where, "scan", "row needs 'image' and 'study_id'", "InputError"))
            continue
        path = root / image
        problem = image_file_problem(path)
        if problem is not None:
            failures.append(Failure(str(path), "scan", f"image listed in {where}: {problem}", "InputError"))
            continue
        report_path = str(row.get("report_path") or "").strip()
        text = row.get("report")
        rpath = (index.parent / report_path) if report_path else None
        if rpath is not None and not rpath.is_file():
            failures.append(Failure(str(rpath), "scan", f"report listed in {where} not found", "InputError"))
            continue
        if rpath is None and not (isinstance(text, str) and text.strip()) and require_reports:  # a number is no report
            failures.append(Failure(where, "scan", "row has neither 'report_path' nor 'report' text", "InputError"))
            continue
        study_id = study_key(study)
        other, other_row = given_ids.setdefault(study_id, (study, where))
        if other != study:  # 125 and s125: two studies of the user's, one key
            failures.append(Failure(where, "scan", key_clash(study, study_id, other, other_row), "InputError"))
            continue
        subject = _opt(row.get("subject_id"))
        first_subject, subject_row = subjects.setdefault(study_id, (subject, where))
        if subject is not None and first_subject not in (None, subject):
            failures.append(Failure(where, "scan", f"study {study_id} is of subject {first_subject} in {subject_row} "
                                    f"and of subject {subject} here: a study belongs to one patient", "InputError"))
            continue
        if first_subject is None and subject is not None:
            subjects[study_id] = (subject, where)
        other_study, image_row = listed.setdefault(_named(path), (study_id, where))
        if image_row != where:  # the image named again: a repeated row, or one film in two studies
            failures.append(Failure(where, "scan", f"repeats {image_row} (the same image of the same study: read once)"
                                    if other_study == study_id else f"image also listed for study {other_study} in "
                                    f"{image_row}: a film belongs to one study", "InputError"))
            continue
        first = first_report.setdefault(study_id, (where, rpath, text))
        if first[0] != where and (rpath, text) != first[1:]:  # another image of a study listed before, its report
            # named otherwise: it must say the same
            if study_id not in digests:
                digests[study_id] = _report_content(first[1], first[2])
            if _report_content(rpath, text) != digests[study_id]:
                failures.append(Failure(where, "scan", f"study {study_id} has another report in {first[0]}: a study "
                                        "has one report (give each report its own study_id)", "InputError"))
                continue
        studies.append(StudyInput(
            study_id=study_id,
            image_path=path,
            subject_id=subject,
            dicom_id=_opt(row.get("dicom_id")) or path.stem,
            view=_opt(row.get("view")),
            report_path=rpath,
            report_text=None if rpath is not None or text is None else str(text),
            relative_image_path=image,
            given_study_id=study,
        ))
    return studies, failures


def _named(path: Path) -> str:
    """``path`` absolute and normalised (``a/../b`` is ``b``; links kept as named), to tell files named twice."""
    return os.path.normpath(os.path.abspath(path))


def films_not_in_index(index: str | Path, image_root: str | Path) -> list[Path]:
    """The films under ``image_root`` (:func:`~cxrground.io.image.film_kind`) that no row of ``index`` names, sorted:
    they are not used (``scan`` lists them, ``ils build`` warns)."""
    root = Path(image_root).absolute()
    named = {_named(root / str(row.get("image") or row.get("image_path") or "").strip())
             for _, row in _index_rows(Path(index)) if isinstance(row, dict)}
    return [p for p in walk_files(root) if film_kind(p) is not None and not p.is_dir() and _named(p) not in named]


def _report_content(path: Path | None, text: object) -> str:
    """A digest of what a study's report says, to compare two rows of one study: of the file's text, else of the
    given text (both stripped); an unreadable file stands for itself (its path)."""
    if path is None:
        body = str(text).strip()
    else:
        try:
            body = path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            body = f"<file {path.resolve()}>"
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def find_release_file(images: str | Path, names: tuple[str, ...]) -> Path | None:
    """The first of ``names`` in the image folder or its parent (where MIMIC-CXR-JPG puts its tables beside
    ``files/``), or None."""
    root = Path(images)
    for folder in (root, root.parent):
        for name in names:
            if (folder / name).is_file():
                return folder / name
    return None


def image_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be an image, as far as the file system tells (None: a non-empty regular file)."""
    try:
        info = path.stat()
    except OSError as exc:
        return link_problem(path) or ("not found" if exc.errno == errno.ENOENT else f"cannot be read ({exc.strerror})")
    if not path.is_file():
        return "not a regular file"
    if info.st_size == 0:
        return "image file is empty (0 bytes)"
    return None


def _find_mimic_report(image: Path, group: str, subject: str, study: str, report_root: Path | None) -> Path | None:
    """The study's report: in ``report_root`` (or its ``files/``) when given, and only there; else beside the
    study folder."""
    if report_root is not None:
        candidates = [base / group / subject / f"{study}.txt" for base in (report_root, report_root / "files")]
    else:
        candidates = [image.parent.parent / f"{study}.txt"]
    return next((c for c in candidates if c.is_file()), None)


def _no_report(group: str, subject: str, study: str, report_root: str | Path | None) -> str:
    """The failure reason of a study without its report (``report_root``: the ``--reports`` folder, if given)."""
    if report_root is None:
        return f"no report {subject}/{study}.txt found"
    return (f"no report in the --reports folder (study {study}: {group}/{subject}/{study}.txt is not in "
            f"{report_root})")


#: Index columns whose value is text (a JSON number is taken as its text; a list, object or true/false is not).
_INDEX_TEXT_COLUMNS = ("image", "image_path", "study_id", "report_path", "report", "subject_id", "dicom_id", "view")


def _json_kind(value: object) -> str:
    """The JSON name of ``value``'s type (array, object, boolean, number, string, null)."""
    kinds = ((bool, "boolean"), (list, "array"), (dict, "object"), (str, "string"), (int | float, "number"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "null")


def _index_rows(index: Path) -> list[tuple[int, object]]:
    """The rows of a CSV (a dict per row) or JSONL index (each line's JSON value), each with the file line it
    starts on; an :class:`~cxrground.errors.InputError` naming the file when it cannot be read, is not UTF-8
    text, has a line that is not JSON or has no rows."""
    if not index.is_file():
        raise InputError("index file not found", index)
    if index.suffix.lower() == ".jsonl":
        try:
            text = decode_text(index.read_bytes())
        except OSError as exc:
            raise InputError(f"index cannot be read ({exc.strerror or exc})", index) from exc
        except UnicodeDecodeError as exc:
            raise InputError(f"index is not UTF-8 text (or UTF-16 with its byte-order mark) ({exc})", index) from exc
        rows: list[tuple[int, object]] = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append((n, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise InputError(f"line {n} is not JSON ({exc.msg})", index) from exc
        if not rows:
            raise InputError("index is empty: it has no rows", index)
        return rows
    reader = csv.reader(io.StringIO(read_csv_text(index, "index"), newline=""))
    header = next(reader, None)
    if not header:
        raise InputError("index is empty: it has no header and no rows", index)
    if not {"image", "image_path"} & set(header) or "study_id" not in header:
        semicolons = " (separated by ';': save the index with commas)" if len(header) == 1 and ";" in header[0] else ""
        raise InputError(f"index needs the columns image and study_id; its header has {header}{semicolons}", index)
    out: list[tuple[int, object]] = []
    start = reader.line_num + 1
    for values in reader:
        if values:  # a blank line is no row
            out.append((start, dict(zip(header, values, strict=False))))
        start = reader.line_num + 1
    if not out:
        raise InputError(f"index has a header ({','.join(header)}) but no rows", index)
    return out


def _opt(value: object) -> str | None:
    text = str(value).strip() if value is not None else ""
    return text or None


def _report_from(study: StudyInput, report_table: str | Path | None) -> str | None:
    """Where the study's report comes from: ``table`` (the ``--reports`` table, which wins), ``file`` (a report
    file), ``index`` (the text of its index row), or None (none found)."""
    if report_table is not None:
        return "table"
    return "file" if study.report_path else "index" if study.report_text is not None else None


def scan_lines(studies: list[StudyInput], failures: list[Failure], as_json: bool = False,
               view_table: str | Path | None = None, unlisted: Sequence[Path] = (), shown: int = 5,
               report_table: str | Path | None = None) -> list[str]:
    """What :func:`scan_folder` found: one JSON line per image, per failure and per film the index does not name
    (``unlisted``, :func:`films_not_in_index`), or the counts of studies, images and views (``view_table``: where the
    views came from, if a table), the failures and the first ``shown`` films not in the index. ``report_table``: the
    table the reports come from, if one (the JSON's ``report_from`` is then ``table``)."""
    if as_json:
        return ([json.dumps({"study_id": s.study_id, "given_study_id": s.given_study_id or s.study_id,
                             "subject_id": s.subject_id, "image": str(s.image_path),
                             "relative_image_path": s.relative_image_path, "dicom_id": s.dicom_id, "view": s.view,
                             "report": str(s.report_path) if s.report_path and not report_table else None,
                             "report_from": _report_from(s, report_table)})
                 for s in studies]
                + [json.dumps({"failure": f.to_dict()}) for f in failures]
                + [json.dumps({"not_in_index": str(p)}) for p in unlisted])
    views: dict[str, int] = {}
    for s in studies:
        views[s.view or "unknown"] = views.get(s.view or "unknown", 0) + 1
    views_shown = ", ".join(f"{v} {n}" for v, n in sorted(views.items(), key=lambda kv: (-kv[1], kv[0])))
    source = f"view table {view_table}" if view_table else "no view table"
    n = len({s.study_id for s in studies})
    lines = [f"{n} {'study' if n == 1 else 'studies'} ({len(studies)} image{'' if len(studies) == 1 else 's'}), "
             f"{len(failures)} failure{'' if len(failures) == 1 else 's'}",
             f"views of the images: {views_shown or 'none'} ({source})",
             *(f"  failed: {f.path}: {f.reason}" for f in failures)]
    if unlisted:
        more = f" (the first {shown}; --json lists them all)" if len(unlisted) > shown else ""
        films = "1 film under the image folder is" if len(unlisted) == 1 else \
            f"{len(unlisted)} films under the image folder are"
        lines += [f"{films} not in the index and not used{more}:",
                  *(f"  not in the index: {p}" for p in unlisted[:shown])]
    return lines


def _report_problem(study: StudyInput, seen: dict[Path, str | None]) -> tuple[str, str] | None:
    """(file, reason) when the study's report cannot be read as ``ils build`` reads it, else None."""
    from cxrground.reports.readers import parse_report_text, read_report

    if study.report_path is not None:
        path = Path(study.report_path)
        if path not in seen:
            try:
                read_report(path)
                seen[path] = None
            except InputError as exc:
                seen[path] = exc.reason
        return None if seen[path] is None else (str(path), f"report: {seen[path]}")
    if study.report_text is not None:
        if not study.report_text.strip():
            return str(study.image_path), f"report text of {study.study_id} is empty"
        try:
            parse_report_text(study.report_text, report_id=study.study_id)
        except InputError as exc:
            return str(study.image_path), f"report text of {study.study_id}: {exc.reason}"
    return None


def check_studies(studies: list[StudyInput], progress: bool = True) -> tuple[list[StudyInput], list[Failure]]:
    """The studies whose image decodes and whose report reads (as ``ils build`` reads them), and a failure for each
    other image, naming the file and the reason; images behind a URL are kept unread."""
    from cxrground.io.image import read_image
    from cxrground.io.progress import progress_bar

    kept: list[StudyInput] = []
    failures: list[Failure] = []
    reports: dict[Path, str | None] = {}
    for study in progress_bar(studies, desc="check", unit="img", progress=progress):
        problem = _report_problem(study, reports)
        if problem is None and "://" not in str(study.image_path):
            try:
                read_image(study.image_path)
            except InputError as exc:
                problem = (str(Path(study.image_path).absolute()), exc.reason)
        if problem is None:
            kept.append(study)
        else:
            failures.append(Failure(problem[0], "scan", problem[1], "InputError"))
    return kept, failures
