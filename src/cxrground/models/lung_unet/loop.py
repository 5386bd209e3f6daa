"""The lung U-Net training loop on in-memory samples (:func:`train_on_samples`); torch is imported on call.

Per batch: random affine + intensity augmentation (:class:`~cxrground.models.lung_unet.config.Augment`),
per-sample ``zscore-valid`` normalisation, loss = BCE + soft Dice with ignore regions weighted 0, AdamW with
a linear warm-up then cosine decay to 1 %; the weights of the epoch with the best validation Dice (canvas,
logit > 0) are kept, with early stopping after ``patience`` epochs without improvement.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from cxrground.anatomy.segment.unet import UNetConfig
from cxrground.errors import ConfigError
from cxrground.io.progress import progress_bar
from cxrground.models.lung_unet.config import Augment, TrainRecipe
from cxrground.models.lung_unet.data import Samples
from cxrground.models.lung_unet.evaluate import dice

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["train_on_samples"]


def _augment_batch(
    img: torch.Tensor, tgt: torch.Tensor, wgt: torch.Tensor, val: torch.Tensor, aug: Augment, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random affine (image bilinear, masks bilinear then > 0.5, weights/valid nearest) + intensity, on the batch's
    device; the draws come from ``gen`` on the CPU (the same draws on every device)."""
    import torch
    import torch.nn.functional as F

    b = img.shape[0]

    def uni(lo: float, hi: float) -> torch.Tensor:
        return (lo + (hi - lo) * torch.rand(b, generator=gen)).to(img.device)

    ang = uni(-aug.rotate_deg, aug.rotate_deg) * (math.pi / 180.0)
    scale = torch.exp(uni(math.log(aug.scale[0]), math.log(aug.scale[1])))
    tx, ty = uni(-2 * aug.shift, 2 * aug.shift), uni(-2 * aug.shift, 2 * aug.shift)
    cos, sin = torch.cos(ang) / scale, torch.sin(ang) / scale
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(theta, list(img.shape), align_corners=False)
    img = F.grid_sample(img, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    tgt = (F.grid_sample(tgt, grid, mode="bilinear", padding_mode="zeros", align_corners=False) > 0.5).float()
    ign = F.grid_sample(1.0 - wgt, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    wgt = 1.0 - ign
    val = F.grid_sample(val, grid, mode="nearest", padding_mode="zeros", align_corners=False)

    if aug.texture_p > 0:
        img = texture_augment(img, val, aug, gen)
    gamma = torch.exp(uni(math.log(aug.gamma[0]), math.log(aug.gamma[1]))).view(b, 1, 1, 1)
    contrast = uni(*aug.contrast).view(b, 1, 1, 1)
    bright = uni(-aug.brightness, aug.brightness).view(b, 1, 1, 1)
    img = img.clamp(0.0, 1.0) ** gamma
    img = ((img - 0.5) * contrast + 0.5 + bright).clamp(0.0, 1.0)
    return img, tgt, wgt, val


def _blur(img: torch.Tensor, val: torch.Tensor, sigma_px: float) -> torch.Tensor:
    """Gaussian blur of one ``(1, 1, H, W)`` image over its valid region (normalised convolution: the padding
    does not darken the borders)."""
    import torch
    import torch.nn.functional as F

    radius = max(1, min(math.ceil(3.0 * sigma_px), img.shape[-1] - 1))
    x = torch.arange(-radius, radius + 1, dtype=img.dtype, device=img.device)
    k = torch.exp(-0.5 * (x / sigma_px) ** 2)
    k = k / k.sum()
    kh, kv = k.view(1, 1, 1, -1), k.view(1, 1, -1, 1)

    def conv(t: torch.Tensor) -> torch.Tensor:
        t = F.conv2d(F.pad(t, (radius, radius, 0, 0)), kh)
        return F.conv2d(F.pad(t, (0, 0, radius, radius)), kv)

    return conv(img * val) / conv(val).clamp_min(1e-3)


def _rescale(img: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """``img`` mapped so that its 1st-99th percentiles over ``val`` span [0, 1], clipped."""
    import torch

    inside = img[val > 0.5]
    if inside.numel() < 2:
        return img.clamp(0.0, 1.0)
    lo, hi = torch.quantile(inside, torch.tensor([0.01, 0.99], dtype=img.dtype, device=img.device))
    return ((img - lo) / (hi - lo).clamp_min(1e-6)).clamp(0.0, 1.0)


def texture_augment(img: torch.Tensor, val: torch.Tensor, aug: Augment, gen: torch.Generator) -> torch.Tensor:
    """Per image, each with probability ``aug.texture_p``: an unsharp mask ``x + a (x - blur_s(x))`` (strong
    ``a``: mostly the film's high-pass, where a dense base keeps its rib and vessel texture but loses its
    soft-tissue brightness), then local-contrast normalisation ``(x - mean_s) / (std_s + 0.05)`` blended in
    (CLAHE-like); each result rescaled to [0, 1] on the valid region (1-99 %), the padding 0. Masks are not
    touched (no geometry changes). Draws from ``gen`` a fixed number of values per batch."""
    import torch

    b, side = img.shape[0], float(img.shape[-1])
    draws = torch.rand(b, 6, generator=gen)
    out = []
    for i in range(b):
        x, v = img[i : i + 1].clamp(0.0, 1.0), val[i : i + 1]
        d = draws[i].tolist()
        if d[0] < aug.texture_p:
            sigma = side * (aug.unsharp_sigma[0] + (aug.unsharp_sigma[1] - aug.unsharp_sigma[0]) * d[1])
            amount = aug.unsharp_amount[0] + (aug.unsharp_amount[1] - aug.unsharp_amount[0]) * d[2]
            x = _rescale(x + amount * (x - _blur(x, v, sigma)), v) * v
        if d[3] < aug.texture_p:
            sigma = side * (aug.local_sigma[0] + (aug.local_sigma[1] - aug.local_sigma[0]) * d[4])
            mix = aug.local_mix[0] + (aug.local_mix[1] - aug.local_mix[0]) * d[5]
            mean = _blur(x, v, sigma)
            std = torch.sqrt(_blur((x - mean) ** 2, v, sigma).clamp_min(0.0))
            local = _rescale((x - mean) / (std + 0.05), v)
            x = ((1.0 - mix) * x + mix * local) * v
        out.append(x)
    return torch.cat(out)


def _normalise(img: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """Per-sample ``zscore-valid`` normalisation (see :func:`.unet.normalise_canvas`)."""
    import torch

    from cxrground.anatomy.segment.unet import NORM_EPS

    n = val.sum(dim=(1, 2, 3), keepdim=True).clamp_min(1.0)
    mean = (img * val).sum(dim=(1, 2, 3), keepdim=True) / n
    var = (((img - mean) * val) ** 2).sum(dim=(1, 2, 3), keepdim=True) / n
    out = (img - mean) / torch.sqrt(var).clamp_min(NORM_EPS)
    return out * val


def _loss(logits: torch.Tensor, tgt: torch.Tensor, wgt: torch.Tensor, recipe: TrainRecipe) -> torch.Tensor:
    import torch
    import torch.nn.functional as F

    w = wgt.expand_as(tgt)
    bce = (F.binary_cross_entropy_with_logits(logits, tgt, reduction="none") * w).sum() / w.sum().clamp_min(1.0)
    prob = torch.sigmoid(logits)
    inter = (prob * tgt * w).sum(dim=(2, 3))
    denom = (prob * w).sum(dim=(2, 3)) + (tgt * w).sum(dim=(2, 3))
    soft_dice = (2.0 * inter + 1.0) / (denom + 1.0)
    return recipe.bce_weight * bce + recipe.dice_weight * (1.0 - soft_dice.mean())


def _canvas_dice(model: torch.nn.Module, samples: Samples, batch: int = 8, device: str = "cpu") -> float:
    """Mean Dice over images and lungs on the canvas (logit > 0), ignore regions left out."""
    import torch

    scores = []
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(samples), batch):
            sl = slice(start, start + batch)
            img = torch.from_numpy(samples.images[sl])[:, None].to(device)
            val = torch.from_numpy(samples.valid[sl].astype(np.float32))[:, None].to(device)
            logits = model(_normalise(img, val)).float().cpu().numpy()
            for k in range(logits.shape[0]):
                ign = samples.weights[sl][k] == 0
                for c in range(logits.shape[1]):
                    scores.append(dice(logits[k, c] > 0, samples.targets[sl][k, c] > 0.5, ign))
    model.train()
    return float(np.mean(scores)) if scores else float("nan")


def train_on_samples(
    train: Samples,
    val: Samples | None,
    config: UNetConfig,
    recipe: TrainRecipe,
    seed: int = 0,
    progress: bool = True,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
    init_state: dict[str, Any] | None = None,
) -> tuple[torch.nn.Module, list[dict[str, float]]]:
    """Train a U-Net on in-memory samples; returns the best-on-validation (or last) model and the history.

    ``recipe.epochs`` epochs (fewer with early stopping or ``max_minutes``); one history row per epoch:
    ``epoch``, ``loss`` (mean training loss), ``val_dice`` (when ``val`` is given), ``seconds``.
    ``init_state`` (a state dict) starts from those weights instead of a fresh initialisation.
    """
    import torch

    from cxrground.anatomy.segment.unet import build_unet

    if len(train) == 0:
        raise ConfigError("no training samples")
    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    if recipe.threads > 0:
        torch.set_num_threads(recipe.threads)
    on_cpu = recipe.device == "cpu"
    if not on_cpu and not torch.cuda.is_available():
        raise ConfigError(f"device {recipe.device!r} asked for, but torch sees no CUDA device")
    if recipe.deterministic and on_cpu:
        torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        model = build_unet(config)
        if init_state is not None:
            model.load_state_dict(init_state)
        model.to(recipe.device)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
        steps_per_epoch = max(1, math.ceil(len(train) / recipe.batch_size))
        total = steps_per_epoch * recipe.epochs
        warm = max(1, round(recipe.warmup_epochs * steps_per_epoch))

        def lr_at(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            t = (step - warm) / max(1, total - warm)
            return 0.01 + 0.99 * 0.5 * (1.0 + math.cos(math.pi * min(t, 1.0)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
        images = torch.from_numpy(train.images)[:, None]
        targets = torch.from_numpy(train.targets)
        weights = torch.from_numpy(train.weights)[:, None]
        valid = torch.from_numpy(train.valid.astype(np.float32))[:, None]

        history: list[dict[str, float]] = []
        best_state, best_score, since_best = None, -1.0, 0
        start = time.perf_counter()
        bar = progress_bar(total=total, desc="train lungs", unit="step", progress=progress)
        for epoch in range(recipe.epochs):
            perm = torch.randperm(len(train), generator=gen)
            losses = []
            for s in range(steps_per_epoch):
                idx = perm[s * recipe.batch_size : (s + 1) * recipe.batch_size]
                img, tgt, wgt, val_ = (t[idx].to(recipe.device) for t in (images, targets, weights, valid))
                if recipe.augment.enabled:
                    img, tgt, wgt, val_ = _augment_batch(img, tgt, wgt, val_, recipe.augment, gen)
                logits = model(_normalise(img, val_))
                loss = _loss(logits, tgt, wgt, recipe)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                losses.append(float(loss.detach()))
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}")
            row: dict[str, float] = {"epoch": epoch + 1, "loss": float(np.mean(losses)),
                                     "seconds": time.perf_counter() - start}
            if val is not None and len(val):
                score = _canvas_dice(model, val, device=recipe.device)
                row["val_dice"] = score
                if score > best_score:
                    best_score, since_best = score, 0
                    best_state = copy.deepcopy(model.state_dict())
                    row["best"] = 1.0
                else:
                    since_best += 1
                bar.set_postfix(epoch=epoch + 1, loss=f"{row['loss']:.4f}", val_dice=f"{score:.4f}")
            history.append(row)
            if on_epoch is not None:
                on_epoch(row)
            if val is not None and since_best >= recipe.patience:
                break
            if recipe.max_minutes is not None and row["seconds"] > 60.0 * recipe.max_minutes:
                break
        bar.close()
        if best_state is not None:
            model.load_state_dict(best_state)
        model.to("cpu")
        model.eval()
        return model, history
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det)
