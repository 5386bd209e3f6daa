"""Reading reports from files: single files, batches of files, and JSONL/CSV tables of report texts.

Every bad input raises :class:`~cxrground.errors.ReportError` naming the file and the reason; the
batch readers catch it, keep one :class:`~cxrground.errors.Failure` (stage ``reports``) per bad
input and go on.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cxrground.errors import Failure, ReportError, failure_path
from cxrground.io.files import link_problem, walk_files
from cxrground.io.progress import progress_bar
from cxrground.reports.iu_xml import decode_utf8, parse_iu_xml
from cxrground.reports.model import DEFAULT_SECTION_POLICY, Report
from cxrground.reports.sections import NO_SECTION_REASON, describe_choice, sections_and_headings, select_section

__all__ = [
    "MAX_REPORT_SIZE",
    "REPORT_SUFFIXES",
    "STAGE",
    "TABLE_COLUMNS",
    "TABLE_SUFFIXES",
    "SectionChoices",
    "distinct_report_ids",
    "expand_report_paths",
    "image_kind",
    "list_report_files",
    "parse_report_text",
    "read_report",
    "read_report_table",
    "read_reports",
    "section_choices",
]

#: Stage name written into :class:`~cxrground.errors.Failure` records.
STAGE: Final[str] = "reports"
#: File suffixes :func:`list_report_files` picks up.
REPORT_SUFFIXES: Final[tuple[str, ...]] = (".xml", ".txt")
#: Suffixes of a table of reports (one report per row, :func:`read_report_table`); a file named with one of them is
#: read as such a table by :func:`read_reports`, with :data:`TABLE_COLUMNS`.
TABLE_SUFFIXES: Final[tuple[str, ...]] = (".jsonl", ".ndjson", ".csv", ".tsv")
#: The id and text columns of a report table (those of ``ils build --reports``).
TABLE_COLUMNS: Final[tuple[str, str]] = ("study_id", "report")
#: The largest report read (bytes of a file, characters of a text): about ten times a long radiology report. A
#: larger one is a :class:`ReportError` (a log, a concatenation of reports, a wrong file), not minutes of work.
MAX_REPORT_SIZE: Final[int] = 65_536

_XML_STARTS: Final[tuple[bytes, ...]] = (b"<?xml", b"<eCitation")
#: Leading bytes of the image files a report path may name by mistake (a BMP's reserved bytes are zeros, and a
#: TIFF's signature holds a zero byte, which no text report has).
_IMAGE_STARTS: Final[tuple[tuple[str, bytes], ...]] = (
    ("PNG", b"\x89PNG\r\n\x1a\n"), ("JPEG", b"\xff\xd8\xff"), ("TIFF", b"II*\x00"), ("TIFF", b"MM\x00*"))


def image_kind(head: bytes) -> str | None:
    """``PNG``, ``JPEG``, ``TIFF``, ``BMP`` or ``DICOM`` when ``head`` (a file's first 132 bytes) starts an image
    of that kind, else None."""
    for kind, start in _IMAGE_STARTS:
        if head.startswith(start):
            return kind
    if head.startswith(b"BM") and head[6:10] == b"\x00\x00\x00\x00":
        return "BMP"
    if head[128:132] == b"DICM":
        return "DICOM"
    return None


def parse_report_text(text: str, report_id: str | None = None, source: str | Path | None = None) -> Report:
    """Return the :class:`Report` of a free-text report.

    The format is ``mimic`` when the text has section headings, else ``text`` (whose only section is
    ``last_paragraph``). Without ``report_id`` the id is ``text-`` + the first 12 hex digits of the
    SHA-1 of the text. Empty or whitespace-only text raises ``ReportError``.
    """
    if not text:
        raise ReportError("empty report text", source)
    if not text.strip():
        raise ReportError("whitespace-only report text", source)
    if report_id is None:
        report_id = "text-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]
    report_id = str(report_id).strip()
    if not report_id:
        raise ReportError("empty report id", source)
    if len(text) > MAX_REPORT_SIZE:
        raise ReportError(f"report of {len(text):,} characters, over the {MAX_REPORT_SIZE:,} a radiology report "
                          "stays under", source if source is not None else report_id)
    sections, headings = sections_and_headings(text)
    return Report(
        report_id=report_id,
        format="mimic" if headings else "text",
        sections=sections,
        source=str(source) if source is not None else None,
        text=text,
    )


def _read_bytes(path: Path, limit: int | None = MAX_REPORT_SIZE) -> bytes:
    """The bytes of the report file ``path``; a :class:`ReportError` for a missing one, an image, or one over
    ``limit`` bytes (None: no limit, a table of reports, whose every text is checked instead)."""
    if not path.exists():
        raise ReportError(link_problem(path) or "file does not exist", path)
    if not path.is_file():
        raise ReportError("not a regular file", path)
    try:
        with path.open("rb") as fh:
            kind = image_kind(fh.read(132))
    except OSError as exc:
        raise ReportError(f"cannot read file: {exc.strerror or exc}", path) from None
    if kind is not None:
        raise ReportError(f"is a {kind} image, not a report (reports are .txt or .xml files, or a table of them: "
                          ".csv, .tsv, .jsonl)", path)
    size = path.stat().st_size
    if limit is not None and size > limit:
        raise ReportError(f"file of {size:,} bytes, over the {limit:,} a radiology report stays under", path)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ReportError(f"cannot read file: {exc.strerror or exc}", path) from None


def read_report(path: str | Path) -> Report:
    """Return the :class:`Report` in file ``path``.

    ``.xml`` files, and files whose content starts like XML, are read as Open-i/IU XML; anything
    else as UTF-8 free text (MIMIC-style when it has headings). The report id of a text file is
    its file stem. ``ReportError`` for a missing, empty, whitespace-only, non-UTF-8 or malformed file.
    """
    path = Path(path)
    if path.suffix.lower() in TABLE_SUFFIXES:
        raise ReportError(f"a {path.suffix} file is a table of reports, not one report: read it with "
                          "read_reports or read_report_table", path)
    data = _read_bytes(path)
    if not data:
        raise ReportError("empty file", path)
    head = data.lstrip(b"\xef\xbb\xbf \t\r\n")
    if path.suffix.lower() == ".xml" or head.startswith(_XML_STARTS):
        return parse_iu_xml(data, source=path)
    text = decode_utf8(data, path)
    if not text.strip():
        raise ReportError("whitespace-only file", path)
    return parse_report_text(text, report_id=path.stem, source=path)


def read_reports(paths: Iterable[str | Path], progress: bool = True) -> tuple[list[Report], list[Failure]]:
    """Return (reports, failures) for ``paths``, in input order; one :class:`Failure` per unreadable file. A path
    with a :data:`TABLE_SUFFIXES` suffix is a table of reports (:data:`TABLE_COLUMNS`): one report per row, one
    failure per bad row, or one for the file when it cannot be read as a table."""
    paths = list(paths)
    reports: list[Report] = []
    failures: list[Failure] = []
    for path in progress_bar(paths, desc="reports", unit="report", progress=progress):
        try:
            if Path(path).suffix.lower() in TABLE_SUFFIXES:
                rows, bad = read_report_table(path, *TABLE_COLUMNS, progress=progress and len(paths) == 1)
                reports.extend(rows)
                failures.extend(bad)
            else:
                reports.append(read_report(path))
        except ReportError as exc:
            failures.append(Failure.from_exception(path, STAGE, exc))
    return reports, failures


def distinct_report_ids(reports: Sequence[Report]) -> tuple[list[Report], list[Failure]]:
    """``reports`` less those whose id an earlier one (in input order) has, with a failure naming that one for each.

    A report's id is a function of its own file alone: a text file's name without its suffix, an Open-i XML
    report's ``uId``, a table row's id column; another file given with it never changes it. Two reports of one id
    (``a/good.txt`` and ``b/good.txt``) cannot be told apart in the output, so the later one is a failure."""
    first: dict[str, str] = {}
    kept: list[Report] = []
    failures: list[Failure] = []
    for r in reports:
        where = failure_path(r.source) if r.source else r.report_id
        seen = first.setdefault(r.report_id, where)
        if seen == where:
            kept.append(r)
            continue
        failures.append(Failure(where, STAGE, f"duplicate report id {r.report_id!r} (first at {seen}): a report's id "
                                "is its file's name without the suffix (an Open-i XML report's uId, a table row's id "
                                "column), so give each report file its own name", "ReportError", report=r.report_id))
    return kept, failures


def list_report_files(folder: str | Path, suffixes: Iterable[str] = REPORT_SUFFIXES) -> list[Path]:
    """Return the report files (by suffix, case-insensitive) in ``folder`` and its subfolders (MIMIC-CXR's
    ``files/p10/p10000032/s50414267.txt``; links to folders followed), sorted by path, broken links included (so
    that reading them fails and is recorded); hidden files and folders are left out."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ReportError("report folder does not exist", folder)
    wanted = {s.lower() for s in suffixes}
    return [p for p in walk_files(folder) if (p.is_file() or p.is_symlink()) and p.suffix.lower() in wanted
            and not any(part.startswith(".") for part in p.relative_to(folder).parts)]


def expand_report_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Report files named by ``paths``, each once, in order: a file stands for itself (a report, or a table of
    reports by its suffix), a folder for the report files in it and its subfolders; a folder holding none is a
    :class:`ReportError`."""
    files: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            files.append(path)
            continue
        found = list_report_files(path)
        if not found:
            raise ReportError(f"no report files ({', '.join(REPORT_SUFFIXES)}) in this folder or its subfolders",
                              path)
        files.extend(found)
    seen: set[Path] = set()
    unique = []
    for f in files:  # a file named twice, or named and inside a folder named too, is read once
        key = f.resolve() if f.exists() else f.absolute()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _jsonl_rows(text: str, path: Path) -> Iterator[tuple[str, dict[str, Any] | ReportError]]:
    """Yield (location, row or error) for each non-blank line of a JSONL text."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            yield where, ReportError(f"invalid JSON: {exc.msg} at column {exc.colno}", where)
            continue
        if not isinstance(row, dict):
            yield where, ReportError(f"JSON line is a {type(row).__name__}, expected an object", where)
            continue
        yield where, row


def _csv_rows(
    text: str, path: Path, delimiter: str, columns: tuple[str, str]
) -> Iterator[tuple[str, dict[str, Any] | ReportError]]:
    """Yield (location, row) for each record of a CSV/TSV text (the location is the record's first line)."""
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    fields = reader.fieldnames or []
    missing = [c for c in columns if c not in fields]
    if missing:
        raise ReportError(f"column(s) {', '.join(map(repr, missing))} not found; columns are {fields}", path)
    previous_end = reader.line_num
    for row in reader:
        yield f"{path}:{previous_end + 1}", row
        previous_end = reader.line_num


def read_report_table(
    path: str | Path, id_column: str, text_column: str, progress: bool = True
) -> tuple[list[Report], list[Failure]]:
    """Return (reports, failures) for a table of report texts, one report per row.

    ``path`` is ``.jsonl``/``.ndjson`` (one JSON object per line), ``.csv`` or ``.tsv`` (with a header).
    Each row's text is parsed with :func:`parse_report_text`. A bad row (invalid JSON, missing or
    empty id or text, duplicate id) becomes a :class:`Failure` whose path is ``file:line`` (absolute) and whose
    ``report`` is the row's id when it has one. A missing,
    empty or undecodable file, an unknown suffix or a CSV header without the columns raises ``ReportError``.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in {".jsonl", ".ndjson", ".csv", ".tsv"}:
        raise ReportError(f"unsupported report table type {suffix!r}; expected .jsonl, .ndjson, .csv or .tsv", path)
    data = _read_bytes(path, limit=None)  # each row's text is held to MAX_REPORT_SIZE (parse_report_text)
    if not data:
        raise ReportError("empty file", path)
    text = decode_utf8(data, path)
    if not text.strip():
        raise ReportError("whitespace-only file", path)
    if suffix in {".jsonl", ".ndjson"}:
        rows = _jsonl_rows(text, path)
    else:
        rows = _csv_rows(text, path, "\t" if suffix == ".tsv" else ",", (id_column, text_column))

    reports: list[Report] = []
    failures: list[Failure] = []
    seen: dict[str, str] = {}
    for where, row in progress_bar(rows, desc="reports", unit="report", progress=progress):
        try:
            if isinstance(row, ReportError):
                raise row
            report_id = row.get(id_column)
            body = row.get(text_column)
            if report_id is None or not str(report_id).strip():
                raise ReportError(f"missing or empty id column {id_column!r}", where)
            if body is None:
                raise ReportError(f"missing text column {text_column!r}", where)
            if not isinstance(body, str):
                raise ReportError(f"text column {text_column!r} is a {type(body).__name__}, expected a string", where)
            report_id = str(report_id).strip()
            if report_id in seen:
                raise ReportError(f"duplicate report id {report_id!r} (first at {seen[report_id]})", where)
            report = parse_report_text(body, report_id=report_id, source=where)
        except ReportError as exc:
            named = row.get(id_column) if isinstance(row, dict) else None
            named = str(named).strip() if named is not None else ""
            failures.append(Failure.from_exception(where, STAGE, exc, report=named or None))
            continue
        seen[report_id] = where
        reports.append(report)
    return reports, failures


@dataclass(frozen=True)
class SectionChoices:
    """:func:`describe_choice` of each report read, the failures as lines, and whether nothing could be read while
    something failed."""

    lines: list[str]
    failure_lines: list[str]
    failed: bool


def section_choices(paths: Iterable[str | Path], as_json: bool = False,
                    policy: str = DEFAULT_SECTION_POLICY) -> SectionChoices:
    """Read the report files (or folders of them) and describe the section ``policy`` reads of each (JSON lines with
    ``as_json``, failures then as ``{"failure": ...}`` lines); a report with no usable section is described and is a
    failure too (:data:`NO_SECTION_REASON`, as ``reports label`` counts it); a progress bar above 50 files."""
    files = expand_report_paths(paths)
    parsed, failures = read_reports(files, progress=len(files) > 50)
    unusable = [rep for rep in parsed if select_section(rep, policy) is None]
    failures += [Failure(failure_path(rep.source) if rep.source else rep.report_id, STAGE, NO_SECTION_REASON,
                         "ReportError", report=rep.report_id) for rep in unusable]
    failure_lines = [json.dumps({"failure": f.to_dict()}) if as_json else f"failed: {f.path}: {f.reason}"
                     for f in failures]
    return SectionChoices([describe_choice(rep, as_json, policy) for rep in parsed], failure_lines,
                          bool(failures) and len(unusable) == len(parsed))
