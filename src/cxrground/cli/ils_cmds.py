"""``cxrground ils``: build an ILS dataset (MIMIC-ILS format) and print its tables."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cxrground.errors import CXRGroundError


@click.group("ils")
def ils() -> None:
    """Instruction-guided lesion segmentation datasets (ILS.md)."""


def _kv(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


@ils.command("build")
@click.option("--images", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True,
              help="Image folder (MIMIC-CXR-JPG files/ layout, or flat with --index).")
@click.option("--reports", type=click.Path(path_type=Path, exists=True), default=None,
              help="Report folder (MIMIC-CXR layout) or a JSONL/CSV table with study_id and report columns. "
                   "Default: reports beside the study folders.")
@click.option("--index", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="CSV/JSONL index for a flat folder: image, study_id, report_path or report.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), required=True)
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--workers", type=int, default=1, show_default=True)
@click.option("--structurer", type=click.Choice(["rules", "llm"]), default="rules", show_default=True)
@click.option("--structurer-opt", multiple=True, help="KEY=VALUE for the structurer (llm: base_url, model, "
              "api_key_env, cache_path, concurrency).")
@click.option("--segmenter", default="unet", show_default=True, help="unet | given | cxas | hybridgnet")
@click.option("--segmenter-opt", multiple=True, help="KEY=VALUE for the segmenter (e.g. weights=PATH).")
@click.option("--qc-segmenter", default=None, help="Second segmenter for the §6 cross-check (e.g. cxas with "
              "--segmenter hybridgnet); studies whose lung borders or heart bottom disagree by > 5 % are dropped.")
@click.option("--qc-segmenter-opt", multiple=True)
@click.option("--synthesizer", default="normative", show_default=True, help="normative | pseudo-normal | radedit")
@click.option("--synthesizer-opt", multiple=True)
@click.option("--detector", default="anomaly", show_default=True, help="anomaly | yolo")
@click.option("--detector-opt", multiple=True)
@click.option("--split-file", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="CSV with study_id,split (e.g. mimic-cxr-2.0.0-split.csv). Default: by subject hash.")
@click.option("--split-ratios", default="0.8,0.1,0.1", show_default=True)
@click.option("--exclude", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="File with one study id per line to leave out (e.g. MS-CXR studies).")
@click.option("--threshold-scale", type=float, default=1.0, show_default=True,
              help="Multiply every Table 7 threshold (0.5 = the paper's half-τ setting).")
@click.option("--limit", type=int, default=None, help="Process only the first N studies (by study id).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--overwrite", is_flag=True, help="Discard a previous build in OUT made with other settings.")
@click.option("--quiet", is_flag=True)
def build(images: Path, reports: Path | None, index: Path | None, out: Path, engine: str, workers: int,
          structurer: str, structurer_opt: tuple[str, ...], segmenter: str, segmenter_opt: tuple[str, ...],
          qc_segmenter: str | None, qc_segmenter_opt: tuple[str, ...], synthesizer: str,
          synthesizer_opt: tuple[str, ...], detector: str, detector_opt: tuple[str, ...],
          split_file: Path | None, split_ratios: str, exclude: Path | None, threshold_scale: float,
          limit: int | None, seed: int, overwrite: bool, quiet: bool) -> None:
    """Build a MIMIC-ILS-format dataset from images and reports (resumable: rerun to continue)."""
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.config import IlsConfig
    from cxrground.ils.tasks import build_tasks

    try:
        excluded = tuple(line.strip() for line in exclude.read_text().splitlines() if line.strip()) if exclude else ()
        ratios = tuple(float(v) for v in split_ratios.split(","))
        config = IlsConfig(seed=seed, exclude_studies=excluded)
        if threshold_scale != 1.0:
            config = config.with_threshold_scale(threshold_scale)
        spec = BackendSpec(structurer, _kv(structurer_opt), segmenter, _kv(segmenter_opt), synthesizer,
                           _kv(synthesizer_opt), detector, _kv(detector_opt), qc_segmenter, _kv(qc_segmenter_opt))
        tasks, failures = build_tasks(images, reports, index, split_file, ratios, excluded, limit)
        if not tasks:
            raise click.ClickException(f"no studies found under {images} ({len(failures)} inputs failed)")
        cohort = images.parent if (images.parent / "truth").is_dir() and (images.parent / "cohort.json").is_file() \
            else None
        summary = build_dataset(tasks, out, config, spec, engine, workers, failures, overwrite, not quiet, cohort)
    except CXRGroundError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"ILS dataset in {summary.out_dir}: {summary.studies_in_dataset} studies, {summary.pairs} pairs "
               f"({summary.processed} processed, {summary.skipped} already done, {summary.failures} failures) "
               f"in {summary.seconds:.1f} s")
    click.echo(f"  card: {out / 'card.md'}   failures: {out / 'failures.jsonl'}")


@ils.command("stats")
@click.argument("out", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Counts as JSON instead of the card's tables.")
def stats(out: Path, as_json: bool) -> None:
    """Print the dataset card's tables of a built dataset (or counts of any MIMIC-ILS JSON folder)."""
    from cxrground.ils.build import DATASET_FILE
    from cxrground.ils.card import count_table
    from cxrground.ils.schema import SPLITS, load_dataset

    data = load_dataset(out / DATASET_FILE)
    if as_json:
        click.echo(json.dumps({s: count_table(data.get(s, {})) for s in SPLITS}, indent=2))
        return
    card = out / "card.md"
    if card.is_file():
        text = card.read_text(encoding="utf-8")
        click.echo(text.split("## Backends and settings")[0].rstrip())
        return
    for split in SPLITS:
        table = count_table(data.get(split, {}))
        click.echo(f"{split}: {table['total']['#IA']} pairs")


@ils.command("quality")
@click.argument("out", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--cohort", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True,
              help="The synthetic cohort the dataset was built from (its truth/ folder is read).")
@click.option("--json", "as_json", is_flag=True)
def quality(out: Path, cohort: Path, as_json: bool) -> None:
    """Score a dataset built from a synthetic cohort against the cohort's exact truth."""
    from cxrground.ils.quality import format_quality, score_against_truth

    scores = score_against_truth(out, cohort)
    click.echo(json.dumps(scores, indent=2) if as_json else format_quality(scores))


@ils.command("gallery")
@click.argument("out", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--images", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True,
              help="The image root the dataset's image_path values are relative to.")
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Output page (default OUT/gallery.html).")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--split", type=click.Choice(["train", "val", "test"]), default=None)
def gallery(out: Path, images: Path, html_path: Path | None, limit: int, split: str | None) -> None:
    """Write a self-contained HTML page: images with their lesion masks and all instruction-answer pairs."""
    from cxrground.ils.gallery import render_gallery

    target = html_path or out / "gallery.html"
    try:
        n = render_gallery(out, images, target, limit, split)
    except CXRGroundError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {target} ({n} studies)")


COMMANDS: list[click.Command] = [ils]
