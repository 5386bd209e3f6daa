"""``cxrground reports structure`` and ``reports label`` (attached to the ``reports`` group): findings (ILS §7) as
JSON lines, and per-report lesion labels (CheXpert-labeler style) rolled up from them."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from click.core import ParameterSource

from cxrground.cli.common import EXISTING, echo_lines, exit_if_failed, note, request_options, strict_option
from cxrground.reports.labels import LabelRequest, label_files
from cxrground.reports.request import StructureOutput, StructureRequest, structure_files
from cxrground.reports.structure import STRUCTURERS

from .report_cmds import reports

__all__ = ["COMMANDS", "label", "structure"]


#: Request fields by the structurer option they set (where the two names differ).
_OPTION_OF_FIELD = {"cache_path": "cache"}


def _refuse_options_of_another_structurer(request: StructureRequest) -> None:
    """A usage error when an option given on the command line belongs to another structurer than the one chosen
    (``--model`` without ``--structurer llm`` would be ignored); values from environment variables are left alone."""
    ctx = click.get_current_context()
    accepted = STRUCTURERS.options(request.structurer_name)
    for param in ctx.command.params:
        option = _OPTION_OF_FIELD.get(param.name or "", param.name)
        if (ctx.get_parameter_source(param.name or "") == ParameterSource.COMMANDLINE and option not in accepted
                and any(option in STRUCTURERS.options(other) for other in STRUCTURERS.names())):
            flag = param.opts[0] if param.opts else option
            users = [n for n in STRUCTURERS.names() if option in STRUCTURERS.options(n)]
            raise click.UsageError(f"{flag} applies to the {' / '.join(users)} structurer only, and the structurer "
                                   f"is {request.structurer_name} (--structurer {users[0]} to use it)")


def _refuse_conflicting_structurer_opts(request: StructureRequest) -> None:
    """A usage error naming both when an option given on the command line (``--seed 3``) and a ``--structurer-opt``
    of the same key (``seed=4``) give the structurer two values; an option's value from its environment variable is
    overridden by ``--structurer-opt``, as documented."""
    ctx = click.get_current_context()
    accepted = STRUCTURERS.options(request.structurer_name)
    for param in ctx.command.params:
        option = _OPTION_OF_FIELD.get(param.name or "", param.name or "")
        if option not in request.structurer_opt or option not in accepted or \
                ctx.get_parameter_source(param.name or "") != ParameterSource.COMMANDLINE:
            continue
        given, raw = ctx.params[param.name or ""], request.structurer_opt[option]
        if not _same_value(given, raw):
            flag = param.opts[0] if param.opts else option
            raise click.UsageError(f"{flag} {given} and --structurer-opt {option}={raw} give the structurer two "
                                   f"values of {option}: give one of them")


def _same_value(given: object, raw: str) -> bool:
    """Whether the text ``raw`` of a ``--structurer-opt`` reads as the value ``given`` of an option (``8`` and 8,
    ``0.50`` and 0.5, a path and the same path)."""
    try:
        if isinstance(given, bool):
            return raw.strip().lower() == str(given).lower()
        if isinstance(given, int | float):
            return type(given)(raw) == given
        if isinstance(given, Path):
            return Path(raw) == given
    except ValueError:
        return False
    return str(given) == raw


#: Where ``--strict`` says the failures of ``reports structure`` / ``reports label`` are recorded.
_FAILURES_AT = "in OUT.failures.jsonl with --out, else as {\"failure\": ...} lines"


def _exit(output: StructureOutput, strict: bool, where: str) -> None:
    """Exit 1 when nothing was done and something failed; with ``strict`` exit 3 when some reports failed."""
    if output.failed:
        sys.exit(1)
    exit_if_failed(strict, output.failures, f"{output.failures} of {output.done + output.failures} reports failed",
                   where)


def _failures_where(out: Path | None, on_stdout: bool) -> str:
    """Where the failures of a run went: the failures file beside ``out``, or the failure lines printed."""
    if out is not None:
        return f"the reasons are in {out.with_name(out.name + '.failures.jsonl')}"
    return "the reasons are in the failure lines " + ("above" if on_stdout else "on stderr")


@reports.command("structure")
@click.argument("paths", nargs=-1, required=True, type=EXISTING)
@request_options(StructureRequest)
@strict_option("reports", _FAILURES_AT)
def structure(request: StructureRequest, paths: tuple[Path, ...], strict: bool) -> None:
    """Structure report files (or folders of them) into findings: one JSON line per finding.

    A .csv / .tsv / .jsonl file is a table of reports, one per row, with study_id and report columns.

    Each line holds the report id, the chosen section, the sentence, and the finding (entity, sent_idx,
    assertion, presence, certainty, lesion, location_phrases, reported_location, source); LLM lines also
    carry the provenance (model, decoding settings, prompt versions and hashes). A report with no finding gets
    one line {"report_id", "section", "findings": 0}. Reports that cannot be structured are printed as
    {"failure": ...} lines (or written to OUT.failures.jsonl with --out) and the others are structured. Exit
    status: 0 when the run finished (with --strict, 3 when some reports failed), 1 when every report failed or an
    error stopped the run, 2 for a usage error.
    """
    _refuse_options_of_another_structurer(request)
    _refuse_conflicting_structurer_opts(request)
    output = structure_files(paths, request, note)
    echo_lines(output.lines)
    echo_lines(output.notes, err=True)
    _exit(output, strict, _failures_where(request.out, True))


@reports.command("label")
@click.argument("paths", nargs=-1, required=True, type=EXISTING)
@request_options(LabelRequest)
@strict_option("reports", _FAILURES_AT + " (on stderr for CSV)")
def label(request: LabelRequest, paths: tuple[Path, ...], strict: bool) -> None:
    """Label report files (or folders of them) per lesion: 1 present, -1 uncertain, 0 negated (JSONL status absent),
    blank not mentioned.

    A .csv / .tsv / .jsonl file is a table of reports, one per row, with study_id and report columns.

    CSV: report_id, section, one column per lesion and opacity_observed (opacity findings plus opacity-class
    phrases attributed to another lesion), then a <lesion>_sides column each (right / left / right+left). JSONL: one
    object per report with status, code, sides and sentence numbers per lesion. Failures go to OUT.failures.jsonl
    with --out, else to stdout as {"failure": ...} lines (JSONL) or to stderr (CSV, so stdout stays one table).
    Exit status: 0 when the run finished (with --strict, 3 when some reports failed), 1 when every report failed or
    an error stopped the run, 2 for a usage error.
    """
    _refuse_options_of_another_structurer(request)
    _refuse_conflicting_structurer_opts(request)
    output = label_files(paths, request, note)
    echo_lines(output.lines)
    echo_lines(output.notes, err=True)
    _exit(output, strict, _failures_where(request.out, request.label_format == "jsonl"))

COMMANDS: list[click.Command] = []
