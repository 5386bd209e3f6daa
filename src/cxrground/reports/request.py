"""Structuring report files as a request (:class:`StructureRequest`) and :func:`structure_files`.

Each field documents itself (:func:`cxrground.fields.option`); ``cxrground reports structure`` offers one option
per field. The structurers themselves are in :mod:`cxrground.reports.structure`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cxrground.errors import ConfigError, Failure, OptionError
from cxrground.fields import option
from cxrground.llm import RetryPolicy
from cxrground.reports.findings import StructuredReport, Structurer, finding_output
from cxrground.reports.model import DEFAULT_SECTION_POLICY, SECTION_POLICIES
from cxrground.reports.readers import TABLE_SUFFIXES, distinct_report_ids, expand_report_paths, read_reports
from cxrground.reports.reading import reads_the_film
from cxrground.reports.structure import (
    ALTERNATIVE_POLICIES,
    STRUCTURERS,
    get_structurer,
    structure_reports,
    structurer_options,
)
from cxrground.reports.structure.llm import DEFAULT_MAX_TOKENS, DEFAULT_SEED
from cxrground.reports.structure.rules import DEFAULT_ALTERNATIVES

__all__ = ["StructureOutput", "StructureRequest", "stats_notes", "structure_files", "structure_paths"]


@dataclass(frozen=True, kw_only=True)
class StructureRequest:
    """Which structurer, with which settings, structures which section of each report, and where the lines go."""

    structurer_name: str = option("rules", flag="--structurer", registry=STRUCTURERS)
    structurer_opt: dict[str, str] = option(default_factory=dict, help="KEY=VALUE for the structurer (a plug-in's "
                                            "options too). It overrides what a dedicated option below takes from "
                                            "its environment variable; given on the command line with another "
                                            "value too, it is refused.")
    sections: str = option(DEFAULT_SECTION_POLICY, choices=SECTION_POLICIES, help="Report section policy: findings "
                           "(ILS §6), impression, or findings+impression (both, numbered on).")
    alternatives: str | None = option(None, choices=ALTERNATIVE_POLICIES, show_default=DEFAULT_ALTERNATIVES,
                                      help="Rule structurer: alternatives ('atelectasis or scarring') uncertain or "
                                           "present.")
    base_url: str | None = option(None, envvar="CXRGROUND_LLM_BASE_URL",
                                  help="API root, e.g. http://localhost:8000/v1 (llm).")
    model: str | None = option(None, envvar="CXRGROUND_LLM_MODEL", help="Model name sent to the API (llm).")
    api_key_env: str | None = option(None, metavar="VAR",
                                     help="Name of the environment variable holding the API key (llm).")
    cache_path: Path | None = option(None, flag="--cache", path="out_file", envvar="CXRGROUND_LLM_CACHE",
                                     help="SQLite response cache (llm); reruns with the same prompts make no request. "
                                          "Default: in memory.")
    concurrency: int = option(4, low=1, help="Requests in flight at most (llm).")
    timeout: float = option(RetryPolicy.timeout, low=0, low_open=True,
                            help="Deadline of one request in seconds: connect, send and the whole answer (llm).")
    max_retries: int = option(RetryPolicy.max_attempts - 1, low=0,
                              help="Retries on 429 / 5xx / timeouts / connection errors (llm); a server that never "
                                   "answered stops the run once a request's retries are spent, one that stopped "
                                   "answering after max(8, 2 x concurrency) reports in a row.")
    temperature: float = option(0.0, help="Sampling temperature (llm).")
    max_tokens: int | None = option(None, low=1, show_default=str(DEFAULT_MAX_TOKENS),
                                    help="Most tokens of each answer (llm): an answer the server cuts there fails its "
                                         "report, saying so.")
    seed: int | None = option(None, show_default=str(DEFAULT_SEED), help="Seed sent with each request (llm): a "
                              "sampling server answers alike for one seed. Part of the response cache's key.")
    out: Path | None = option(None, path="out_file", help="Write the finding lines here (failures go to "
                              "OUT.failures.jsonl) instead of stdout ('-': stdout).")
    progress: bool = option(True, flag="--progress/--no-progress", show_default=False,
                            help="Progress bar on stderr for large batches.")

    def __post_init__(self) -> None:
        if self.out is not None and str(self.out) == "-":  # the usual name of standard output
            object.__setattr__(self, "out", None)

    def structurer_settings(self) -> dict[str, object]:
        """The settings given for the structurer, for :func:`~cxrground.reports.structure.structurer_options`."""
        return {"alternatives": self.alternatives, "base_url": self.base_url or "", "model": self.model or "",
                "api_key_env": self.api_key_env, "cache": self.cache_path, "concurrency": self.concurrency,
                "timeout": self.timeout, "max_retries": self.max_retries, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "seed": self.seed}


@dataclass(frozen=True)
class StructureOutput:
    """What structuring produced: finding lines for stdout, notes for stderr, whether nothing was structured while
    something failed, and the counts of reports done and failed (read or structuring failures)."""

    lines: list[str]
    notes: list[str]
    failed: bool
    done: int = 0
    failures: int = 0


def _has_table(files: Sequence[Path]) -> bool:
    """Whether ``files`` holds a table of reports (many reports in one file)."""
    return any(Path(f).suffix.lower() in TABLE_SUFFIXES for f in files)


def structure_paths(paths: Sequence[Path], request: StructureRequest, note: Callable[[str], None] | None = None,
                    ) -> tuple[list[StructuredReport], list[Failure], Structurer]:
    """Read the report files (or folders of them) and structure each as ``request`` says; returns (structured
    reports, read and structuring failures, the structurer). Settings that do not fit the structurer are an
    :class:`OptionError`. ``note`` gets the structurer's notes during the run (the LLM structurer's retry notes,
    see :attr:`~cxrground.reports.structure.LLMStructurer.on_note`)."""
    files = expand_report_paths(paths)
    parsed, failures = read_reports(files, progress=request.progress and (len(files) > 50 or _has_table(files)))
    show = request.progress and len(parsed) > 50
    parsed, clashes = distinct_report_ids(parsed)
    failures = [*failures, *clashes]
    name = request.structurer_name
    try:
        structurer = get_structurer(name, **{**structurer_options(name, request.structurer_settings()),
                                             **request.structurer_opt})
    except ConfigError as exc:
        raise OptionError(str(exc)) from None
    if note is not None and hasattr(structurer, "on_note"):
        structurer.on_note = note
    done, failed = structure_reports(parsed, structurer, progress=show, sections=request.sections)
    return done, [*failures, *failed], structurer


def structure_files(paths: Sequence[Path], request: StructureRequest,
                    note: Callable[[str], None] | None = None) -> StructureOutput:
    """Read the report files (or folders of them) and structure each into findings; settings that do not fit the
    structurer are an :class:`OptionError`. ``note``: see :func:`structure_paths`."""
    done, failures, structurer = structure_paths(paths, request, note)
    lines, notes = finding_output(done, failures, structurer, request.out)
    return StructureOutput(lines, notes + silent_report_notes(done) + stats_notes(structurer),
                           bool(failures) and not done, len(done), len(failures))


def stats_notes(structurer: Structurer) -> list[str]:
    """The structurer's one-line run summary (the LLM structurer's ``stats_summary()``: requests, cache hits,
    retries, schema fallbacks, rejections); none for a structurer without one."""
    summary = getattr(structurer, "stats_summary", None)
    return [str(summary())] if callable(summary) else []


def silent_report_notes(done: Sequence[StructuredReport], shown: int = 10) -> list[str]:
    """A note naming the reports that name no finding and no normal examination
    (:func:`~cxrground.reports.reading.reads_the_film`; ``ils build`` gives them no lung or pleural negatives); none
    when every report reads the film."""
    silent = [rep.report_id for rep in done if not reads_the_film(rep)]
    if not silent:
        return []
    more = f" and {len(silent) - shown} more" if len(silent) > shown else ""
    return [f"{len(silent)} of {len(done)} reports name no finding and no normal examination (a normal heart alone "
            "says nothing of the lungs; ils build gives them no lung or pleural negatives): "
            f"{', '.join(silent[:shown])}{more}"]
