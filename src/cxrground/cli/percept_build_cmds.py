"""``cxrground percept`` and its ``build | validate | gallery | export``: make, check, browse, export a benchmark.

The evaluation commands (:mod:`cxrground.cli.percept_eval_cmds`) attach themselves to the same group.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cxrground.cli.common import DIR, EXISTING, FILE, OUT_DIR, OUT_FILE, backend_option, group
from cxrground.percept.deform import DEFORMERS


@group("percept")
def percept() -> None:
    """CheXpercept: build, validate and browse the benchmark; evaluate VLMs on it and report."""


def _per_lesion(value: str) -> tuple[int, int, int]:
    try:
        parts = tuple(int(v) for v in value.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or min(parts) < 0:
        raise click.BadParameter(f"expected LF,RF,RR (three non-negative integers), got {value!r}")
    return parts  # type: ignore[return-value]


@percept.command("build")
@click.option("--ils", "ils_dir", type=EXISTING, required=True,
              help="ILS dataset folder (mimic_ils_instruction_answer.json, lesion_mask/, anatomy.jsonl) or the JSON.")
@click.option("--images", type=DIR, required=True, help="Image root the dataset's image_path values are relative to.")
@click.option("--out", type=OUT_DIR, required=True, help="Benchmark folder.")
@click.option("--candidates", type=FILE, default=None,
              help="ILS-model predictions JSONL (pair_id → mask); default: the dataset's own masks.")
@click.option("--review", type=FILE, default=None,
              help="Expert decisions CSV: key_id,decision,reviewer with decision accept|reject.")
@click.option("--per-lesion", default="100,100,100", help="Cases per lesion: LF,RF,RR.")
@click.option("--rf-ratio", type=float, default=0.5,
              help="Share of deformation-successful positives that become revision-free.")
@backend_option("--deformer", DEFORMERS, "builtin")
@click.option("--sam-model", type=DIR, default=None,
              help="Local SAM checkpoint folder (transformers SamModel) for --deformer sam.")
@click.option("--anatomy", type=EXISTING, default=None,
              help="Anatomy masks: a JSONL in the anatomy.jsonl format, or a folder of {study|dicom_id|image stem}"
                   "_right_lung.png / _left_lung.png (/ _heart.png). Default: the ILS folder's anatomy.jsonl.")
@click.option("--split", "splits", default="train", help="Source split(s), comma-separated (train,val,test) or 'all'.")
@click.option("--seed", type=int, default=0)
@click.option("--workers", type=int, default=1)
@click.option("--max-candidates", type=int, default=3000,
              help="Positive candidates per lesion (global positives first, §11).")
@click.option("--max-negatives", type=int, default=100,
              help="Negative candidates per lesion (first N global negatives in JSON order).")
@click.option("--exclude-positive-cxrs", is_flag=True, help="Never use a CXR of a positive candidate as a negative.")
@click.option("--strict-negatives", is_flag=True,
              help="Location distractors must cover ≤ 0.05 of their sub-region (§9.4).")
@click.option("--overwrite", is_flag=True, help="Replace a build made with other settings in --out.")
@click.option("--keep-work", is_flag=True, help="Keep the resumption cache BENCH/.work after a complete build.")
def build(ils_dir: Path, images: Path, out: Path, candidates: Path | None, review: Path | None, per_lesion: str,
          rf_ratio: float, deformer: str, sam_model: Path | None, anatomy: Path | None, splits: str, seed: int,
          workers: int, max_candidates: int, max_negatives: int, exclude_positive_cxrs: bool,
          strict_negatives: bool, overwrite: bool, keep_work: bool) -> None:
    """Build a CheXpercept benchmark from an ILS dataset (resumable; byte-identical for a seed)."""
    from cxrground.percept.build import BuildOptions, build_benchmark

    chosen = ("train", "val", "test") if splits == "all" else tuple(s.strip() for s in splits.split(","))
    opts = BuildOptions(ils=str(ils_dir), images=str(images), candidates=str(candidates) if candidates else None,
                        review=str(review) if review else None, per_lesion=_per_lesion(per_lesion),
                        rf_ratio=rf_ratio, deformer=deformer, sam_model=str(sam_model) if sam_model else None,
                        anatomy=str(anatomy) if anatomy else None, splits=chosen, seed=seed,
                        max_candidates=max_candidates, max_negatives=max_negatives,
                        exclude_positive_cxrs=exclude_positive_cxrs,
                        strict_negatives=strict_negatives)
    s = build_benchmark(opts, out, workers=workers, overwrite=overwrite, keep_work=keep_work)
    click.echo(f"CheXpercept benchmark in {s.out_dir}: {s.cases} cases, {s.items} items "
               f"({s.planned} positives planned, {s.reused} reused, {s.failures} dropped) in {s.seconds} s")
    click.echo(f"  card: {Path(s.out_dir) / 'card.md'}   failures: {Path(s.out_dir) / 'failures.jsonl'}")


@percept.command("validate")
@click.argument("bench", type=DIR)
def validate(bench: Path) -> None:
    """Check a benchmark folder; exit 1 with the list of problems."""
    from cxrground.percept.validate import validate_benchmark

    problems = validate_benchmark(bench)
    if problems:
        for p in problems:
            click.echo(p)
        click.echo(f"{len(problems)} problem(s) in {bench}", err=True)
        sys.exit(1)
    click.echo(f"{bench}: valid")


@percept.command("gallery")
@click.argument("bench", type=DIR)
@click.option("--out", "out_html", type=OUT_FILE, required=True)
def gallery(bench: Path, out_html: Path) -> None:
    """Write a static HTML page to browse the benchmark stage by stage."""
    from cxrground.percept.gallery import render_gallery

    n = render_gallery(bench, out_html)
    click.echo(f"wrote {out_html} ({n} cases)")


@percept.command("export")
@click.argument("bench", type=DIR)
@click.argument("out", type=OUT_DIR)
@click.option("--layout", type=click.Choice(["reference"]), default="reference",
              help="reference: the reference repository's chexpercept.json + chexpercept/<key_id>/ stage folders.")
@click.option("--neutral-keys", is_flag=True,
              help="Key the export {lesion}_{case_id}: no folder name reveals an answer (key_ids do).")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in OUT.")
def export(bench: Path, out: Path, layout: str, neutral_keys: bool, overwrite: bool) -> None:
    """Write BENCH to OUT in another folder layout (images copied, JSON paths rewritten)."""
    from cxrground.percept.export import export_benchmark

    s = export_benchmark(bench, out, layout, neutral_keys=neutral_keys, overwrite=overwrite)
    click.echo(f"exported {s.cases} cases ({s.images} images) to {s.out_dir} in the {s.layout} layout")

COMMANDS: list[click.Command] = [percept]
