"""Structured findings: the ILS §7.1 6-tuple plus the mapped reported location (§7.2).

One :class:`Finding` per (sentence, finding phrase). ``lesion`` is one of the seven lesions, or
None for other abnormal findings (nodule, pneumothorax, fracture...) that still matter for empty
locations (ILS §10, EL). Assertion is three-valued internally: present / absent / uncertain;
uncertain maps to ``presence="positive", certainty="tentative"`` and never to absent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

from cxrground.errors import Failure, first_failure
from cxrground.registry import read_provenance
from cxrground.reports.model import SectionChoice
from cxrground.vocab import HEART, ILS_LOCATION_LABELS, LESIONS

Assertion = Literal["present", "absent", "uncertain"]
Presence = Literal["positive", "negative"]
Certainty = Literal["definitive", "tentative"]
#: Grade of an uncertain finding's hedge: ``likely`` ("probable pneumonia", "opacity, likely atelectasis") or
#: ``possible`` (every other hedge: "may represent", "cannot exclude", a differential, ...).
Hedge = Literal["likely", "possible"]
HEDGES: tuple[str, ...] = ("likely", "possible")
#: The assertions a finding may have.
ASSERTIONS: tuple[str, ...] = get_args(Assertion)

__all__ = ["ASSERTIONS", "HEDGES", "Assertion", "Certainty", "Finding", "Hedge", "Presence", "StructuredReport",
           "Structurer", "finding_lines", "finding_output", "finding_problem", "no_finding_row", "rejection_notes",
           "report_problem", "write_failure_lines", "write_finding_lines"]


@dataclass(frozen=True)
class Finding:
    """One structured finding of a report sentence."""

    entity: str
    """The finding phrase as written (e.g. ``opacity``, ``pleural effusion``)."""
    sent_idx: int
    """1-based sentence number of the chosen section (the ``(n)`` of ``section_content``)."""
    assertion: Assertion
    lesion: str | None
    """Predicted lesion type (one of the 7), or None for a non-target finding."""
    location_phrases: tuple[str, ...] = ()
    """Free-text location phrase(s) of the sentence that belong to this finding."""
    reported_location: tuple[str, ...] = ()
    """RL: the phrases mapped to ILS location labels (``heart`` for cardiomegaly), ordered, no repeats."""
    source: str = "rules"
    """Which structurer produced it (``rules``, ``llm:<model>``, ``truth``)."""
    hedge: Hedge | None = None
    """Grade of the hedge of an uncertain finding (:data:`HEDGES`); None when not uncertain or not graded (the LLM
    structurer and the synthetic truth do not grade). Extra information: the ILS assertion is uncertain either way."""

    def __post_init__(self) -> None:
        if self.hedge is not None and (self.hedge not in HEDGES or self.assertion != "uncertain"):
            raise ValueError(f"hedge {self.hedge!r} needs an uncertain finding and one of {HEDGES} "
                             f"(assertion {self.assertion!r})")

    @property
    def presence(self) -> Presence:
        """``positive`` for present or uncertain, ``negative`` for absent."""
        return "negative" if self.assertion == "absent" else "positive"

    @property
    def certainty(self) -> Certainty | None:
        """``tentative`` for uncertain, ``definitive`` for present, None for absent."""
        if self.assertion == "absent":
            return None
        return "tentative" if self.assertion == "uncertain" else "definitive"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (one line of ``findings.jsonl`` per finding, with the study id added)."""
        d = asdict(self)
        d["location_phrases"] = list(self.location_phrases)
        d["reported_location"] = list(self.reported_location)
        d["presence"] = self.presence
        d["certainty"] = self.certainty
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """Inverse of :meth:`to_dict` (derived keys are ignored)."""
        return cls(
            entity=str(data["entity"]),
            sent_idx=int(data["sent_idx"]),
            assertion=data["assertion"],
            lesion=data.get("lesion"),
            location_phrases=tuple(data.get("location_phrases") or ()),
            reported_location=tuple(data.get("reported_location") or ()),
            source=str(data.get("source", "rules")),
            hedge=data.get("hedge"),
        )


