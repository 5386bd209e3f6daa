"""``cxrground segment``: lung/heart masks of one image or a folder of images with a chosen backend; training of the
lung U-Net."""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.anatomy.segment.request import SegmentRequest, segment_folder_request, segment_request
from cxrground.cli.common import (
    DIR,
    FILE,
    echo_lines,
    exit_folder_run,
    group,
    request_options,
    strict_option,
    threads_option,
)
from cxrground.models.lung_unet.config import LungTrainRequest
from cxrground.models.pose_net import FOLDER_HOLDOUT_FRACTION


@group("segment")
def segment() -> None:
    """Lung/heart segmentation: built-in lung U-Net (heart estimated), given masks, mask folders, CXAS, HybridGNet."""


@segment.command("lungs")
@threads_option
@request_options(SegmentRequest)
@strict_option("films", "in OUT_DIR/failures.jsonl; with --images only")
def lungs(request: SegmentRequest, strict: bool) -> None:
    """Write right_lung.png, left_lung.png, heart.png, overlay.png and masks.json; print the CTR.

    With --images DIR: the same files for every film under DIR, in OUT_DIR/<its path under DIR>/, and
    OUT_DIR/segment.csv (image, status ok / check / failed, folder, CTR, the heart and lung plausibility flags, the
    error), OUT_DIR/failures.jsonl and OUT_DIR/segment.json. Exits 1 when no film could be segmented.
    """
    if request.images is None:
        click.echo("\n".join(segment_request(request)))
        return
    batch = segment_folder_request(request)
    echo_lines(batch.summary_lines())
    exit_folder_run(batch.segmented, len(batch.failures), request.out_dir, strict)


@segment.command("train-lungs")
@request_options(LungTrainRequest)
def train_lungs(request: LungTrainRequest) -> None:
    """Train the lung U-Net on the pack's shippable rows (plus optional phantoms); evaluate on the NC rows.

    The shipped lung_unet_v2 was fine-tuned on a GPU from lung_unet_v1 with --lr 1e-3 --synthetic 100
    --lesion-copies 3 --texture-p 0.5 --epochs 60 --max-minutes 3.5 --device cuda (its sidecar's training.recipe;
    bench/records/lung_unet_gpu_preregistration.md), then evaluated with eval-lungs.
    """
    from cxrground.models.lung_unet.train import train_request

    click.echo("\n".join(train_request(request).summary_lines()))


@segment.command("eval-lungs")
@click.argument("weights", type=click.Path(exists=True, dir_okay=False))
@click.option("--pack", "pack_dir", type=click.Path(file_okay=False), default=None,
              help="The data pack (default: CXRGROUND_PACK or ../shared/data/cxr-pack-v1).")
@threads_option
def eval_lungs(weights: str, pack_dir: str | None) -> None:
    """Evaluate lung U-Net WEIGHTS as train-lungs does (validation, CC BY-NC-SA rows, phantoms) and add the metrics
    to their sidecar: for weights trained with --no-eval, e.g. on a GPU machine given only the shippable rows."""
    from cxrground.anatomy.segment.unet import read_sidecar
    from cxrground.datasets.pack import Pack
    from cxrground.models.lung_unet.train import evaluate_weights

    read_sidecar(weights)  # a missing or broken sidecar is reported before the pack is opened
    metrics = evaluate_weights(Pack(pack_dir), weights)
    for key in ("val_native", "nc_eval", "synthetic_eval"):
        if key in metrics:
            m = metrics[key]
            click.echo(f"{key}: {m['n']} images, Dice median {m['dice_median']}, mean {m['dice_mean']}, "
                       f"lungs < 0.8: {m['below_0_8']}")
    click.echo(f"metrics written to {weights.removesuffix('.safetensors')}.json")


COMMANDS: list[click.Command] = [segment]


@segment.command("train-pose")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Weights to write: OUT.safetensors + OUT.json (with --images also OUT.failures.jsonl).")
@click.option("--pack", "pack_dir", type=click.Path(file_okay=False), default=None,
              help="The data pack (default: CXRGROUND_PACK or ../shared/data/cxr-pack-v1): the default source.")
@click.option("--images", type=DIR, default=None,
              help="Train on your own films instead of the pack's: the frontal films under this folder (PNG / JPEG / "
                   "DICOM, searched recursively), taken to be stored upright.")
