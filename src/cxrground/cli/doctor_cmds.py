"""``cxrground doctor``: what this machine has for cxrground and what it misses."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cxrground.doctor import WEIGHTS_ENV, format_report, plugin_checks, run_checks


@click.command("doctor")
@click.option("--weights", type=click.Path(path_type=Path), default=None,
              help=f"Folder holding model weights (default: ${WEIGHTS_ENV}, else ./weights).")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor(weights: Path | None, as_json: bool) -> None:
    """Check Python, torch/CUDA, every extra, weights, Chromium, Ray, the real-data pack and the plug-in modules;
    print the line that adds each missing piece. Exit code 0 when the built-in chain (make demo) can run and every
    plug-in module imports."""
    from cxrground.cli import PLUGINS

    report = run_checks(weights=weights)
    report.checks.extend(plugin_checks(PLUGINS))
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else format_report(report))
    if not report.ok:
        raise SystemExit(1)


COMMANDS = [doctor]
