"""``cxrground ils``: build an ILS dataset (MIMIC-ILS format) and print its tables."""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.common import (
    DIR,
    EXISTING,
    OUT_FILE,
    exit_if_failed,
    group,
    note,
    request_options,
    strict_option,
    threads_option,
    warn,
)
from cxrground.ils.export import ExportRequest, export_request
from cxrground.ils.gallery import PER_PAGE
from cxrground.ils.request import BuildRequest, build_lines, run_build


@group("ils")
def ils() -> None:
    """Instruction-guided lesion segmentation datasets (ILS.md)."""


@ils.command("build")
@threads_option
@request_options(BuildRequest)
@click.option("--quiet", is_flag=True, help="No progress bars.")
@strict_option("studies", "in OUT/failures.jsonl; studies rejected by QC do not count")
def build(request: BuildRequest, quiet: bool, strict: bool) -> None:
    """Build a MIMIC-ILS-format dataset from images and reports (resumable: rerun to continue; studies whose report
    or image changed since are processed again). Exits 1 when every study failed (the reasons are in
    OUT/failures.jsonl); with --strict, 3 when the build finished but some studies failed (an input that could not
    be used, a report the structurer could not structure, a worker that died; QC rejections are no failure)."""
    from cxrground.ils.build import input_lines

    summary = run_build(request, progress=not quiet, note=note)
    lines = build_lines(summary) + input_lines(summary)
    click.echo("\n".join(line for line in lines if not line.startswith("  error: ")))
    failures = f"{str(request.out).rstrip('/')}/failures.jsonl"  # a local folder or an object-storage URL
    if summary.every_failed:
        raise click.ClickException(f"every study failed; the reasons are in {failures}")
    exit_if_failed(strict, summary.failed, f"the build finished, but {summary.failed} "
                   f"{'study' if summary.failed == 1 else 'studies'} failed (QC rejections not counted)",
                   f"the reasons are in {failures}")


@ils.command("stats")
@click.argument("out", type=EXISTING, metavar="DATASET")
@click.option("--json", "as_json", is_flag=True, help="Counts as JSON instead of the card's tables.")
def stats(out: Path, as_json: bool) -> None:
    """Print the dataset card's tables of a built dataset (or counts of any MIMIC-ILS dataset). DATASET: the
    dataset folder or its JSON file (the card is read from the file's folder)."""
    from cxrground.ils.card import stats_text

    click.echo(stats_text(out, as_json))


@ils.command("quality")
@click.argument("out", type=DIR, metavar="DATASET")
@click.option("--cohort", type=DIR, required=True,
              help="The synthetic cohort the dataset was built from (its truth/ folder is read).")
@click.option("--json", "as_json", is_flag=True, help="The scores as JSON instead of a table.")
def quality(out: Path, cohort: Path, as_json: bool) -> None:
    """Score a dataset built from a synthetic cohort against the cohort's exact truth."""
    from cxrground.ils.quality import quality_text

    click.echo(quality_text(out, cohort, as_json))


@ils.command("gallery")
@click.argument("out", type=EXISTING, metavar="DATASET")
@click.option("--images", type=DIR, required=True,
              help="The image root the dataset's image_path values are relative to.")
@click.option("--html", "html_path", type=OUT_FILE, default=None,
              help="Output page (default gallery.html in the dataset folder).")
@click.option("--limit", type=click.IntRange(1), default=50,
              help="Show at most this many studies (a study that cannot be shown is listed besides).")
@click.option("--split", type=click.Choice(["train", "val", "test", "all"]), default="all", show_default=True,
              help="Show only this split ('all': every split).")
@click.option("--sample", type=int, default=None, metavar="SEED",
              help="Show --limit studies drawn at random (reproducibly for SEED) from the split or from every split, "
                   "instead of the first ones in file order (train first).")
@click.option("--per-page", type=click.IntRange(1), default=PER_PAGE, show_default=True,
              help="Studies a page: more go on further pages beside the first (STEM.p2.html, STEM.p3.html, ...), "
                   "linked to each other (more than 9 pages: the first, the last and two either side of each, every "
                   "page in its index).")
def gallery(out: Path, images: Path, html_path: Path | None, limit: int, split: str, sample: int | None,
            per_page: int) -> None:
    """Write a self-contained HTML page: each film (named by its path under --images) with its lesion masks and all
    instruction-answer pairs, as embedded JPEG thumbnails (about 30 KB a study), with a table of contents and a
    filter by split and finding. More than --per-page studies go on several self-contained pages linked to each
    other, each with its contents, the filter and an index of every page's studies (pages after the last that an
    earlier run wrote are removed). A study whose film, masks or unit record cannot be read is listed in its place
    (and on the first page) and here with the reason; the others are shown. DATASET: the dataset folder or its JSON
    file (masks and unit records are read from the file's folder)."""
    from cxrground.ils.gallery import render_gallery
    from cxrground.ils.schema import dataset_location

    target = html_path or dataset_location(out)[0] / "gallery.html"
    result = render_gallery(out, images, target, limit, None if split == "all" else split, sample=sample,
                            per_page=per_page)
    if result.drawn_from is not None:
        more = f"; drawn at random from {result.drawn_from}"
    else:
        more = ("; the first in file order, and the dataset has more: raise --limit, choose a --split or draw a "
                "--sample" if result.more else "")
    pages = result.pages[1:]
    also = (f" and {len(pages)} more page{'s' if len(pages) > 1 else ''} beside it, {pages[0].name}"
            f"{f' to {pages[-1].name}' if len(pages) > 1 else ''}" if pages else "")
    click.echo(f"wrote {target}{also} ({result.shown} studies" + (f", {per_page} a page" if pages else "")
               + (f", {len(result.failed)} not shown" if result.failed else "") + more + ")")
    if result.removed:
        note(f"removed {len(result.removed)} page{'s' if len(result.removed) > 1 else ''} of an earlier run past the "
             f"last: {', '.join(path.name for path in result.removed)}")
    for key, reason in result.failed:
        warn(f"study {key} not shown: {reason}")


@ils.command("export")
@request_options(ExportRequest)
def export_cmd(request: ExportRequest) -> None:
    """Write the dataset in another format: mimic-ils (same JSON, masks in FRAME), hf, coco or dicom-seg."""
    click.echo(export_request(request))


COMMANDS: list[click.Command] = [ils]
