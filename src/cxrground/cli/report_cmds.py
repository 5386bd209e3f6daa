"""``cxrground reports``: read reports and show the section ILS would use, with numbered sentences."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cxrground.cli.common import EXISTING, group
from cxrground.reports import expand_report_paths, read_reports
from cxrground.reports.sections import describe_choice


@group("reports")
def reports() -> None:
    """Radiology reports: sections, section choice, sentence numbering."""


@reports.command("sections")
@click.argument("paths", nargs=-1, required=True, type=EXISTING)
@click.option("--json", "as_json", is_flag=True, help="One JSON line per report (and per failure).")
def sections(paths: tuple[Path, ...], as_json: bool) -> None:
    """Parse report files (or folders of them) and print the chosen section as numbered sentences."""
    files = expand_report_paths(paths)
    parsed, failures = read_reports(files, progress=len(files) > 50)
    for rep in parsed:
        click.echo(describe_choice(rep, as_json))
    for f in failures:
        line = json.dumps({"failure": f.to_dict()}) if as_json else f"failed: {f.path}: {f.reason}"
        click.echo(line, err=not as_json)
    if failures and not parsed:
        raise SystemExit(1)


COMMANDS: list[click.Command] = [reports]
