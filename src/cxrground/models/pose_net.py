"""Training recipe of the pose reader (:mod:`cxrground.anatomy.segment.pose_net`).

Data: the pack's NIH ChestX-ray14 films and the COVID-19 collection films whose licence allows shipping derived
weights (the rows the lung U-Net trains on). NIH patients (the first 8 characters of the image name) are split with
a seeded generator: ``1 - holdout_fraction`` of them train; the COVID-19 collection's patients likewise by
``cohen_holdout_fraction``, the shippable films of the others train. The held-out films are for validation
(``bench/pose_net.py``) and never read here. Every training film is upright; each
epoch shows it once in each of the eight poses of :data:`~cxrground.anatomy.segment.pose_net.POSE_CLASSES`, the
pose being the label. Per sample, before the pose: with probability ``crop_p`` a crop to a height/width ratio in
``aspect`` (so the letterbox's padding bands are seen: NIH films are square, other sources are not), gamma,
contrast and brightness on [0, 1], grey levels inverted with probability ``invert_p``, the reader's canvas
(letterbox, z-score), then a random affine (rotation, scale, shift). Cross-entropy, AdamW, one warm-up epoch then
cosine decay; the last epoch's weights are kept (nothing is selected on held-out films). Seeded and
deterministic on the CPU for a fixed thread count. The pre-registration that fixed this recipe:
``bench/records/pose_net_preregistration.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.anatomy.segment.pose_net import (
    POSE_CLASSES,
    PoseNetConfig,
    build_pose_net,
    pose_canvas,
    save_pose_net,
)
from cxrground.errors import InputError
from cxrground.models.torch_state import restores_torch_settings

__all__ = ["PoseRecipe", "augment_film", "nih_patient", "split_patients", "train_from_pack", "train_pose_net"]

#: Films are shrunk to this longest side before augmentation (the reader's canvas is 128 px).
WORK_SIDE = 256


@dataclass(frozen=True)
class PoseRecipe:
    """The pose reader's training settings (defaults: the shipped ``pose_net_v1``)."""

    epochs: int = 20
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 1e-4
    warmup_epochs: float = 1.0
    final_lr_fraction: float = 0.01
    seed: int = 0
    threads: int = 2
    holdout_fraction: float = 1 / 3
    #: Share of the COVID-19 collection's patients held out; the shippable films of the others train (None: none
    #: of that collection's films train).
    cohen_holdout_fraction: float | None = 0.5
    crop_p: float = 0.5
    aspect: tuple[float, float] = (0.7, 1.3)
    gamma: tuple[float, float] = (0.7, 1.4)
    contrast: tuple[float, float] = (0.8, 1.25)
    brightness: float = 0.08
    invert_p: float = 0.2
    rotation_deg: float = 10.0
    scale: tuple[float, float] = (0.9, 1.1)
    shift: float = 0.05


def nih_patient(image_name: str) -> str:
    """The NIH ChestX-ray14 patient id of an image name (``00000100_002.png`` → ``00000100``)."""
    return Path(image_name).name[:8]


def split_patients(names: Sequence[str], holdout_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """``names`` split by patient into (training, held out), seeded; each list in the order given."""
    patients = sorted({nih_patient(n) for n in names})
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(patients))
    n_held = round(len(patients) * holdout_fraction)
    held = {patients[i] for i in order[:n_held]}
    return [n for n in names if nih_patient(n) not in held], [n for n in names if nih_patient(n) in held]


def _shrink(pixels: np.ndarray, side: int = WORK_SIDE) -> np.ndarray:
    """Grey uint8 pixels with the longest side at most ``side`` (area resampling)."""
    from PIL import Image

    h, w = pixels.shape
    scale = side / max(h, w)
    if scale >= 1:
        return pixels
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.BOX))


def augment_film(pixels: np.ndarray, recipe: PoseRecipe, rng: np.random.Generator, size: int) -> np.ndarray:
    """One augmented, upright canvas of a grey uint8 film (crop, grey-level changes, letterbox, z-score)."""
    img = pixels
    if rng.random() < recipe.crop_p:
        h, w = img.shape
        ratio = rng.uniform(*recipe.aspect)
        if ratio < h / w:  # keep every column, fewer rows
            rows = max(8, min(h, round(ratio * w)))
            top = int(rng.integers(0, h - rows + 1))
            img = img[top:top + rows]
        else:
            cols = max(8, min(w, round(h / ratio)))
            left = int(rng.integers(0, w - cols + 1))
            img = img[:, left:left + cols]
    x = img.astype(np.float32) / 255.0
    x = np.power(x, rng.uniform(*recipe.gamma))
    mean = float(x.mean())
    x = (x - mean) * rng.uniform(*recipe.contrast) + mean + rng.uniform(-recipe.brightness, recipe.brightness)
    x = np.clip(x, 0.0, 1.0)
    if rng.random() < recipe.invert_p:
        x = 1.0 - x
    return pose_canvas((x * 255.0 + 0.5).astype(np.uint8), size)


