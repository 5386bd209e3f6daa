"""``cxrground segment``: lung/heart masks of one image with a chosen backend; training of the lung U-Net."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cxrground.anatomy import cardiothoracic_ratio
from cxrground.errors import ConfigError, InputError

BACKENDS = ("unet", "given", "cxas", "hybridgnet")


@click.group("segment")
def segment() -> None:
    """Lung/heart segmentation: built-in lung U-Net (heart estimated), given masks, CXAS, HybridGNet."""


@segment.command("lungs")
@click.option("--image", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True)
@click.option("--out-dir", type=click.Path(path_type=Path, file_okay=False), required=True)
@click.option("--backend", type=click.Choice(BACKENDS), default="unet", show_default=True)
@click.option("--weights", type=click.Path(path_type=Path), default=None,
              help="unet: .safetensors (default: the shipped lung_unet_v1); hybridgnet: checkpoint; "
                   "cxas: folder holding the .pth.")
@click.option("--right", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="given: right-lung mask PNG (patient's right = image left).")
@click.option("--left", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="given: left-lung mask PNG.")
@click.option("--heart", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="given: heart mask PNG (else the heart is estimated from the lungs).")
@click.option("--allow-pickle", is_flag=True, help="hybridgnet: allow a pickled model file you trust.")
def lungs(image: Path, out_dir: Path, backend: str, weights: Path | None, right: Path | None, left: Path | None,
          heart: Path | None, allow_pickle: bool) -> None:
    """Write right_lung.png, left_lung.png, heart.png, overlay.png and masks.json; print the CTR."""
    from cxrground.anatomy.segment import get_segmenter
    from cxrground.io.image import read_image, write_image
    from cxrground.io.masks import read_mask_png, write_mask_png
    from cxrground.io.overlay import overlay_masks

    try:
        im = read_image(image)
        if backend == "given":
            if right is None or left is None:
                raise click.UsageError("--backend given needs --right and --left")
            given = (read_mask_png(right, im.shape), read_mask_png(left, im.shape),
                     read_mask_png(heart, im.shape) if heart else None)
            seg = get_segmenter("given", masks=lambda _im: given, label="cli")
        elif backend == "unet":
            seg = get_segmenter("unet", weights=weights)
        elif backend == "hybridgnet":
            seg = get_segmenter("hybridgnet", weights_path=weights, allow_pickle=allow_pickle)
        else:
            seg = get_segmenter("cxas", weights_dir=weights)
        masks = seg.segment(im)
    except (InputError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from exc

    out_dir.mkdir(parents=True, exist_ok=True)
    write_mask_png(out_dir / "right_lung.png", masks.right_lung)
    write_mask_png(out_dir / "left_lung.png", masks.left_lung)
    layers = [masks.right_lung, masks.left_lung]
    ctr = None
    if masks.heart is not None:
        write_mask_png(out_dir / "heart.png", masks.heart)
        layers.append(masks.heart)
        ctr = cardiothoracic_ratio(masks.heart, masks.right_lung, masks.left_lung)
    write_image(out_dir / "overlay.png", overlay_masks(im.pixels, layers, alpha=0.35))
    record = {
        "image": str(image),
        "shape": list(im.shape),
        "backend": masks.source,
        "heart_source": masks.heart_source,
        "ctr": None if ctr is None else round(ctr, 4),
        "areas": {"right_lung": int(masks.right_lung.sum()), "left_lung": int(masks.left_lung.sum()),
                  "heart": None if masks.heart is None else int(masks.heart.sum())},
        "extra": {k: v for k, v in masks.extra.items() if k != "landmarks_canvas"},
        "provenance": seg.provenance(),
    }
    (out_dir / "masks.json").write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    click.echo(f"wrote {out_dir}/right_lung.png, left_lung.png{', heart.png' if ctr is not None else ''}, overlay.png")
    if ctr is None:
        click.echo("heart: none (no heart mask); CTR undefined")
    else:
        note = {
            "estimate": "ESTIMATE from the lung masks' medial borders, not segmented from the image",
            "truth": "given",
            "model": f"segmented by {masks.source}",
        }.get(masks.heart_source, masks.heart_source)
        click.echo(f"CTR = {ctr:.3f}")
        click.echo(f"heart: {note}")
        info = masks.extra.get("heart_estimate") or {}
        if masks.heart_source == "estimate" and info.get("ctr_plausible") is False:
            click.echo("warning: the estimated heart is implausibly narrow (CTR < 0.30): the lung masks probably "
                       "overlap the heart shadow; do not use this CTR for cardiomegaly decisions")


@segment.command("train-lungs")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Folder for lung_unet_v1.safetensors + lung_unet_v1.json.")
@click.option("--epochs", type=click.IntRange(min=1), default=40, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--pack", "pack_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="cxr-pack-v1 folder (default: $CXRGROUND_PACK or ../shared/data/cxr-pack-v1).")
@click.option("--name", default="lung_unet_v1", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--no-eval", is_flag=True, help="Skip the evaluation on the CC BY-NC-SA rows.")
@click.option("--synthetic", type=click.IntRange(min=0), default=0, show_default=True,
              help="Synthetic phantoms mixed into the training split.")
@click.option("--synthetic-seed", type=click.IntRange(min=0), default=1, show_default=True,
              help="Seed of the training phantoms (the evaluation phantoms use seed 1000).")
@click.option("--init", "init_weights", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Fine-tune from these weights (.safetensors with its .json).")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=3e-3, show_default=True)
def train_lungs(out: Path, epochs: int, seed: int, pack_dir: Path | None, name: str, threads: int,
                no_eval: bool, synthetic: int, synthetic_seed: int, init_weights: Path | None, lr: float) -> None:
    """Train the lung U-Net on the pack's shippable rows (plus optional phantoms); evaluate on the NC rows.

    The shipped lung_unet_v1 was fine-tuned with --init (the previous v1) --lr 1e-3 --synthetic 200
    --epochs 16 (see its sidecar's training.recipe).
    """
    from cxrground.datasets.pack import Pack
    from cxrground.models.lung_unet import TrainRecipe, train_lung_unet

    try:
        pack = Pack(pack_dir)
        result = train_lung_unet(pack, out, epochs=epochs, seed=seed, name=name,
                                 recipe=TrainRecipe(threads=threads, lr=lr, synthetic_count=synthetic,
                                                    synthetic_seed=synthetic_seed,
                                                    warmup_epochs=0.5 if init_weights else 1.0,
                                                    init_weights=str(init_weights) if init_weights else None),
                                 evaluate=not no_eval)
    except (InputError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {result.weights_path} and {result.sidecar_path}")
    click.echo(f"training: {len(result.history)} epochs, {result.train_seconds:.0f} s")
    m = result.metrics
    click.echo(f"validation (shippable hold-out) canvas Dice: {m.get('val_canvas_dice_best')}")
    nc = m.get("nc_eval")
    if nc:
        click.echo(f"NC evaluation rows ({nc['n']}): Dice mean {nc['dice_mean']:.4f} "
                   f"(right {nc['dice_right_mean']:.4f}, left {nc['dice_left_mean']:.4f})")
    syn = m.get("synthetic_eval")
    if syn:
        click.echo(f"synthetic phantoms ({syn['n']}, never trained on): Dice mean {syn['dice_mean']:.4f} "
                   f"(right {syn['dice_right_mean']:.4f}, left {syn['dice_left_mean']:.4f})")


COMMANDS: list[click.Command] = [segment]