@dataclass(frozen=True)
class StructuredReport:
    """The chosen section and its findings."""

    report_id: str
    section: SectionChoice
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    def lesion_findings(self) -> list[Finding]:
        """Findings attributed to one of the seven lesions."""
        return [f for f in self.findings if f.lesion is not None]

    def finding_rows(self, provenance: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """One JSON-ready row per finding: report id, section name, sentence text, the finding (+ provenance)."""
        rows = [{"report_id": self.report_id, "section": self.section.name,
                 "sentence": self.section.sentence(f.sent_idx).text, **f.to_dict()} for f in self.findings]
        return rows if provenance is None else [{**row, "provenance": provenance} for row in rows]


def _strings(value: Any) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, str) for v in value)


def finding_problem(finding: Finding, sentences: int) -> str | None:
    """What is wrong with ``finding`` (a structurer's output) for a section of ``sentences`` sentences, or None.

    Right is: a lesion of :data:`~cxrground.vocab.LESIONS` or None, an assertion of :data:`ASSERTIONS`, ``sent_idx``
    a sentence of the section (1-based), entity and source text, location phrases a tuple of text, reported
    locations a tuple of ILS location labels or ``heart``."""
    if finding.lesion is not None and finding.lesion not in LESIONS:
        return f"lesion {finding.lesion!r}, not one of {', '.join(LESIONS)} or None"
    if finding.assertion not in ASSERTIONS:
        return f"assertion {finding.assertion!r}, not one of {', '.join(ASSERTIONS)}"
    if isinstance(finding.sent_idx, bool) or not isinstance(finding.sent_idx, int) \
            or not 1 <= finding.sent_idx <= sentences:
        return f"sentence {finding.sent_idx!r}, not one of the section's sentences 1..{sentences}"
    if not isinstance(finding.entity, str) or not isinstance(finding.source, str):
        return f"entity {finding.entity!r} and source {finding.source!r}, not both text"
    if not _strings(finding.location_phrases):
        return f"location phrases {finding.location_phrases!r}, not a tuple of text"
    labels = (*ILS_LOCATION_LABELS, HEART)
    if not _strings(finding.reported_location) or any(x not in labels for x in finding.reported_location):
        return f"reported location {finding.reported_location!r}, not a tuple of ILS location labels or {HEART!r}"
    return None


def report_problem(structured: StructuredReport) -> str | None:
    """What is wrong with a structurer's ``structured`` report (its section and each finding,
    :func:`finding_problem`), or None."""
    if not isinstance(structured.section, SectionChoice):
        return f"a section of type {type(structured.section).__name__}, not a SectionChoice"
    if not isinstance(structured.findings, tuple | list):
        return f"findings of type {type(structured.findings).__name__}, not a tuple of Finding"
    for i, finding in enumerate(structured.findings, start=1):
        if not isinstance(finding, Finding):
            return f"finding {i} of type {type(finding).__name__}, not a Finding"
        problem = finding_problem(finding, len(structured.section.sentences))
        if problem is not None:
            return f"finding {i} ({finding.entity!r}) with {problem}"
    return None


class Structurer(Protocol):
    """Turns a chosen report section into findings (rule-based, LLM, ...).

    ``provenance`` is what every output records of it (name, version, settings; JSON values): a property, as in the
    built-in structurers, or a method ``provenance()``, as in the other backends. Every caller reads it with
    :func:`~cxrground.registry.read_provenance`, which calls it when it is callable.
    """

    name: str

    def structure(self, report_id: str, section: SectionChoice) -> StructuredReport:
        """Structured findings of ``section``."""
        ...

    @property
    def provenance(self) -> dict[str, Any]:
        """Name, version and settings, recorded with every output (or a method returning them)."""
        ...


