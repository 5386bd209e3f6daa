"""``cxrground segment``: lung/heart masks of one image with a chosen backend; training of the lung U-Net."""

from __future__ import annotations

import click

from cxrground.anatomy.segment.request import SegmentRequest, segment_request
from cxrground.cli.common import group, request_options, threads_option
from cxrground.models.lung_unet.config import LungTrainRequest


@group("segment")
def segment() -> None:
    """Lung/heart segmentation: built-in lung U-Net (heart estimated), given masks, mask folders, CXAS, HybridGNet."""


@segment.command("lungs")
@threads_option
@request_options(SegmentRequest)
def lungs(request: SegmentRequest) -> None:
    """Write right_lung.png, left_lung.png, heart.png, overlay.png and masks.json; print the CTR."""
    click.echo("\n".join(segment_request(request)))


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
              help="Weights to write: OUT.safetensors + OUT.json.")
@click.option("--pack", "pack_dir", type=click.Path(file_okay=False), default=None,
              help="The data pack (default: CXRGROUND_PACK or ../shared/data/cxr-pack-v1).")
@click.option("--epochs", type=click.IntRange(1), default=20, show_default=True)
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True, help="torch threads.")
@click.option("--nih-only", is_flag=True, help="Train on NIH films only (no COVID-19 collection film).")
def train_pose(out: str, pack_dir: str | None, epochs: int, seed: int, threads: int, nih_only: bool) -> None:
    """Train the pose reader (mirrored, turned and flipped films), each film in its eight poses: two thirds of the
    pack's NIH patients and the shippable COVID-19 collection films of half of that collection's patients; the
    others are held out (bench/pose_net.py validates weights on them; bench/records/pose_net_preregistration.md)."""
    from cxrground.datasets.pack import Pack
    from cxrground.models.pose_net import PoseRecipe, train_from_pack

    recipe = PoseRecipe(epochs=epochs, seed=seed, threads=threads, cohen_holdout_fraction=None if nih_only else 0.5)
    record = train_from_pack(Pack(pack_dir), out, recipe)
    last = record["history"][-1]
    click.echo(f"wrote {out.removesuffix('.safetensors')}.safetensors: {len(record['history'])} epochs in "
               f"{record['seconds']} s, last loss {last['loss']}, training accuracy {last['train_accuracy']}")
