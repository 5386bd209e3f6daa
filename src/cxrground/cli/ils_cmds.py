"""``cxrground ils``: build an ILS dataset (MIMIC-ILS format) and print its tables."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cxrground.anatomy.segment import SEGMENTERS
from cxrground.cli.common import DATASET_OPT, DIR, EXISTING, FILE, OUT_DIR, OUT_FILE, backend_options, group, kv
from cxrground.errors import ConfigError
from cxrground.ils.spatial import DETECTORS, SYNTHESIZERS
from cxrground.io.image import DEFAULT_MAX_PIXELS
from cxrground.reports.model import DEFAULT_SECTION_POLICY, SECTION_POLICIES
from cxrground.reports.structure import STRUCTURERS, structurer_options
from cxrground.reports.structure.rules import ALTERNATIVE_POLICIES


@group("ils")
def ils() -> None:
    """Instruction-guided lesion segmentation datasets (ILS.md)."""


@ils.command("build")
@click.option("--images", type=DIR, required=True,
              help="Image folder (MIMIC-CXR-JPG files/ layout, or flat with --index).")
@click.option("--reports", type=EXISTING, default=None,
              help="Report folder (MIMIC-CXR layout) or a JSONL/CSV table with study_id and report columns. "
                   "Default: reports beside the study folders.")
@click.option("--index", type=FILE, default=None,
              help="CSV/JSONL index for a flat folder: image, study_id, report_path or report.")
@click.option("--out", type=OUT_DIR, required=True)
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local")
@click.option("--workers", type=int, default=1)
@click.option("--structurer", type=click.Choice(list(STRUCTURERS)), default="rules")
@click.option("--structurer-opt", multiple=True, callback=lambda _c, _p, v: kv(v), help="KEY=VALUE for the "
              "structurer (llm: base_url, model, api_key_env, cache, concurrency).")
@click.option("--sections", type=click.Choice(SECTION_POLICIES), default=DEFAULT_SECTION_POLICY,
              help="Report section policy: findings (ILS §6: findings, else impression), impression (impression "
                   "first), findings+impression (both, numbered on; repeats counted once).")
@click.option("--alternatives", type=click.Choice(ALTERNATIVE_POLICIES), default=None,
              help="Rule structurer: 'atelectasis or scarring' is uncertain (default, ILS.md §7.1) or present.")
@backend_options("segmenter", SEGMENTERS, "unet", opt_help=", e.g. weights=PATH")
@backend_options("qc-segmenter", SEGMENTERS, None, "Second segmenter for the §6 cross-check (e.g. cxas with "
                 "--segmenter hybridgnet); studies whose lung borders or heart bottom disagree by > 5 % are dropped. ")
@backend_options("synthesizer", SYNTHESIZERS, "pseudo-normal")
@backend_options("detector", DETECTORS, "anomaly")
@click.option("--split-file", type=FILE, default=None,
              help="CSV with study_id,split (e.g. mimic-cxr-2.0.0-split.csv). Default: by subject hash.")
@click.option("--split-ratios", default="0.8,0.1,0.1")
@click.option("--exclude", type=FILE, default=None,
              help="File with one study id per line to leave out (e.g. MS-CXR studies).")
@click.option("--threshold-scale", type=float, default=1.0,
              help="Multiply every Table 7 threshold (0.5 = the paper's half-τ setting).")
@click.option("--limit", type=int, default=None, help="Process only the first N studies (by study id).")
@click.option("--seed", type=int, default=0)
@click.option("--overwrite", is_flag=True, help="Discard a previous build in OUT made with other settings.")
@click.option("--max-pixels", type=click.IntRange(min=1), default=DEFAULT_MAX_PIXELS, show_default=True,
              help="Images whose header states more pixels are recorded as failures without being decoded.")
@click.option("--quiet", is_flag=True)
def build(images: Path, reports: Path | None, index: Path | None, out: Path, engine: str, workers: int,
          structurer: str, structurer_opt: dict[str, str], sections: str, alternatives: str | None,
          segmenter: str, segmenter_opt: dict[str, str], qc_segmenter: str | None, qc_segmenter_opt: dict[str, str],
          synthesizer: str, synthesizer_opt: dict[str, str], detector: str, detector_opt: dict[str, str],
          split_file: Path | None, split_ratios: str, exclude: Path | None, threshold_scale: float,
          limit: int | None, seed: int, overwrite: bool, max_pixels: int, quiet: bool) -> None:
    """Build a MIMIC-ILS-format dataset from images and reports (resumable: rerun to continue)."""
    from cxrground.datasets.synthetic import cohort_of_images
    from cxrground.ils.build import BackendSpec, build_dataset, check_backends
    from cxrground.ils.config import IlsConfig
    from cxrground.ils.tasks import build_tasks

    excluded = tuple(line.strip() for line in exclude.read_text().splitlines() if line.strip()) if exclude else ()
    ratios = tuple(float(v) for v in split_ratios.split(","))
    config = IlsConfig(seed=seed, exclude_studies=excluded, sections=sections)
    if threshold_scale != 1.0:
        config = config.with_threshold_scale(threshold_scale)
    try:
        structurer_opt.update(structurer_options(structurer, {"alternatives": alternatives}))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    spec = BackendSpec(structurer, structurer_opt, segmenter, segmenter_opt, synthesizer, synthesizer_opt, detector,
                       detector_opt, qc_segmenter, qc_segmenter_opt)
    check_backends(spec)  # before scanning a large folder
    tasks, failures = build_tasks(images, reports, index, split_file, ratios, excluded, limit)
    if not tasks:
        raise click.ClickException(f"no studies found under {images} ({len(failures)} inputs failed)")
    summary = build_dataset(tasks, out, config, spec, engine, workers, failures, overwrite, not quiet,
                            cohort_of_images(images), max_pixels=max_pixels)
    click.echo(f"ILS dataset in {summary.out_dir}: {summary.studies_in_dataset} studies, {summary.pairs} pairs "
               f"({summary.processed} processed, {summary.skipped} already done, {summary.failures} failures) "
               f"in {summary.seconds:.1f} s")
    click.echo(f"  card: {out / 'card.md'}   failures: {out / 'failures.jsonl'}")


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
