"""Data commands: the synthetic cohort (``synth``, ``synth-info``), the shared pack and a user's own folders."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cxrground.cli.common import DIR, FILE, OUT_DIR, clean_errors, group
from cxrground.datasets.folder import scan_folder, scan_lines
from cxrground.datasets.pack import Pack
from cxrground.datasets.synthetic import SynthConfig, format_summary, summarize, write_cohort


@click.command("synth")
@click.option("--out", "out_dir", required=True, type=OUT_DIR,
              help="Folder to write the cohort to (created if missing).")
@click.option("--studies", "n_studies", default=24, type=click.IntRange(min=0),
              help="Number of studies (indices 0..N-1).")
@click.option("--seed", default=0, type=click.IntRange(min=0), help="Cohort seed.")
@click.option("--format", "fmt", default="jpg", type=click.Choice(["jpg", "png"]), help="Image file format.")
@click.option("--width", default=512, type=click.IntRange(64, 4096),
              help="Image width in pixels; heights vary per study (0.875..1.125 x width).")
@click.option("--overwrite", is_flag=True, help="Regenerate studies that already exist.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def synth(out_dir: Path, n_studies: int, seed: int, fmt: str, width: int, overwrite: bool, quiet: bool) -> None:
    """Generate the synthetic cohort: CXR phantoms, MIMIC-style reports and exact ground truth (TEST DATA)."""
    summary = write_cohort(out_dir, n_studies, seed=seed, config=SynthConfig(width=width, format=fmt),
                           overwrite=overwrite, progress=not quiet)
    click.echo("\n".join(summary.describe()))


@click.command("synth-info")
@click.argument("cohort_dir", type=DIR)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@clean_errors(FileNotFoundError)
def synth_info(cohort_dir: Path, as_json: bool) -> None:
    """Per-lesion counts (present, definitive, tentative, unreported, negated), sizes and CTR range."""
    summary = summarize(cohort_dir)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(format_summary(summary, cohort_dir))


@group("pack")
def pack() -> None:
    """The shared real-data pack cxr-pack-v1 (read in place, never copied)."""


@pack.command("info")
@click.option("--path", "path", type=click.Path(path_type=Path), default=None,
              help="Pack folder (default: $CXRGROUND_PACK or ../shared/data/cxr-pack-v1).")
@click.option("--verify", is_flag=True, help="Also check every file against MANIFEST.sha256.")
def pack_info(path: Path | None, verify: bool) -> None:
    """Print what the pack holds: images, masks, labels, licences, reports."""
    p = Pack(path)
    click.echo("\n".join(p.describe()))
    if verify:
        bad = p.verify()
        click.echo("manifest: OK" if not bad else f"manifest: {len(bad)} files differ: {', '.join(bad[:10])}")
        if bad:
            raise SystemExit(1)


@click.command("scan")
@click.option("--images", type=DIR, required=True)
@click.option("--reports", type=DIR, default=None)
@click.option("--index", type=FILE, default=None,
              help="CSV/JSONL with image, study_id and report_path or report columns.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line per study and per failure.")
def scan(images: Path, reports: Path | None, index: Path | None, as_json: bool) -> None:
    """List the studies (image + report) found in a folder and every file that could not be used."""
    for line in scan_lines(*scan_folder(images, reports, index), as_json=as_json):
        click.echo(line)


COMMANDS: list[click.Command] = [synth, synth_info, pack, scan]
