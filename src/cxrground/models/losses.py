"""Segmentation losses of ILS.md §17.3, shared by every trainable ILS model (torch required).

- :func:`sigmoid_bce`: per-pixel sigmoid BCE, mean over pixels, then mean over masks; negatives
  (all-zero targets) included.
- :func:`dice_loss`: soft Dice with scale 1000 and eps 1e-6 on **positive** masks only (empty targets
  skipped), summed and normalised by the number of positive masks.

Both take an optional boolean ``valid`` ``(N, H, W)``: the pixels each mask is scored on (e.g. the un-padded image
region of a letterboxed canvas). The loss is then that of every mask's valid pixels alone: the BCE mean runs over
them, and the Dice sums leave the other pixels out.
"""

from __future__ import annotations

from typing import Final

import torch
import torch.nn.functional as F

__all__ = ["DICE_EPS", "DICE_SCALE", "dice_loss", "sigmoid_bce"]

DICE_SCALE: Final[float] = 1000.0
DICE_EPS: Final[float] = 1e-6


def _check(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor | None:
    if logits.shape != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} differ in shape")
    if valid is None:
        return None
    if valid.shape != logits.shape:
        raise ValueError(f"valid {tuple(valid.shape)} and logits {tuple(logits.shape)} differ in shape")
    valid = valid.to(device=logits.device, dtype=torch.bool).flatten(1)
    if not bool(valid.any(1).all()):
        raise ValueError("every mask needs at least one valid pixel")
    return valid


def sigmoid_bce(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over masks of the per-mask mean pixel BCE (over its ``valid`` pixels when given); ``logits``/``targets``
    (/``valid``) are ``(N, H, W)``."""
    keep = _check(logits, targets, valid)
    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    per_pixel = F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype), reduction="none").flatten(1)
    if keep is None:
        return per_pixel.mean(1).mean()
    return (torch.where(keep, per_pixel, 0.0).sum(1) / keep.sum(1)).mean()


def dice_loss(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Soft Dice over the masks whose target is non-empty (on their ``valid`` pixels when given), normalised by their
    number (0 when none)."""
    keep = _check(logits, targets, valid)
    t = targets.to(logits.dtype).flatten(1)
    p = logits.sigmoid().flatten(1)
    if keep is not None:
        t = torch.where(keep, t, 0.0)
        p = torch.where(keep, p, 0.0)
    positive = t.sum(1) > 0
    n_pos = int(positive.sum())
    if n_pos == 0:
        return logits.sum() * 0.0
    p = p[positive]
    t = t[positive]
    num = 2 * (p / DICE_SCALE * t).sum(-1)
    den = (p / DICE_SCALE).sum(-1) + (t / DICE_SCALE).sum(-1)
    loss = 1 - (num + DICE_EPS) / (den + DICE_EPS)
    return loss.sum() / (n_pos + 1e-8)