def finding_lines(rows: Sequence[dict[str, Any]], failures: Sequence[Failure] = ()) -> list[str]:
    """JSON lines (UTF-8 kept) of finding rows, then one ``{"failure": ...}`` line per failure."""
    return [json.dumps(item, ensure_ascii=False) for item in [*rows, *({"failure": f.to_dict()} for f in failures)]]


def finding_output(done: Sequence[StructuredReport], failures: Sequence[Failure], structurer: Structurer,
                   out: Path | None = None) -> tuple[list[str], list[str]]:
    """The finding lines of ``done`` (with the structurer's provenance), written to ``out`` when given.

    A report with no finding gets one :func:`no_finding_row`. Returns (lines for stdout: the JSON lines, or none
    when written; notes for stderr: what was written, and how many out-of-vocabulary values the structurer
    rejected).
    """
    provenance = read_provenance("structurer", structurer)
    rows = [row for rep in done for row in rep.finding_rows(provenance) or [no_finding_row(rep, provenance)]]
    notes: list[str] = []
    lines = finding_lines(rows, failures) if out is None else []
    if out is not None:
        fail_path = write_finding_lines(out, rows, failures)
        where = f"; failures in {fail_path}" if fail_path else ""
        first = first_failure(failures)
        found = sum(len(rep.findings) for rep in done)
        empty = sum(not rep.findings for rep in done)
        notes.append(f"{len(done)} reports ({empty} with no finding), {found} findings -> {out}; {len(failures)} "
                     f"failures{where}{first}")
    return lines, notes + rejection_notes(structurer, out)


def no_finding_row(report: StructuredReport, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one line of a report read and structured with no finding: ``{"report_id", "section", "findings": 0}``
    (+ provenance), so that the output names every report read (a report never read has a failure line)."""
    row: dict[str, Any] = {"report_id": report.report_id, "section": report.section.name, "findings": 0}
    return row if provenance is None else {**row, "provenance": provenance}


def rejection_notes(structurer: Structurer, out: Path | None = None, shown: int = 5) -> list[str]:
    """Notes on the out-of-vocabulary values ``structurer`` rejected (an LLM's lesion, location or sentence number
    outside the vocabulary): all of them written to ``OUT.rejections.jsonl`` beside ``out`` (removed when there
    are none), else the first ``shown`` named in the note."""
    rejections = list(getattr(structurer, "rejections", None) or [])
    path = out.with_name(out.name + ".rejections.jsonl") if out is not None else None
    if not rejections:
        if path is not None:
            path.unlink(missing_ok=True)
        return []
    head = f"{len(rejections)} out-of-vocabulary values rejected by the LLM structurer"
    if path is not None:
        path.write_text("".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rejections),
                        encoding="utf-8")
        return [f"{head}: each in {path}"]
    listed = "; ".join(f"{r.get('report_id')}: {r.get('field')} {r.get('value')!r} ({r.get('reason')})"
                       for r in rejections[:shown])
    more = f"; and {len(rejections) - shown} more" if len(rejections) > shown else ""
    return [f"{head}: {listed}{more}"]


def write_finding_lines(out: Path, rows: Sequence[dict[str, Any]], failures: Sequence[Failure]) -> Path | None:
    """Write ``rows`` to ``out`` and the failures to ``OUT.failures.jsonl`` (removed when there are none).

    Returns the failures file, or None when there were no failures.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(line + "\n" for line in finding_lines(rows)), encoding="utf-8")
    return write_failure_lines(out, failures)


def write_failure_lines(out: Path, failures: Sequence[Failure]) -> Path | None:
    """Write ``failures`` beside the output file ``out`` as ``OUT.failures.jsonl``, one flat object per line (the
    ``failures.jsonl`` format of every batch command; removed when there are none).

    Returns the failures file, or None when there were no failures.
    """
    fail_path = out.with_name(out.name + ".failures.jsonl")
    if not failures:
        fail_path.unlink(missing_ok=True)
        return None
    lines = (json.dumps(f.to_dict(), ensure_ascii=False) + "\n" for f in failures)
    fail_path.write_text("".join(lines), encoding="utf-8")
    return fail_path
