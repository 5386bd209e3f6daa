"""Segmentation losses of ILS.md §17.3, shared by every trainable ILS model (torch required).

- :func:`sigmoid_bce`: per-pixel sigmoid BCE, mean over pixels, then mean over masks; negatives
  (all-zero targets) included.
- :func:`dice_loss`: soft Dice with scale 1000 and eps 1e-6 on **positive** masks only (empty targets
  skipped), summed and normalised by the number of positive masks.
"""

from __future__ import annotations

from typing import Final

import torch
import torch.nn.functional as F

__all__ = ["DICE_EPS", "DICE_SCALE", "dice_loss", "sigmoid_bce"]

DICE_SCALE: Final[float] = 1000.0
DICE_EPS: Final[float] = 1e-6


def sigmoid_bce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over masks of the per-mask mean pixel BCE; ``logits``/``targets`` are ``(N, H, W)``."""
    if logits.shape != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} differ in shape")
    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    per_pixel = F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype), reduction="none")
    return per_pixel.flatten(1).mean(1).mean()


def dice_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Soft Dice over the masks whose target is non-empty, normalised by their number (0 when none)."""
    if logits.shape != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} differ in shape")
    t = targets.to(logits.dtype).flatten(1)
    positive = t.sum(1) > 0
    n_pos = int(positive.sum())
    if n_pos == 0:
        return logits.sum() * 0.0
    p = logits.sigmoid().flatten(1)[positive]
    t = t[positive]
    num = 2 * (p / DICE_SCALE * t).sum(-1)
    den = (p / DICE_SCALE).sum(-1) + (t / DICE_SCALE).sum(-1)
    loss = 1 - (num + DICE_EPS) / (den + DICE_EPS)
    return loss.sum() / (n_pos + 1e-8)
