"""``cxrground ils train | predict | evaluate | convert-lisa | export-lisa``: ILS models, their predictions and
scores (§15).

The commands attach themselves to the ``ils`` group of :mod:`cxrground.cli.ils_cmds`. Backends come from
:data:`cxrground.models.base.MODELS`; ``torch``/``transformers`` are imported only when a command runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from cxrground.cli.common import (
    DATASET_OPT,
    DIR,
    OUT_DIR,
    backend_option,
    clean_errors,
    kv,
    note,
    request_options,
    threads_option,
)
from cxrground.cli.ils_cmds import ils
from cxrground.errors import OptionValueError
from cxrground.evaluation.ils.request import EvaluateRequest
from cxrground.models.base import MODELS
from cxrground.models.lisa.export import ExportRequest, export_request
from cxrground.models.lisa.request import ConvertRequest, convert_request
from cxrground.models.predict import PredictRequest, predict_request

__all__ = ["COMMANDS"]


@ils.command("train")
@backend_option("--model", MODELS, "baseline", "Model backend. ")
@DATASET_OPT
@click.option("--images", type=DIR, default=None,
              help="Image root the pairs' image_path is relative to (MIMIC-CXR-JPG files/). "
                   "Default: the dataset folder.")
@click.option("--out", type=OUT_DIR, required=True, help="Checkpoint folder.")
@click.option("--seed", type=click.IntRange(0), default=0, help="Seed of the initial weights and the batch order.")
@click.option("--set", "settings", multiple=True, help="KEY=VALUE configuration override (repeatable), "
              "e.g. --set epochs=30 --set size=160.")
@click.option("--split", default="train", help="Split to train on.")
@click.option("--val-split", default="val", help="Split for model selection ('' = none).")
@click.option("--no-resume", is_flag=True, help="Start from scratch even if --out holds a checkpoint.")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="torch threads of the training process (the same as --set threads=N; default: the model's "
                   "configuration, 2 for the baseline). Part of the configuration: results are deterministic for a "
                   "seed and thread count.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@clean_errors(ImportError)
def train_cmd(model: str, dataset: Path, images: Path | None, out: Path, seed: int, settings: tuple[str, ...],
              split: str, val_split: str, no_resume: bool, threads: int | None, quiet: bool) -> None:
    """Train an ILS model (resumable: rerun the same command to continue after a kill).

    LISA on several GPUs (data-parallel, one process per GPU): torchrun --nproc_per_node N -m cxrground ils train
    --model lisa ..., or accelerate launch --config_file accelerate_ddp.json -m cxrground ils train ...
    (docs/guides/ils-model.md).
    """
    from cxrground.models.base import train_model

    overrides = kv(settings)
    if threads is not None:
        if overrides.get("threads", str(threads)) != str(threads):
            raise OptionValueError(f"--threads {threads} and --set threads={overrides['threads']} disagree")
        overrides["threads"] = str(threads)
    path = train_model(model, dataset, out, images=images, seed=seed, overrides=overrides or None,
                       resume=not no_resume, split=split, val_split=val_split or None, progress=not quiet)
    click.echo(f"checkpoint: {path}")


@click.command("predict")
@threads_option
@request_options(PredictRequest)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@clean_errors(ImportError)
def predict_cmd(request: PredictRequest, quiet: bool) -> None:
    """Answer every pair of a split with a trained model, as predictions JSONL for ``ils evaluate``."""
    click.echo(predict_request(request, progress=not quiet))


@ils.command("convert-lisa")
@threads_option
@request_options(ConvertRequest)
def convert_lisa(request: ConvertRequest) -> None:
    """Map every weight of a released LISA/ROSALIA checkpoint onto the cxrground LISA model and save it."""
    click.echo(f"wrote {convert_request(request)}")


@ils.command("export-lisa")
@threads_option
@request_options(ExportRequest)
def export_lisa(request: ExportRequest) -> None:
    """Write a cxrground LISA checkpoint in the released LISA/ROSALIA layout (the reverse of convert-lisa), for the
    reference code's LISAForCausalLM.from_pretrained."""
    click.echo(f"wrote {export_request(request, log=note)}")


@ils.command("evaluate")
@request_options(EvaluateRequest)
def evaluate(request: EvaluateRequest) -> None:
    """Score predictions: gIoU, cIoU, N-Acc, Dice and text accuracy, printed as Markdown."""
    from cxrground.evaluation.ils.dataset import evaluate_dataset
    from cxrground.evaluation.ils.report import format_report

    r = request
    if r.limit is not None and r.limit < 1:
        raise OptionValueError(f"--limit must be at least 1, got {r.limit}")
    result = evaluate_dataset(r.dataset, r.predictions, split=r.split, limit=r.limit, n_boot=r.n_boot, seed=r.seed,
                              images_root=r.images, seg_mode=r.seg_mode, log=note)
    if r.out is not None:
        r.out.parent.mkdir(parents=True, exist_ok=True)
        r.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
        note(f"wrote {r.out}")
    if result["n_predictions_unused"]:
        note(_unused_line(r, result))
    click.echo(format_report(result))


def _unused_line(request: EvaluateRequest, result: dict[str, Any]) -> str:
    """How many predictions were not scored, and why (:func:`~cxrground.evaluation.ils.dataset.unused_why`)."""
    from cxrground.evaluation.ils.dataset import unused_why
    from cxrground.ils.predictions import load_predictions

    why = unused_why(request.dataset, list(load_predictions(request.predictions)), request.split, result["n_pairs"])
    return (f"note: {result['n_predictions_unused']} predictions of {request.predictions} not used (split "
            f"{request.split}){'; ' if why.startswith('why could not') else ': '}{why}")


ils.add_command(predict_cmd)

COMMANDS: list[click.Command] = []
