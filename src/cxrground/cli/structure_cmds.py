"""``cxrground reports structure`` (attached to the ``reports`` group): findings (ILS §7) as JSON lines."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cxrground.cli.common import EXISTING, echo_lines, request_options
from cxrground.reports.request import StructureRequest, structure_files

from .report_cmds import reports

__all__ = ["COMMANDS", "structure"]


@reports.command("structure")
@click.argument("paths", nargs=-1, required=True, type=EXISTING)
@request_options(StructureRequest)
def structure(request: StructureRequest, paths: tuple[Path, ...]) -> None:
    """Structure report files (or folders of them) into findings: one JSON line per finding.

    Each line holds the report id, the chosen section, the sentence, and the finding (entity, sent_idx,
    assertion, presence, certainty, lesion, location_phrases, reported_location, source); LLM lines also
    carry the provenance (model, decoding settings, prompt versions and hashes). Reports that cannot be
    structured are printed as {"failure": ...} lines (or written to OUT.failures.jsonl with --out).
    """
    output = structure_files(paths, request)
    echo_lines(output.lines)
    echo_lines(output.notes, err=True)
    if output.failed:
        sys.exit(1)

COMMANDS: list[click.Command] = []
