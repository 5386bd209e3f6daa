"""Report structuring (ILS §7): findings with three-valued assertion, predicted lesion type and reported location.

- :class:`RuleStructurer` (``rules``, the built-in default): lexicon and cue rules of :mod:`.lexicon`,
  thousands of reports per second on one core.
- :class:`LLMStructurer` (``llm``): any OpenAI-compatible chat-completions endpoint, two steps (structuring,
  then location mapping), versioned prompt files, SQLite response cache, retries, bounded concurrency.

:func:`get_structurer` builds one by name; :func:`structure_report` applies one to a :class:`Report` (section
choice first, by the section policy: ``findings`` = ILS §6 by default); :func:`structure_reports` does a batch and
returns ``(structured, failures)``. Both check every structurer's output (:func:`checked_report`: lesions,
assertions, sentence numbers and locations of the vocabulary) and apply the report-level rules of :mod:`.resolve`
(location anaphora, duplicates of a merged findings + impression section) to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Final

from cxrground.errors import BackendError, ConfigError, Failure, failure_path
from cxrground.io.progress import progress_bar
from cxrground.llm import ResponseCache, cache_key
from cxrground.registry import Registry, backend_label, call_backend
from cxrground.reports.findings import StructuredReport, Structurer, report_problem
from cxrground.reports.model import DEFAULT_SECTION_POLICY, Report, SectionChoice
from cxrground.reports.readers import parse_report_text
from cxrground.reports.sections import NO_SECTION_REASON, select_section
from cxrground.reports.structure.llm import STAGE, LLMError, LLMStructurer, load_prompt
from cxrground.reports.structure.resolve import resolve_findings
from cxrground.reports.structure.rules import ALTERNATIVE_POLICIES, RULES_VERSION, RuleStructurer, structure_text

__all__ = [
    "ALTERNATIVE_POLICIES",
    "RULES_VERSION",
    "STAGE",
    "STRUCTURERS",
    "LLMError",
    "LLMStructurer",
    "ResponseCache",
    "RuleStructurer",
    "cache_key",
    "checked_report",
    "get_structurer",
    "load_prompt",
    "resolve_findings",
    "structure_report",
    "structure_reports",
    "structure_section",
    "structure_text",
    "structured_by",
    "structurer_options",
]

#: The structurers by name (the rule-based default first).
STRUCTURERS: Final[Registry[Structurer]] = Registry("structurer")
STRUCTURERS.register("rules", RuleStructurer, help="built-in rules and lexicon (ILS §7)")
STRUCTURERS.register("llm", LLMStructurer, help="an LLM behind an OpenAI-compatible chat-completions API",
                     hidden=("transport",))


def get_structurer(name: str, **kwargs: Any) -> Structurer:
    """Build the structurer ``name`` (one of :data:`STRUCTURERS`) with ``kwargs``, checked against its options."""
    return STRUCTURERS.create(name, **kwargs)


def structurer_options(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """The options of ``given`` (None values left out) that structurer ``name`` takes, for :func:`get_structurer`.

    ``alternatives`` set for a structurer without that option is a :class:`ConfigError` (it would change nothing).
    """
    accepted = STRUCTURERS.options(name)
    if given.get("alternatives") is not None and "alternatives" not in accepted:
        raise ConfigError("--alternatives applies to the rules structurer only")
    return {k: v for k, v in given.items() if v is not None and k in accepted}


def _failure_path(report: Report) -> str:
    """How a failure names ``report``: its file (a table's ``file:line``) as the readers name it (absolute), else its
    id."""
    return failure_path(report.source) if report.source else report.report_id


def checked_report(structurer: Structurer, report_id: str, structured: StructuredReport) -> StructuredReport:
    """``structured``, what ``structurer`` made of report ``report_id``, when its section and findings are right
    (:func:`~cxrground.reports.findings.report_problem`); else a :class:`~cxrground.errors.BackendError` naming the
    structurer, the report and the wrong value."""
    problem = report_problem(structured)
    if problem is not None:
        raise BackendError(f"{backend_label('structurer', structurer)}: structure() of report {report_id!r} returned "
                           f"{problem}")
    return structured


def structured_by(structurer: Structurer, report_id: str, section: SectionChoice) -> StructuredReport:
    """``structurer``'s findings of ``section`` as it gives them, checked (:func:`checked_report`); a
    :class:`~cxrground.errors.BackendError` naming the structurer when it fails with an error of its own, returns
    anything but a :class:`~cxrground.reports.findings.StructuredReport` or a wrong finding."""
    structured = call_backend("structurer", structurer, "structure", StructuredReport, "StructuredReport", report_id,
                              section)
    return checked_report(structurer, report_id, structured)


def structure_section(structurer: Structurer, report_id: str, section: SectionChoice) -> StructuredReport:
    """:func:`structured_by`, with the report-level rules of :mod:`.resolve` applied."""
    return resolve_findings(structured_by(structurer, report_id, section))


def structure_report(report: Report | str, structurer: Structurer | str,
                     sections: str = DEFAULT_SECTION_POLICY) -> StructuredReport | None:
    """Structure the section of ``report`` chosen by the policy ``sections``; None when it has none (a failure).

    ``report`` may be the report's text (read by :func:`~cxrground.reports.parse_report_text`) and ``structurer``
    a registry name (:func:`get_structurer` with its defaults)."""
    if isinstance(report, str):
        report = parse_report_text(report)
    if isinstance(structurer, str):
        structurer = get_structurer(structurer)
    section = select_section(report, sections)
    if section is None:
        return None
    return structure_section(structurer, report.report_id, section)


def structure_reports(
    reports: Iterable[Report], structurer: Structurer, progress: bool = True,
    sections: str = DEFAULT_SECTION_POLICY,
) -> tuple[list[StructuredReport], list[Failure]]:
    """Structure a batch with the section policy ``sections``; returns (structured reports in input order, failures).

    A report without a usable section gives a failure with reason :data:`NO_SECTION_REASON`; a report the
    structurer cannot handle (an LLM request that fails after its retries, an invalid answer) or whose findings are
    wrong (:func:`checked_report`) gives a failure with the reason. Batches of the LLM structurer run concurrently.
    """
    reports = list(reports)
    failures: list[Failure] = []
    items: list[tuple[str, SectionChoice]] = []
    paths: dict[str, str] = {}
    for report in reports:
        section = select_section(report, sections)
        if section is None:
            failures.append(Failure(path=_failure_path(report), stage=STAGE, reason=NO_SECTION_REASON,
                                    error="NoSection", report=report.report_id))
            continue
        items.append((report.report_id, section))
        paths[report.report_id] = _failure_path(report)
    many = getattr(structurer, "structure_many", None)
    if callable(many):
        done, failed = many(items, progress=progress)
        failures.extend(replace(f, path=paths.get(f.path, f.path)) for f in failed)
        kept = []
        for d in done:
            try:
                kept.append(resolve_findings(checked_report(structurer, d.report_id, d)))
            except BackendError as exc:
                failures.append(_failure(paths.get(d.report_id, d.report_id), d.report_id, exc))
        return kept, failures
    done = []
    for report_id, section in progress_bar(items, desc="structure", unit="report", progress=progress):
        try:
            done.append(structure_section(structurer, report_id, section))
        except LLMError as exc:
            failures.append(replace(exc.failure(report_id), path=paths[report_id]))
        except (BackendError, ValueError) as exc:
            failures.append(_failure(paths[report_id], report_id, exc))
    return done, failures


def _failure(path: str, report_id: str, exc: Exception) -> Failure:
    """The failure of report ``report_id`` (named ``path``: :func:`_failure_path`) that ``exc`` failed."""
    return Failure(path=path, stage=STAGE, reason=str(exc) or type(exc).__name__, error=type(exc).__name__,
                   report=report_id)
