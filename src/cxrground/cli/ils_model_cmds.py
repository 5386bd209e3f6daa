"""``cxrground ils train | predict | evaluate | convert-lisa``: ILS models, their predictions and scores (§15).

The commands attach themselves to the ``ils`` group of :mod:`cxrground.cli.ils_cmds`. Backends come from
:data:`cxrground.models.base.MODELS`; ``torch``/``transformers`` are imported only when a command runs.
"""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.cli.common import (
    DATASET_OPT,
    DIR,
    OUT_DIR,
    backend_option,
    clean_errors,
    kv,
    request_options,
    threads_option,
)
from cxrground.cli.ils_cmds import ils
from cxrground.evaluation.ils.request import EvaluateRequest, evaluate_request
from cxrground.models.base import MODELS
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
@click.option("--seed", type=int, default=0)
@click.option("--set", "settings", multiple=True, help="KEY=VALUE configuration override (repeatable), "
              "e.g. --set epochs=30 --set size=160.")
@click.option("--split", default="train", help="Split to train on.")
@click.option("--val-split", default="val", help="Split for model selection ('' = none).")
@click.option("--no-resume", is_flag=True, help="Start from scratch even if --out holds a checkpoint.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@clean_errors(ImportError)
def train_cmd(model: str, dataset: Path, images: Path | None, out: Path, seed: int, settings: tuple[str, ...],
              split: str, val_split: str, no_resume: bool, quiet: bool) -> None:
    """Train an ILS model (resumable: rerun the same command to continue after a kill).

    LISA on several GPUs (data-parallel, one process per GPU): torchrun --nproc_per_node N -m cxrground ils train
    --model lisa ..., or accelerate launch --config_file accelerate_ddp.json -m cxrground ils train ...
    (docs/guides/ils-model.md).
    """
    from cxrground.models.base import train_model

    path = train_model(model, dataset, out, images=images, seed=seed, overrides=kv(settings) or None,
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


@ils.command("evaluate")
@request_options(EvaluateRequest)
def evaluate(request: EvaluateRequest) -> None:
    """Score predictions: gIoU, cIoU, N-Acc, Dice and text accuracy, printed as Markdown."""
    click.echo(evaluate_request(request, log=lambda m: click.echo(m, err=True)))


ils.add_command(predict_cmd)

COMMANDS: list[click.Command] = []
