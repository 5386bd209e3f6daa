"""``cxrground synth`` and ``cxrground synth-info``: the built-in synthetic cohort (test data)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cxrground.datasets.synthetic import SynthConfig, format_summary, summarize, write_cohort
from cxrground.errors import ConfigError


@click.command("synth")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write the cohort to (created if missing).")
@click.option("--studies", "n_studies", default=24, show_default=True, type=click.IntRange(min=0),
              help="Number of studies (indices 0..N-1).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Cohort seed.")
@click.option("--format", "fmt", default="jpg", show_default=True, type=click.Choice(["jpg", "png"]),
              help="Image file format.")
@click.option("--width", default=512, show_default=True, type=click.IntRange(64, 4096),
              help="Image width in pixels; heights vary per study (0.875..1.125 x width).")
@click.option("--overwrite", is_flag=True, help="Regenerate studies that already exist.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def synth(out_dir: Path, n_studies: int, seed: int, fmt: str, width: int, overwrite: bool, quiet: bool) -> None:
    """Generate the synthetic cohort: CXR phantoms, MIMIC-style reports and exact ground truth (TEST DATA)."""
    try:
        config = SynthConfig(width=width, format=fmt)
        summary = write_cohort(out_dir, n_studies, seed=seed, config=config, overwrite=overwrite,
                               progress=not quiet)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"synthetic cohort (TEST DATA) in {summary.out_dir}: {summary.n_studies} studies "
        f"(generated {summary.n_generated}, skipped {summary.n_skipped} existing) in {summary.seconds:.1f} s, "
        f"seed {summary.seed}"
    )
    f = summary.files
    click.echo(f"  files: {f['images']} images, {f['reports']} reports, {f['truth']} truth records, "
               f"{f['anatomy_masks']} anatomy masks, {f['lesion_masks']} lesion masks")
    present = ", ".join(f"{k} {v['present']}" for k, v in summary.lesions.items())
    click.echo(f"  lesions present: {present}")
    out = Path(summary.out_dir)
    for name in ("index.csv", "cohort.json", "README.md", "preview.png"):
        click.echo(f"  {out / name}")


@click.command("synth-info")
@click.argument("cohort_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def synth_info(cohort_dir: Path, as_json: bool) -> None:
    """Per-lesion counts (present, definitive, tentative, unreported, negated), sizes and CTR range."""
    try:
        summary = summarize(cohort_dir)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    head = f"{cohort_dir}: synthetic cohort"
    if summary.get("seed") is not None:
        head += f", seed {summary['seed']}, generator {summary.get('generator_version')}"
    click.echo(head)
    click.echo(format_summary(summary))


COMMANDS = [synth, synth_info]