def _affine(batch: Any, recipe: PoseRecipe, gen: Any) -> Any:
    """``batch`` (N, 1, S, S) after a random rotation, scale and shift per sample (zero padding)."""
    import torch
    import torch.nn.functional as F

    n = batch.shape[0]
    u = torch.rand((n, 4), generator=gen)
    angle = (u[:, 0] * 2 - 1) * math.radians(recipe.rotation_deg)
    scale = recipe.scale[0] + u[:, 1] * (recipe.scale[1] - recipe.scale[0])
    tx, ty = ((u[:, 2:] * 2 - 1) * recipe.shift * 2).unbind(1)  # grid units: the canvas spans 2
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(theta, list(batch.shape), align_corners=False)
    return F.grid_sample(batch, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _posed(batch: Any, labels: Sequence[int]) -> Any:
    """Each canvas of ``batch`` (N, 1, S, S) stored in the pose of its label."""
    import torch

    out = []
    for canvas, label in zip(batch, labels, strict=True):
        turns, mirrored = POSE_CLASSES[label]
        c = torch.flip(canvas, dims=(2,)) if mirrored else canvas
        out.append(torch.rot90(c, turns, dims=(1, 2)))
    return torch.stack(out)


@restores_torch_settings
def train_pose_net(films: Sequence[tuple[str, np.ndarray]], out: str | Path, recipe: PoseRecipe | None = None,
                   config: PoseNetConfig | None = None, sidecar: dict[str, Any] | None = None,
                   progress: bool = True) -> dict[str, Any]:
    """Train the pose reader on upright grey films ``(name, pixels)``, all of which are training films; write
    ``out.safetensors`` + ``out.json``; return the training record stored in the sidecar."""
    import torch
    from tqdm import tqdm

    recipe = recipe or PoseRecipe()
    config = config or PoseNetConfig()
    if not films:
        raise InputError("pose reader training: no training films")
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(recipe.seed)
    gen = torch.Generator().manual_seed(recipe.seed)
    shrunk = [_shrink(p) for _, p in films]
    model = build_pose_net(config)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    pairs = [(i, c) for i in range(len(shrunk)) for c in range(len(POSE_CLASSES))]
    steps_per_epoch = math.ceil(len(pairs) / recipe.batch_size)
    total = steps_per_epoch * recipe.epochs
    warm = max(1, round(steps_per_epoch * recipe.warmup_epochs))

    def lr_at(step: int) -> float:
        if step < warm:
            return recipe.lr * (step + 1) / warm
        t = (step - warm) / max(1, total - warm)
        return recipe.lr * (recipe.final_lr_fraction + (1 - recipe.final_lr_fraction) * 0.5 * (1 + math.cos(
            math.pi * t)))

    history = []
    started = time.monotonic()
    step = 0
    model.train()
    for epoch in range(recipe.epochs):
        order = rng.permutation(len(pairs))
        losses, correct = [], 0
        bar = tqdm(range(steps_per_epoch), desc=f"pose reader epoch {epoch + 1}/{recipe.epochs}",
                   disable=not progress, leave=False)
        for b in bar:
            chosen = [pairs[j] for j in order[b * recipe.batch_size:(b + 1) * recipe.batch_size]]
            canvases = np.stack([augment_film(shrunk[i], recipe, rng, config.input_size) for i, _ in chosen])
            labels = [c for _, c in chosen]
            x = _posed(_affine(torch.from_numpy(canvases)[:, None], recipe, gen), labels)
            y = torch.tensor(labels)
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            losses.append(loss.item())
            correct += int((logits.argmax(1) == y).sum())
            bar.set_postfix(loss=f"{np.mean(losses):.3f}")
        history.append({"epoch": epoch + 1, "loss": round(float(np.mean(losses)), 4),
                        "train_accuracy": round(correct / len(pairs), 4)})
        if progress:
            print(f"epoch {epoch + 1}: loss {history[-1]['loss']}, training accuracy {history[-1]['train_accuracy']}",
                  flush=True)
    model.eval()
    record = {"recipe": asdict(recipe), "history": history, "seconds": round(time.monotonic() - started, 1),
              "software": {"torch": torch.__version__}}
    save_pose_net(model, config, out, {"training": record, **(sidecar or {})})
    return record


def train_from_pack(pack: Any, out: str | Path, recipe: PoseRecipe | None = None, progress: bool = True
                    ) -> dict[str, Any]:
    """Train the pose reader on the training patients of ``pack``'s NIH films (``pack.nih()``: records with
    ``image_path`` and ``read()``) and, unless ``recipe.cohen_holdout_fraction`` is None, on the shippable COVID-19
    collection films of that collection's training patients (``pack.cohen()``: also ``patient_id``, ``shippable``,
    ``license``); the sidecar lists the training and held-out images of both."""
    recipe = recipe or PoseRecipe()
    records = pack.nih()
    names = [r.image_path.name for r in records]
    train_names, held_names = split_patients(names, recipe.holdout_fraction, recipe.seed)
    chosen = set(train_names)
    films = [(r.image_path.name, r.read().pixels) for r in records if r.image_path.name in chosen]
    data: dict[str, Any] = {
        "source": "NIH ChestX-ray14 films of cxr-pack-v1 (NIH Clinical Center, see the pack's ATTRIBUTION.md)",
        "train_images": train_names, "heldout_images": held_names,
        "train_patients": len({nih_patient(n) for n in train_names}),
        "heldout_patients": len({nih_patient(n) for n in held_names})}
    if recipe.cohen_holdout_fraction is not None:
        cohen = pack.cohen()
        patients = sorted({r.patient_id for r in cohen})
        order = np.random.default_rng(recipe.seed).permutation(len(patients))
        held = {patients[i] for i in order[:round(len(patients) * recipe.cohen_holdout_fraction)]}
        used = [r for r in cohen if r.patient_id not in held and r.shippable]
        films += [(r.image_path.name, r.read().pixels) for r in used]
        data["cohen_train_images"] = [r.image_path.name for r in used]
        data["cohen_heldout_images"] = [r.image_path.name for r in cohen if r.patient_id in held]
        data["cohen_train_licences"] = sorted({r.license for r in used})
        data["cohen_source"] = ("COVID-19 image data collection films of cxr-pack-v1 whose licence allows shipping "
                                "derived weights (see the pack's ATTRIBUTION.md)")
    return train_pose_net(films, out, recipe, sidecar={"data": data}, progress=progress)
