"""``cxrground percept eval | score | report | export-results``: run VLMs on CheXpercept, score the runs, compare
them in HTML, hand them to the reference repository's analysis.

The commands are added to the ``percept`` group (:mod:`cxrground.cli.percept_build_cmds`) at import time;
``COMMANDS`` is empty because the group is registered there. API keys come only from the environment
variable named by ``--api-key-env``; there is no option that takes a key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cxrground.cli.common import (
    DIR,
    OUT_DIR,
    OUT_FILE,
    echo_lines,
    exit_if_failed,
    note,
    request_options,
    strict_option,
    threads_option,
    warn,
)
from cxrground.cli.percept_build_cmds import percept
from cxrground.errors import InputError
from cxrground.evaluation.percept.request import EvalRequest, evaluate_request


@percept.command("eval")
@threads_option
@request_options(EvalRequest)
@strict_option("cases", "in RUN/results.jsonl")
def eval_cmd(request: EvalRequest, strict: bool) -> None:
    """Run one model on a benchmark (resumable: rerun the same command after a kill or a run stop). A server that
    stops answering (max(8, 2 x concurrency) cases in a row without an answer) stops the run; a rerun runs the cases
    it gave no answer to again. Exits 1 when every case it ran failed, or every case of the run folder is recorded
    as failed (their errors are in RUN/results.jsonl; --retry-failed runs them again), or the run stopped; with
    --strict 3 when some cases of the run folder are recorded as failed."""
    outcome = evaluate_request(request, note=note)
    click.echo(outcome.line)
    failed = outcome.failed_units
    if outcome.all_failed:
        click.echo(f"every case failed; the errors are in {request.out / 'results.jsonl'} "
                   "(rerun with --retry-failed once the model answers)", err=True)
        raise SystemExit(1)
    exit_if_failed(strict, failed, f"{failed} cases of the run folder failed",
                   f"the errors are in {request.out / 'results.jsonl'}")


@percept.command("score")
@click.argument("run", type=DIR)
@click.option("--bootstrap", "n_boot", type=click.IntRange(0), default=1000, help="Bootstrap resamples (0 = none).")
def score_cmd(run: Path, n_boot: int) -> None:
    """Score a run: score.json and the reference CSVs in RUN/; prints the summary rows (and the spread rows of
    runs with several repeats). A results line that holds no valid record is named (file:line) in a warning and
    its case, where it names one, counts as failed. A path the run has no case of is written as 0.0 rows in
    model_performance_summary.csv (the reference's format), with a note naming it."""
    from cxrground.evaluation.percept.scoring import score_lines, score_run, zero_path_note

    score = score_run(run, n_boot=n_boot)
    lines, remark = score_lines(score)
    echo_lines(lines)
    _warn_bad_lines(score)
    echo_lines([x for x in (remark, zero_path_note(score)) if x], err=True)


def _warn_bad_lines(score: dict[str, Any]) -> None:
    """A warning per line of the run's results that holds no valid record (``file:line: reason``)."""
    for line in score.get("bad_lines", []):
        warn(f"warning: {line}")


@percept.command("report")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True))
@click.option("--out", type=OUT_FILE, required=True, help="HTML file to write.")
@click.option("--bootstrap", "n_boot", type=click.IntRange(0), default=1000, help="Bootstrap resamples (0 = none).")
def report_cmd(runs: tuple[Path, ...], out: Path, n_boot: int) -> None:
    """Compare the run folders RUNS in one self-contained HTML page (+ all_models_summary.csv next to it). Files
    among RUNS (the response cache, an earlier report, as `runs/*` names them) and run folders with no results yet
    (a run stopped by a 401/403/404 or killed before its first case finished) are skipped with a note naming them;
    a folder without a valid config.json is an error naming it, and so is RUNS without a run that has results. A
    path a run has no case of is written as 0.0 rows in all_models_summary.csv (the reference's format), with a note
    naming it. Runs evaluated on different benchmark builds (bench_sha256 in config.json) are reported with a
    warning naming each build's runs, also shown in the HTML page."""
    from cxrground.evaluation.percept.report import REPORT_CSV, has_results, load_scores, mixed_builds, write_report
    from cxrground.evaluation.percept.scoring import zero_path_note

    folders = [r for r in runs if r.is_dir()]
    skipped = [r for r in runs if not r.is_dir()]
    if skipped:
        click.echo(f"skipped {len(skipped)} file(s) that are no run folders: {', '.join(map(str, skipped))}",
                   err=True)
    if not folders:
        raise click.UsageError("RUNS names no run folder")
    empty = [r for r in folders if not has_results(r)]
    if empty:
        click.echo(f"skipped {len(empty)} run folder(s) with no results yet: {', '.join(map(str, empty))}",
                   err=True)
    folders = [r for r in folders if r not in empty]
    if not folders:
        raise InputError("no run among RUNS has results yet (results.jsonl); nothing to report")
    scores = load_scores(folders, n_boot=n_boot)
    for score in scores:
        _warn_bad_lines(score)
    mixed = mixed_builds(scores)
    if mixed:
        warn(mixed)
    path = write_report(scores, out)
    echo_lines([x for x in (zero_path_note(s, REPORT_CSV) for s in scores) if x], err=True)
    click.echo(f"wrote {path}")


@percept.command("export-results")
@click.argument("runs", nargs=-1, required=True, type=DIR)
@click.option("--out", type=OUT_DIR, required=True,
              help="Folder to write <provider>_<model>/oracle_<setting>/all_results.json into.")
@click.option("--repeat", type=click.IntRange(0), default=0, show_default=True,
              help="Which repeat of a run made with --repeats N (the reference has one answer per case).")
@click.option("--overwrite", is_flag=True, help="Replace an all_results.json an earlier export wrote for the same "
              "model and oracle setting in OUT (refused otherwise).")
def export_results_cmd(runs: tuple[Path, ...], out: Path, repeat: int, overwrite: bool) -> None:
    """Write runs in the reference repository's result layout (all_results.json per model and oracle setting), so
    its analysis script (01_analyze_model_performance.py --results-dir OUT) reads them. Other runs may be exported
    into the same OUT later; a file an earlier export wrote is replaced only with --overwrite."""
    from cxrground.evaluation.percept.reference_results import export_results

    for path in export_results(runs, out, repeat=repeat, overwrite=overwrite):
        click.echo(f"wrote {path}")


COMMANDS: list[click.Command] = []
