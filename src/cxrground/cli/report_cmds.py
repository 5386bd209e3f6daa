"""``cxrground reports``: read reports and show the section ILS would use, with numbered sentences."""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.common import EXISTING, echo_lines, group
from cxrground.reports.model import DEFAULT_SECTION_POLICY, SECTION_POLICIES
from cxrground.reports.readers import section_choices


@group("reports")
def reports() -> None:
    """Radiology reports: sections, section choice, sentence numbering."""


@reports.command("sections")
@click.argument("paths", nargs=-1, required=True, type=EXISTING)
@click.option("--sections", "policy", type=click.Choice(SECTION_POLICIES), default=DEFAULT_SECTION_POLICY,
              help="Section policy: findings (ILS §6: findings, else impression, else the last paragraph; the default "
                   "of ils build and reports structure), impression, or findings+impression (both, numbered on: the "
                   "default of reports label, whose sentence numbers this shows).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per report (and per failure).")
def sections(paths: tuple[Path, ...], policy: str, as_json: bool) -> None:
    """Parse report files (or folders of them): list each report's sections and print the one --sections reads as
    numbered sentences, numbered as the commands that read it with that policy number them (a finding's sent_idx,
    a label's sentence numbers). A report with no usable section is a failure, as for reports label.

    A .csv / .tsv / .jsonl file is a table of reports, one per row, with study_id and report columns."""
    choices = section_choices(paths, as_json, policy)
    echo_lines(choices.lines)
    echo_lines(choices.failure_lines, err=not as_json)
    if choices.failed:
        raise SystemExit(1)


COMMANDS: list[click.Command] = [reports]
