"""``cxrground ils evaluate``: score model predictions on an ILS split (ILS.md §15).

The command is added to the ``ils`` group at import time; ``COMMANDS`` is empty because the group
itself is registered by :mod:`cxrground.cli.ils_cmds`.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from cxrground.cli.ils_cmds import ils
from cxrground.errors import CXRGroundError


@click.command("evaluate")
@click.option("--dataset", type=click.Path(path_type=Path, exists=True), required=True,
              help="Dataset folder (mimic_ils_instruction_answer.json + lesion_mask/) or the JSON file.")
@click.option("--predictions", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True,
              help="Predictions JSONL: {pair_id, answer, mask (COCO RLE) | mask_path (PNG)} per line.")
@click.option("--split", type=click.Choice(["train", "val", "test"]), default="test", show_default=True)
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write the full result as JSON here.")
@click.option("--images", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="Image root (MIMIC-CXR-JPG files/) to read native sizes; GT masks of another size "
                   "(e.g. released 512x512) are resized nearest-neighbour to it.")
@click.option("--bootstrap", "n_boot", type=int, default=1000, show_default=True,
              help="Bootstrap resamples for the 95 % CIs (0 = none).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--limit", type=int, default=None, help="Score only the first N pairs (default: the full split).")
@click.option("--seg-mode", default="unspecified", show_default=True,
              help="How the masks were produced, stated in the report (teacher-forced | free); default: the mode "
                   "the predictions file records (ils predict --mode).")
def evaluate(dataset: Path, predictions: Path, split: str, out: Path | None, images: Path | None, n_boot: int,
             seed: int, limit: int | None, seg_mode: str) -> None:
    """Score predictions: gIoU, cIoU, N-Acc, Dice and text accuracy, printed as Markdown."""
    from cxrground.evaluation.ils_metrics import evaluate_dataset, format_report

    try:
        result = evaluate_dataset(dataset, predictions, split=split, limit=limit, n_boot=n_boot, seed=seed,
                                  images_root=images, seg_mode=seg_mode, log=lambda m: click.echo(m, err=True))
    except CXRGroundError as exc:
        raise click.ClickException(str(exc)) from exc
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2), encoding="utf-8")
        click.echo(f"wrote {out}", err=True)
    click.echo(format_report(result))


ils.add_command(evaluate)

COMMANDS: list[click.Command] = []
