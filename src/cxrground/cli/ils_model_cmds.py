"""``cxrground ils train | predict | evaluate | convert-lisa``: ILS models, their predictions and scores (§15).

The commands attach themselves to the ``ils`` group of :mod:`cxrground.cli.ils_cmds`. Backends come from
:data:`cxrground.models.base.MODELS`; ``torch``/``transformers`` are imported only when a command runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from cxrground.cli.common import DATASET_OPT, DIR, EXISTING, FILE, OUT_DIR, OUT_FILE, backend_option, clean_errors, kv
from cxrground.cli.ils_cmds import ils
from cxrground.io.image import DEFAULT_MAX_PIXELS
from cxrground.models.base import MODELS

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
    --model lisa ..., or accelerate launch --config_file accelerate_ddp.json -m cxrground ils train ... (README).
    """
    from cxrground.models.base import train_model

    path = train_model(model, dataset, out, images=images, seed=seed, overrides=kv(settings) or None,
                       resume=not no_resume, split=split, val_split=val_split or None, progress=not quiet)
    click.echo(f"checkpoint: {path}")


@click.command("predict")
@click.option("--checkpoint", type=EXISTING, required=True,
              help="Checkpoint folder (checkpoint.json names the backend).")
@click.option("--dataset", type=EXISTING, required=True, help="ILS dataset folder or its JSON file.")
@click.option("--images", type=DIR, default=None,
              help="Image root (MIMIC-CXR-JPG files/). Default: the dataset folder.")
@click.option("--split", type=click.Choice(["train", "val", "test"]), default="test")
@click.option("--out", type=OUT_FILE, required=True,
              help="Predictions JSONL (appended to; pairs already there are skipped).")
@click.option("--limit", type=int, default=None, help="Predict only the first N pairs of the split.")
@click.option("--batch-size", type=int, default=8, help="Pairs per forward pass.")
@click.option("--device", default="cpu")
@click.option("--mode", type=click.Choice(["free", "teacher-forced"]), default="free",
              help="Masks from the generated [SEG] (free) or from the ground-truth answer's [SEG] (teacher-forced, "
                   "the paper's segmentation protocol; LISA only). Recorded in the predictions file.")
@click.option("--quantize", type=click.Choice(["none", "8bit", "4bit"]), default="none",
              help="LISA: load the language model in 8-bit or 4-bit (bitsandbytes; needs CUDA).")
@click.option("--device-map", default=None, help="LISA: 'auto' or a JSON {module prefix: device} to spread a "
              "large checkpoint over devices (accelerate).")
@click.option("--max-pixels", type=click.IntRange(min=1), default=DEFAULT_MAX_PIXELS, show_default=True,
              help="Images whose header states more pixels are recorded as failures without being decoded.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@clean_errors(ImportError)
def predict_cmd(checkpoint: Path, dataset: Path, images: Path | None, split: str, out: Path, limit: int | None,
                batch_size: int, device: str, mode: str, quantize: str, device_map: str | None, max_pixels: int,
                quiet: bool) -> None:
    """Answer every pair of a split with a trained model, as predictions JSONL for ``ils evaluate``."""
    from cxrground.models.base import load_model
    from cxrground.models.predict import predict_split

    options = {k: v for k, v in (("quantize", quantize), ("device_map", device_map)) if v not in (None, "none")}
    model = load_model(checkpoint, device=device, **options)
    counts = predict_split(model, dataset, images, split, out, limit=limit, batch_size=max(1, batch_size),
                           progress=not quiet, mode=mode, max_pixels=max_pixels)
    click.echo(f"{out}: {counts['written']} written, {counts['skipped']} already there, "
               f"{counts['failed']} failed (of {counts['pairs']} pairs; mode {mode})")


@ils.command("convert-lisa")
@click.option("--source", type=DIR, required=True,
              help="Local folder in the released layout (xinlai/LISA-7B-v1, checkone/ROSALIA-7B-v1).")
@click.option("--out", type=OUT_DIR, required=True,
              help="Checkpoint folder to write (checkpoint.json + model.safetensors + tokenizer).")
@click.option("--sam", type=EXISTING, default=None,
              help="SAM weights when the source has none: sam_vit_h_4b8939.pth or a transformers SAM folder.")
@click.option("--clip", type=DIR, default=None,
              help="Local CLIP ViT-L/14 folder: its config, and its weights when the source does not store the "
                   "vision tower.")
@click.option("--tokenizer", type=DIR, default=None, help="Tokenizer folder (default: the source folder).")
@click.option("--allow-missing", multiple=True, type=click.Choice(["text_hidden_fcs", "visual_model.mask_decoder"]),
              help="Parts that may stay at their initialisation (e.g. starting from a plain LLaVA).")
@click.option("--dtype", type=click.Choice(["source", "float32", "bfloat16", "float16"]), default="source",
              help="Dtype of the written weights (source = keep the release's, e.g. bf16).")
def convert_lisa(source: Path, out: Path, sam: Path | None, clip: Path | None, tokenizer: Path | None,
                 allow_missing: tuple[str, ...], dtype: str) -> None:
    """Map every weight of a released LISA/ROSALIA checkpoint onto the cxrground LISA model and save it."""
    from cxrground.models.lisa.convert import convert_released

    path = convert_released(source, out, sam=sam, clip=clip, tokenizer=tokenizer, allow_missing=allow_missing,
                            dtype=dtype)
    click.echo(f"wrote {path}")


@ils.command("evaluate")
@click.option("--dataset", type=EXISTING, required=True,
              help="Dataset folder (mimic_ils_instruction_answer.json + lesion_mask/) or the JSON file.")
@click.option("--predictions", type=FILE, required=True,
              help="Predictions JSONL: {pair_id, answer, mask (COCO RLE) | mask_path (PNG)} per line.")
@click.option("--split", type=click.Choice(["train", "val", "test", "all"]), default="test",
              help="Split to score ('all': every split together).")
@click.option("--out", type=OUT_FILE, default=None, help="Write the full result as JSON here.")
@click.option("--images", type=DIR, default=None,
              help="Image root (MIMIC-CXR-JPG files/) to read native sizes; GT masks of another size "
                   "(e.g. released 512x512) are resized nearest-neighbour to it.")
@click.option("--bootstrap", "n_boot", type=int, default=1000, help="Bootstrap resamples for the 95 % CIs (0 = none).")
@click.option("--seed", type=int, default=0)
@click.option("--limit", type=int, default=None, help="Score only the first N pairs (default: the full split).")
@click.option("--seg-mode", default="unspecified",
              help="How the masks were produced, stated in the report (teacher-forced | free); default: the mode "
                   "the predictions file records (ils predict --mode).")
def evaluate(dataset: Path, predictions: Path, split: str, out: Path | None, images: Path | None, n_boot: int,
             seed: int, limit: int | None, seg_mode: str) -> None:
    """Score predictions: gIoU, cIoU, N-Acc, Dice and text accuracy, printed as Markdown."""
    from cxrground.evaluation.ils import evaluate_dataset, format_report

    result = evaluate_dataset(dataset, predictions, split=split, limit=limit, n_boot=n_boot, seed=seed,
                              images_root=images, seg_mode=seg_mode, log=lambda m: click.echo(m, err=True))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2), encoding="utf-8")
        click.echo(f"wrote {out}", err=True)
    click.echo(format_report(result))


ils.add_command(predict_cmd)

COMMANDS: list[click.Command] = []
