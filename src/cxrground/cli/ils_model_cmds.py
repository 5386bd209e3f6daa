"""``cxrground ils train`` / ``cxrground ils predict``: train an ILS model and write predictions JSONL.

Both commands are added to the ``ils`` group at import time; ``COMMANDS`` is empty because the group itself
is registered by :mod:`cxrground.cli.ils_cmds`. ``train`` dispatches to the backend module registered in
:data:`cxrground.models.base.MODEL_MODULES`; ``predict`` loads any checkpoint through
:func:`cxrground.models.base.load_model`. Predictions are resumable (a re-run skips pairs already written);
an image that cannot be read is recorded in ``<PRED>.failures.jsonl`` and its pairs get no line (they count as
missing, i.e. wrong, in ``ils evaluate``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from cxrground.cli.ils_cmds import _kv, ils
from cxrground.errors import CXRGroundError

__all__ = ["COMMANDS", "predict_split"]


@click.command("train")
@click.option("--model", "model_name", type=click.Choice(["baseline", "lisa"]), default="baseline",
              show_default=True, help="Model backend.")
@click.option("--dataset", type=click.Path(path_type=Path, exists=True), required=True,
              help="ILS dataset folder (mimic_ils_instruction_answer.json + lesion_mask/) or the JSON file.")
@click.option("--images", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="Image root the pairs' image_path is relative to (MIMIC-CXR-JPG files/). "
                   "Default: the dataset folder.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), required=True, help="Checkpoint folder.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--set", "settings", multiple=True, help="KEY=VALUE configuration override (repeatable), "
              "e.g. --set epochs=30 --set size=160.")
@click.option("--split", default="train", show_default=True, help="Split to train on.")
@click.option("--val-split", default="val", show_default=True, help="Split for model selection ('' = none).")
@click.option("--no-resume", is_flag=True, help="Start from scratch even if --out holds a checkpoint.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def train_cmd(model_name: str, dataset: Path, images: Path | None, out: Path, seed: int, settings: tuple[str, ...],
              split: str, val_split: str, no_resume: bool, quiet: bool) -> None:
    """Train an ILS model (resumable: rerun the same command to continue after a kill)."""
    from cxrground.models.base import model_module

    try:
        module = model_module(model_name)
        path = module.train(dataset, out, images=images, seed=seed, overrides=_kv(settings) or None,
                            resume=not no_resume, split=split, val_split=val_split or None,
                            **({"progress": not quiet} if model_name == "baseline" else {}))
    except (CXRGroundError, ImportError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"checkpoint: {path}")


def predict_split(model: Any, dataset: Path, images: Path, split: str, out: Path, limit: int | None = None,
                  batch_size: int = 8, progress: bool = True, mode: str = "free") -> dict[str, Any]:
    """Predict every pair of ``split`` (or the first ``limit``) into the JSONL ``out``; resumable.

    ``mode`` (``free`` | ``teacher-forced``, recorded on every line) picks the model's ``predict_batch`` or its
    ``predict_teacher_forced`` (masks from the ground-truth answers' ``[SEG]``, ILS.md §15.1).

    Pairs already in ``out`` are skipped. An unreadable image (or a failing batch) is appended to
    ``<out>.failures.jsonl`` and the remaining pairs go on. Returns counts of written, skipped and failed pairs.
    """
    from tqdm.auto import tqdm

    from cxrground.errors import Failure, InputError
    from cxrground.ils.build import DATASET_FILE
    from cxrground.ils.predictions import PredictionWriter
    from cxrground.ils.schema import load_dataset
    from cxrground.io.image import read_image

    json_path = dataset if dataset.is_file() else dataset / DATASET_FILE
    data = load_dataset(json_path)
    if split not in data:
        raise InputError(f"split {split!r} not in the dataset", json_path)
    jobs: list[tuple[str, str, list[dict[str, Any]]]] = []
    n = 0
    for study in data[split].values():
        pairs = study["instruction_answer_pairs"]
        items = list(pairs.get("positive_pairs", [])) + list(pairs.get("negative_pairs", []))
        if limit is not None:
            items = items[: max(0, limit - n)]
        n += len(items)
        if items:
            jobs.append((study["image_path"], study.get("dicom_id", ""), items))
    failures_path = out.with_name(out.name + ".failures.jsonl")
    counts = {"pairs": n, "written": 0, "skipped": 0, "failed": 0}
    run = _mode_runner(model, mode)
    with PredictionWriter(out, seg_mode=mode) as writer:
        todo = [(rel, [p for p in items if p["pair_id"] not in writer.done]) for rel, _d, items in jobs]
        counts["skipped"] = n - sum(len(items) for _r, items in todo)
        bar = tqdm(total=n - counts["skipped"], desc="predict", unit="pair", disable=not progress)
        for rel, items in todo:
            if not items:
                continue
            try:
                image = read_image(images / rel)
                for b in range(0, len(items), batch_size):
                    chunk = items[b:b + batch_size]
                    results = run([image] * len(chunk), chunk)
                    for pair, res in zip(chunk, results, strict=True):
                        writer.write(pair["pair_id"], res.answer, res.mask)
                        counts["written"] += 1
                    bar.update(len(chunk))
            except InputError as exc:
                left = [p for p in items if p["pair_id"] not in writer.done]
                counts["failed"] += len(left)
                bar.update(len(left))
                record = {**Failure.from_exception(images / rel, "predict", exc).to_dict(),
                          "pair_ids": [p["pair_id"] for p in left]}
                with failures_path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
        bar.close()
    return counts


def _mode_runner(model: Any, mode: str) -> Any:
    """``(images, pairs) -> outputs`` for a segmentation mode; a backend without teacher forcing is refused."""
    from cxrground.errors import ConfigError

    if mode == "free":
        return lambda images, pairs: model.predict_batch(images, [p["instruction"] for p in pairs])
    if mode != "teacher-forced":
        raise ConfigError(f"mode must be 'free' or 'teacher-forced', got {mode!r}")
    if not hasattr(model, "predict_teacher_forced"):
        raise ConfigError(f"the {getattr(model, 'name', '?')} backend has no teacher-forced mode (its masks do not "
                          "come from a generated [SEG]); use --mode free")
    return lambda images, pairs: model.predict_teacher_forced(images, [p["instruction"] for p in pairs],
                                                              [p["answer"] for p in pairs])


@click.command("predict")
@click.option("--checkpoint", type=click.Path(path_type=Path, exists=True), required=True,
              help="Checkpoint folder (checkpoint.json names the backend).")
@click.option("--dataset", type=click.Path(path_type=Path, exists=True), required=True,
              help="ILS dataset folder or its JSON file.")
@click.option("--images", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="Image root (MIMIC-CXR-JPG files/). Default: the dataset folder.")
@click.option("--split", type=click.Choice(["train", "val", "test"]), default="test", show_default=True)
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Predictions JSONL (appended to; pairs already there are skipped).")
@click.option("--limit", type=int, default=None, help="Predict only the first N pairs of the split.")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Pairs per forward pass.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--mode", type=click.Choice(["free", "teacher-forced"]), default="free", show_default=True,
              help="Masks from the generated [SEG] (free) or from the ground-truth answer's [SEG] (teacher-forced, "
                   "the paper's segmentation protocol; LISA only). Recorded in the predictions file.")
@click.option("--quantize", type=click.Choice(["none", "8bit", "4bit"]), default="none", show_default=True,
              help="LISA: load the language model in 8-bit or 4-bit (bitsandbytes; needs CUDA).")
@click.option("--device-map", default=None, help="LISA: 'auto' or a JSON {module prefix: device} to spread a "
              "large checkpoint over devices (accelerate).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def predict_cmd(checkpoint: Path, dataset: Path, images: Path | None, split: str, out: Path, limit: int | None,
                batch_size: int, device: str, mode: str, quantize: str, device_map: str | None, quiet: bool) -> None:
    """Answer every pair of a split with a trained model, as predictions JSONL for ``ils evaluate``."""
    from cxrground.models.base import load_model

    try:
        options = {k: v for k, v in (("quantize", quantize), ("device_map", device_map)) if v not in (None, "none")}
        model = load_model(checkpoint, device=device, **options)
        root = images if images is not None else (dataset.parent if dataset.is_file() else dataset)
        counts = predict_split(model, dataset, root, split, out, limit=limit, batch_size=max(1, batch_size),
                               progress=not quiet, mode=mode)
    except (CXRGroundError, ImportError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{out}: {counts['written']} written, {counts['skipped']} already there, "
               f"{counts['failed']} failed (of {counts['pairs']} pairs; mode {mode})")


ils.add_command(train_cmd)
ils.add_command(predict_cmd)

COMMANDS: list[click.Command] = []
