"""``cxrground segment``: lung/heart masks of one image with a chosen backend; training of the lung U-Net."""

from __future__ import annotations

from pathlib import Path

import click

from cxrground.anatomy.segment import SEGMENTERS
from cxrground.cli.common import FILE, OUT_DIR, OUT_FILE, PACK_OPT, backend_option, group, kv


@group("segment")
def segment() -> None:
    """Lung/heart segmentation: built-in lung U-Net (heart estimated), given masks, mask folders, CXAS, HybridGNet."""


@segment.command("lungs")
@click.option("--image", type=FILE, required=True)
@click.option("--out-dir", type=OUT_DIR, required=True)
@backend_option("--backend", SEGMENTERS, "unet")
@click.option("--weights", type=click.Path(path_type=Path), default=None,
              help="unet: .safetensors (default: the shipped lung_unet_v1); hybridgnet: checkpoint; "
                   "cxas: folder holding the .pth.")
@click.option("--right", type=FILE, default=None, help="given: right-lung mask PNG (patient's right = image left).")
@click.option("--left", type=FILE, default=None, help="given: left-lung mask PNG.")
@click.option("--heart", type=FILE, default=None,
              help="given: heart mask PNG (else the heart is estimated from the lungs).")
@click.option("--allow-pickle", is_flag=True, help="hybridgnet: allow a pickled model file you trust.")
@click.option("--backend-opt", multiple=True, help="KEY=VALUE for the backend (e.g. masks: root=DIR).")
def lungs(image: Path, out_dir: Path, backend: str, weights: Path | None, right: Path | None, left: Path | None,
          heart: Path | None, allow_pickle: bool, backend_opt: tuple[str, ...]) -> None:
    """Write right_lung.png, left_lung.png, heart.png, overlay.png and masks.json; print the CTR."""
    from cxrground.anatomy.segment.output import segment_file
    from cxrground.anatomy.segment.registry import weights_options

    options: dict[str, object] = {**kv(backend_opt), **weights_options(backend, weights)}
    if allow_pickle:
        options["allow_pickle"] = True
    given = None
    if backend == "given":
        if right is None or left is None:
            raise click.UsageError("--backend given needs --right and --left")
        given = (right, left, heart)
    click.echo("\n".join(segment_file(image, out_dir, backend, options, given)))


@segment.command("train-lungs")
@click.option("--out", type=OUT_DIR, required=True, help="Folder for lung_unet_v1.safetensors + lung_unet_v1.json.")
@click.option("--epochs", type=click.IntRange(min=1), default=40)
@click.option("--seed", type=click.IntRange(min=0), default=0)
@PACK_OPT
@click.option("--name", default="lung_unet_v1")
@click.option("--threads", type=click.IntRange(min=1), default=2)
@click.option("--no-eval", is_flag=True, help="Skip the evaluation on the CC BY-NC-SA rows.")
@click.option("--synthetic", type=click.IntRange(min=0), default=0,
              help="Synthetic phantoms mixed into the training split.")
@click.option("--synthetic-seed", type=click.IntRange(min=0), default=1,
              help="Seed of the training phantoms (the evaluation phantoms use seed 1000).")
@click.option("--init", "init_weights", type=OUT_FILE, default=None,
              help="Fine-tune from these weights (.safetensors with its .json).")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=3e-3)
def train_lungs(out: Path, epochs: int, seed: int, pack_dir: Path | None, name: str, threads: int,
                no_eval: bool, synthetic: int, synthetic_seed: int, init_weights: Path | None, lr: float) -> None:
    """Train the lung U-Net on the pack's shippable rows (plus optional phantoms); evaluate on the NC rows.

    The shipped lung_unet_v1 was fine-tuned with --init (the previous v1) --lr 1e-3 --synthetic 200
    --epochs 16 (see its sidecar's training.recipe).
    """
    from cxrground.datasets.pack import Pack
    from cxrground.models.lung_unet import TrainRecipe, train_lung_unet

    recipe = TrainRecipe(threads=threads, lr=lr, synthetic_count=synthetic, synthetic_seed=synthetic_seed,
                         warmup_epochs=0.5 if init_weights else 1.0,
                         init_weights=str(init_weights) if init_weights else None)
    result = train_lung_unet(Pack(pack_dir), out, epochs=epochs, seed=seed, name=name, recipe=recipe,
                             evaluate=not no_eval)
    click.echo("\n".join(result.summary_lines()))


COMMANDS: list[click.Command] = [segment]
