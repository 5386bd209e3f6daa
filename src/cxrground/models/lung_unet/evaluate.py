"""Lung U-Net evaluation: Dice per lung at native size on pack rows or on synthetic phantoms."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from cxrground.anatomy.segment.base import segment_image
from cxrground.io.progress import progress_bar
from cxrground.models.lung_unet.data import LungRecord, phantom_records

__all__ = ["dice", "evaluate_records", "evaluate_synthetic", "without_per_image"]


def dice(pred: np.ndarray, truth: np.ndarray, ignore: np.ndarray | None = None) -> float:
    """Dice of two bool masks (pixels in ``ignore`` left out); 1.0 when both are empty."""
    if ignore is not None:
        pred, truth = pred & ~ignore, truth & ~ignore
    total = int(pred.sum()) + int(truth.sum())
    return 1.0 if total == 0 else 2.0 * int((pred & truth).sum()) / total


def evaluate_records(segmenter: Any, records: Iterable[LungRecord], progress: bool = False) -> dict[str, Any]:
    """Dice per lung at native size (annotators' ignore regions left out) of ``segmenter.segment``."""
    rows = []
    for rec in progress_bar(list(records), desc="evaluate", unit="img", progress=progress):
        im = rec.read()
        right, left = rec.lungs(im.shape)
        ign = rec.ignore(im.shape)
        masks = segment_image(segmenter, im)
        rows.append((rec.image_id, dice(masks.right_lung, right, ign), dice(masks.left_lung, left, ign)))
    if not rows:
        return {"n": 0}
    arr = np.asarray([(r, lft) for _, r, lft in rows], dtype=np.float64)
    both = arr.mean(axis=1)
    return {
        "n": len(rows),
        "dice_mean": round(float(both.mean()), 4),
        "dice_right_mean": round(float(arr[:, 0].mean()), 4),
        "dice_left_mean": round(float(arr[:, 1].mean()), 4),
        "dice_median": round(float(np.median(both)), 4),
        "dice_right_median": round(float(np.median(arr[:, 0])), 4),
        "dice_left_median": round(float(np.median(arr[:, 1])), 4),
        "dice_min": round(float(both.min()), 4),
        "below_0_8": int((both < 0.8).sum()),
        "per_image": {i: [round(r, 4), round(lft, 4)] for i, r, lft in rows},
    }


def evaluate_synthetic(segmenter: Any, n: int = 40, seed: int = 1000, config: Any = None,
                       progress: bool = False) -> dict[str, Any]:
    """:func:`evaluate_records` on phantoms ``0..n-1`` of ``seed`` (exact lung masks), without per-image rows."""
    recs = phantom_records(n, seed, config)
    res = without_per_image(evaluate_records(segmenter, recs, progress=progress))
    for r in recs:
        r.release()
    return res


def without_per_image(d: dict[str, Any]) -> dict[str, Any]:
    """An :func:`evaluate_records` result without its ``per_image`` rows."""
    return {k: v for k, v in d.items() if k != "per_image"}