@click.option("--metadata", type=FILE, default=None,
              help="With --images: a CSV with an image column (path under --images or file name; or MIMIC-CXR's "
                   "dicom_id) and a view column (view or ViewPosition); only films it (or the DICOM header) names PA "
                   "or AP train, the others are listed in OUT.failures.jsonl. A patient, patientid or subject_id "
                   "column makes the held-out split by patient. Default: MIMIC-CXR-JPG's table in the image folder "
                   "or its parent, when there (as for anatomy pose).")
@click.option("--holdout-fraction", type=click.FloatRange(0, 1, max_open=True), default=None,
              show_default=str(FOLDER_HOLDOUT_FRACTION),
              help="With --images: share of the patients (or films, without a patient column) held out by a seeded "
                   "split and read at the end.")
@click.option("--max-films", type=click.IntRange(1), default=None,
              help="With --images: use at most this many films, tried in a seeded order.")
@click.option("--screen-weights", type=FILE, default=None,
              help="With --images: the pose reader that screens the training films (default: the shipped "
                   "pose_net_v1).")
@click.option("--no-screen", is_flag=True,
              help="With --images: train on every film, without leaving out those the current reader reads as not "
                   "upright.")
@click.option("--epochs", type=click.IntRange(1), default=20, show_default=True, help="Training epochs.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True,
              help="Seed of the split, the augmentations and the initial weights.")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
              help="torch threads (the shipped pose_net_v1 was trained with 2, which a byte-identical rebuild "
                   "needs).")
@click.option("--nih-only", is_flag=True, help="Train on NIH films only (no COVID-19 collection film).")
def train_pose(out: str, pack_dir: str | None, images: Path | None, metadata: Path | None,
               holdout_fraction: float | None, max_films: int | None, screen_weights: Path | None, no_screen: bool,
               epochs: int, seed: int, threads: int, nih_only: bool) -> None:
    """Train the pose reader (mirrored, turned and flipped films), each film in its eight poses.

    From the pack (default): two thirds of the pack's NIH patients and the shippable COVID-19 collection films of
    half of that collection's patients; the others are held out (bench/pose_net.py validates weights on them;
    bench/records/pose_net_preregistration.md).

    From your own films (--images DIR): the frontal films under DIR, taken to be stored upright. Unreadable and
    non-frontal films are listed in OUT.failures.jsonl; the current reader screens the films first and training
    films it reads as not upright are left out (listed in OUT.json); a seeded split holds out a share of the
    patients (or films). At the end the held-out films are read upright and in the seven other poses: the share
    flagged per pose is printed and kept in OUT.json. Use the weights with anatomy pose --weights.
    """
    from cxrground.anatomy.segment.pose_net import PoseReader, shipped_pose_reader
    from cxrground.models.pose_net import PoseRecipe, train_from_pack

    folder_only = {"--metadata": metadata, "--holdout-fraction": holdout_fraction, "--max-films": max_films,
                   "--screen-weights": screen_weights, "--no-screen": no_screen or None}
    if images is None:
        given = [k for k, v in folder_only.items() if v is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)}: only with --images (training on your own films)")
    else:
        if pack_dir is not None:
            raise click.UsageError("--images and --pack are two sources of training films: give one")
        if nih_only:
            raise click.UsageError("--nih-only applies to the pack, not to --images")
        if screen_weights is not None and no_screen:
            raise click.UsageError("--screen-weights and --no-screen do not go together")
    if images is not None:
        from cxrground.datasets.views import find_view_table
        from cxrground.models.pose_net import read_film_table, train_from_folder

        table_path = metadata if metadata is not None else find_view_table(images)
        table = read_film_table(table_path) if table_path is not None else None
        screen = None if no_screen else PoseReader(screen_weights or shipped_pose_reader().path, threads=threads)
        recipe = PoseRecipe(epochs=epochs, seed=seed, threads=threads, cohen_holdout_fraction=None,
                            holdout_fraction=FOLDER_HOLDOUT_FRACTION if holdout_fraction is None else holdout_fraction)
        result = train_from_folder(images, out, recipe, table=table, screen=screen, max_films=max_films,
                                   echo=click.echo)
        echo_lines(result.summary_lines())
        return
    from cxrground.datasets.pack import Pack

    recipe = PoseRecipe(epochs=epochs, seed=seed, threads=threads, cohen_holdout_fraction=None if nih_only else 0.5)
    record = train_from_pack(Pack(pack_dir), out, recipe)
    last = record["history"][-1]
    click.echo(f"wrote {out.removesuffix('.safetensors')}.safetensors: {len(record['history'])} epochs in "
               f"{record['seconds']} s, last loss {last['loss']}, training accuracy {last['train_accuracy']}")
