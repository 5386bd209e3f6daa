"""``cxrground ils``: build an ILS dataset (MIMIC-ILS format) and print its tables."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cxrground.cli.common import DATASET_OPT, DIR, OUT_DIR, OUT_FILE, group, request_options
from cxrground.ils.request import BuildRequest, build_lines, run_build


@group("ils")
def ils() -> None:
    """Instruction-guided lesion segmentation datasets (ILS.md)."""


@ils.command("build")
@request_options(BuildRequest)
@click.option("--quiet", is_flag=True)
def build(request: BuildRequest, quiet: bool) -> None:
    """Build a MIMIC-ILS-format dataset from images and reports (resumable: rerun to continue)."""
    click.echo("\n".join(build_lines(run_build(request, progress=not quiet))))


@ils.command("stats")
@click.argument("out", type=DIR)
@click.option("--json", "as_json", is_flag=True, help="Counts as JSON instead of the card's tables.")
def stats(out: Path, as_json: bool) -> None:
    """Print the dataset card's tables of a built dataset (or counts of any MIMIC-ILS JSON folder)."""
    from cxrground.ils.card import stats_text

    click.echo(stats_text(out, as_json))


@ils.command("quality")
@click.argument("out", type=DIR)
@click.option("--cohort", type=DIR, required=True,
              help="The synthetic cohort the dataset was built from (its truth/ folder is read).")
@click.option("--json", "as_json", is_flag=True)
def quality(out: Path, cohort: Path, as_json: bool) -> None:
    """Score a dataset built from a synthetic cohort against the cohort's exact truth."""
    from cxrground.ils.quality import format_quality, score_against_truth

    scores = score_against_truth(out, cohort)
    click.echo(json.dumps(scores, indent=2) if as_json else format_quality(scores))


@ils.command("gallery")
@click.argument("out", type=DIR)
@click.option("--images", type=DIR, required=True,
              help="The image root the dataset's image_path values are relative to.")
@click.option("--html", "html_path", type=OUT_FILE, default=None, help="Output page (default OUT/gallery.html).")
@click.option("--limit", type=int, default=50)
@click.option("--split", type=click.Choice(["train", "val", "test"]), default=None)
def gallery(out: Path, images: Path, html_path: Path | None, limit: int, split: str | None) -> None:
    """Write a self-contained HTML page: images with their lesion masks and all instruction-answer pairs."""
    from cxrground.ils.gallery import render_gallery

    target = html_path or out / "gallery.html"
    n = render_gallery(out, images, target, limit, split)
    click.echo(f"wrote {target} ({n} studies)")


@ils.command("export")
@click.option("--frame", type=click.Choice(["released", "native"]), default="released",
              help="released: 512x512 masks, the whole image stretched to the square (MIMIC-ILS as published, "
                   "what the ROSALIA code trains on); native: each image's own size.")
@DATASET_OPT
@click.option("--out", type=OUT_DIR, required=True, help="Folder to write.")
@click.option("--size", type=int, default=512, help="Side of the released-frame masks.")
@click.option("--images", type=DIR, default=None,
              help="Image root, for native sizes the dataset does not record (e.g. a downloaded MIMIC-ILS).")
def export_cmd(frame: str, dataset: Path, out: Path, size: int, images: Path | None) -> None:
    """Write the dataset (same JSON) with its masks in FRAME, the frame recorded in mask_frame.json and card.md."""
    from cxrground.ils.frames import export_dataset
    from cxrground.io.image import read_image

    sizes = None if images is None else (lambda rel: read_image(images / rel).shape)
    counts = export_dataset(dataset, out, frame=frame, size=size, image_size=sizes)
    click.echo(f"{out}: {counts['masks']} masks in the {frame} frame, {counts['studies']} studies "
               f"({counts['native_sizes']} native sizes recorded)")


COMMANDS: list[click.Command] = [ils]
