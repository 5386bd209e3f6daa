"""``cxrground reports``: read reports and show the section ILS would use, with numbered sentences."""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.common import EXISTING, echo_lines, group
from cxrground.reports.readers import section_choices


@group("reports")
def reports() -> None:
    """Radiology reports: sections, section choice, sentence numbering."""


@reports.command("sections")
@click.argument("paths", nargs=-1, required=True, type=EXISTING)
@click.option("--json", "as_json", is_flag=True, help="One JSON line per report (and per failure).")
def sections(paths: tuple[Path, ...], as_json: bool) -> None:
    """Parse report files (or folders of them) and print the chosen section as numbered sentences.

    A .csv / .tsv / .jsonl file is a table of reports, one per row, with study_id and report columns."""
    choices = section_choices(paths, as_json)
    echo_lines(choices.lines)
    echo_lines(choices.failure_lines, err=not as_json)
    if choices.failed:
        raise SystemExit(1)


COMMANDS: list[click.Command] = [reports]
