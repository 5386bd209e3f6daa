"""``cxrground percept`` and its ``build | validate | gallery | export``: make, check, browse, export a benchmark.

The evaluation commands (:mod:`cxrground.cli.percept_eval_cmds`) attach themselves to the same group.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from cxrground.cli.common import (
    DIR,
    OUT_DIR,
    OUT_FILE,
    clean_errors,
    echo_lines,
    group,
    note,
    request_options,
    threads_option,
    warn,
)
from cxrground.percept.candidate_masks import CandidatesRequest
from cxrground.percept.request import BuildRequest, build_lines, run_build


@group("percept")
def percept() -> None:
    """CheXpercept: build, validate and browse the benchmark; evaluate VLMs on it and report."""


@percept.command("build")
@threads_option
@request_options(BuildRequest)
@click.option("--quiet", is_flag=True, help="No progress bars.")
def build(request: BuildRequest, quiet: bool) -> None:
    """Build a CheXpercept benchmark from an ILS dataset (resumable; byte-identical for a seed). An unknown
    --split is an error naming the dataset's splits; a build that finds no candidate warns; a build whose every
    candidate was dropped (e.g. no image found under --images) exits 1 naming the commonest reasons. --out must be
    a new or empty folder, or one holding a build; not the dataset's folder or one inside --images."""
    summary = run_build(request, progress=not quiet)
    click.echo("\n".join(build_lines(summary)))
    for line in summary.warnings:
        warn(f"warning: {line}")
    if summary.cases == 0 and summary.failures:
        raise click.ClickException(f"no case was built: all {summary.failures} candidates were dropped (see "
                                   "the commonest reasons above and failures.jsonl)")


@percept.command("candidates")
@threads_option
@request_options(CandidatesRequest)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@clean_errors(ImportError)
def candidates(request: CandidatesRequest, quiet: bool) -> None:
    """Segment every positive candidate of a build with an ILS model, asked the CheXpercept candidate instruction
    (§2: 'Segment the {target} in the {location}.'), as the predictions JSONL for `percept build --candidates`
    (resumable)."""
    from cxrground.percept.candidate_masks import predict_candidates

    click.echo(predict_candidates(request, progress=not quiet))


@percept.command("validate")
@click.argument("bench", type=DIR)
def validate(bench: Path) -> None:
    """Check a benchmark folder; exit 1 with the list of problems. A folder without MANIFEST.sha256 (the reference
    repository's layout, or one made by hand) is checked without the build records, and a note says so."""
    from cxrground.percept.validate import unreviewed, validate_benchmark

    problems = validate_benchmark(bench, note=note)
    echo_lines(problems)
    if problems:
        note(f"{len(problems)} problem(s) in {bench}")
        sys.exit(1)
    click.echo(f"{bench}: valid")
    if unreviewed(bench):
        warn(f"{bench} was built without expert review (CHEXPERCEPT.md §11): its candidate masks and lesion-free "
             "films were taken as generated; review them (docs: Expert review) before releasing it")


@percept.command("gallery")
@click.argument("bench", type=DIR)
@click.option("--out", "out_html", type=OUT_FILE, required=True, help="HTML page to write.")
@click.option("--embed", is_flag=True, help="Inline the images in the page (base64): a page that works on its own, "
              "e.g. mailed, several times the size of the benchmark's PNGs.")
def gallery(bench: Path, out_html: Path, embed: bool) -> None:
    """Write a static HTML page to browse the benchmark stage by stage. The page links the benchmark's images by
    relative path: move it together with the benchmark folder (a copy of the page alone shows no images), or give
    --embed. An image file the benchmark names but does not hold is shown as missing on the page and listed in a
    warning."""
    from cxrground.percept.gallery import write_gallery

    g = write_gallery(bench, out_html, embed=embed)
    if g.missing:
        warn(f"warning: {len(g.missing)} image(s) of {bench} missing, shown as missing on the page: "
             f"{', '.join(g.missing)}")
    click.echo(f"wrote {out_html} ({g.cases} cases; images "
               + ("embedded" if embed else f"linked relatively to {bench}: move the page together with it") + ")")


@percept.command("export")
@click.argument("bench", type=DIR)
@click.argument("out", type=OUT_DIR)
@click.option("--format", "fmt", type=click.Choice(["reference", "hf", "lmms-eval"]), default="reference",
              help="reference: the reference repository's layout (--layout); hf: Hugging Face Parquet shards + "
                   "dataset card; lmms-eval: an lmms-eval task folder (YAML + utils.py) over the hf export.")
@click.option("--layout", type=click.Choice(["reference"]), default="reference",
              help="reference: the reference repository's chexpercept.json + chexpercept/<key_id>/ stage folders.")
@click.option("--neutral-keys", is_flag=True,
              help="Key the export {lesion}_{case_id}: no folder name reveals an answer (key_ids do).")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in OUT (an OUT holding files is refused "
              "otherwise; one holding files no export of --format writes is always refused).")
@click.option("--shard-rows", type=click.IntRange(1), default=500, help="hf, lmms-eval: rows per Parquet shard.")
@click.option("--arrow", is_flag=True, help="hf: also write arrow/ (datasets.save_to_disk) for load_from_disk.")
@click.option("--task-name", default="chexpercept", show_default=True,
              help="lmms-eval: the task group name (tasks are NAME_none, NAME_implicit, NAME_explicit).")
@click.option("--validate/--no-validate", "validate", default=True,
              help="Check BENCH as `percept validate` does first (it reads every image and hashes every file) and "
                   "refuse the export with the problems listed; --no-validate skips the check. A BENCH without "
                   "MANIFEST.sha256 (not made by percept build) is checked without its build records.")
def export(bench: Path, out: Path, fmt: str, layout: str, neutral_keys: bool, overwrite: bool, shard_rows: int,
           arrow: bool, task_name: str, validate: bool) -> None:
    """Write BENCH to OUT in another layout or format (reference layout, Hugging Face dataset, lmms-eval task).
    OUT must lie outside BENCH."""
    if fmt in ("hf", "lmms-eval"):  # before BENCH is validated (every image read)
        from cxrground.extras import Need, check_needs

        check_needs([Need(f"--format {fmt}", ("datasets",))], f"percept export --format {fmt}")
    if fmt == "hf":
        from cxrground.percept.export_hf import export_hf

        h = export_hf(bench, out, shard_rows=shard_rows, arrow=arrow, validate=validate, overwrite=overwrite)
        echo_lines(h["notes"], err=True)
        click.echo(f"exported {h['cases']} cases to {out} as a Hugging Face dataset (README.md dataset card)")
        return
    if fmt == "lmms-eval":
        from cxrground.percept.lmms_task import export_lmms_task

        t = export_lmms_task(bench, out, name=task_name, shard_rows=shard_rows, validate=validate,
                             overwrite=overwrite)
        echo_lines(t["notes"], err=True)
        click.echo(f"wrote the lmms-eval tasks {', '.join(t['tasks'])} ({t['cases']} cases) to {out}; run with "
                   f"lmms-eval --include_path {shlex.quote(str(out))} --tasks {task_name}")
        return
    from cxrground.percept.export import export_benchmark

    s = export_benchmark(bench, out, layout, neutral_keys=neutral_keys, overwrite=overwrite, validate=validate)
    echo_lines(s.notes, err=True)
    click.echo(f"exported {s.cases} cases ({s.images} images) to {s.out_dir} in the {s.layout} layout")


COMMANDS: list[click.Command] = [percept]
