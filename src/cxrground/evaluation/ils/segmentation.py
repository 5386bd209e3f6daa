"""§15.1 segmentation metrics as a cumulative metric (:class:`SegmentationMetric`, MONAI style).

Per-sample ``IoU = I / (U + 1e-5)`` (both empty → 1.0); **gIoU** = mean IoU over positives (GT non-empty);
**cIoU** = ``ΣI / (ΣU + 1e-10)`` over positives; **N-Acc** = share of negatives whose prediction has zero
foreground pixels; **Dice** = mean ``2I / (|P| + |G|)`` over positives; **false-empty ratio** = share of
positives predicted empty. Reported overall, per lesion (grouped by the JSON ``target``) and per ``type`` ×
positive/negative, with seeded percentile bootstrap 95 % CIs (resampling positives and negatives
separately) for gIoU, cIoU and N-Acc. A missing prediction is scored wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cxrground.evaluation.bootstrap import bootstrap_ci
from cxrground.evaluation.ils.grouping import lesion_order
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.vocab.ils_templates import INSTRUCTION_TYPES

__all__ = ["CIOU_EPS", "IOU_EPS", "SegmentationMetric", "sample_iou"]

IOU_EPS = 1e-5
CIOU_EPS = 1e-10


def sample_iou(inter: float, union: float) -> float:
    """§15.1 per-sample IoU: ``I / (U + 1e-5)``, 1.0 when both masks are empty."""
    return 1.0 if union == 0 else inter / (union + IOU_EPS)


@dataclass(frozen=True)
class _SegRecord:
    pair_id: str
    target: str
    type: str
    positive: bool
    inter: int
    union: int
    pred_area: int
    gt_area: int
    missing: bool


def _pos_summary(recs: Sequence[_SegRecord]) -> dict[str, Any]:
    pos = [r for r in recs if r.positive]
    n = len(pos)
    if not n:
        return {"n": 0, "n_missing": 0, "gIoU": None, "cIoU": None, "Dice": None, "false_empty_ratio": None}
    inter = np.array([r.inter for r in pos], float)
    union = np.array([r.union for r in pos], float)
    dice = [2 * r.inter / (r.pred_area + r.gt_area) for r in pos]
    return {
        "n": n,
        "n_missing": sum(r.missing for r in pos),
        "gIoU": float(np.mean([sample_iou(i, u) for i, u in zip(inter, union, strict=True)])),
        "cIoU": float(inter.sum() / (union.sum() + CIOU_EPS)),
        "Dice": float(np.mean(dice)),
        "false_empty_ratio": sum(r.pred_area == 0 and not r.missing for r in pos) / n,
    }


def _neg_summary(recs: Sequence[_SegRecord]) -> dict[str, Any]:
    neg = [r for r in recs if not r.positive]
    n = len(neg)
    ok = sum(r.pred_area == 0 and not r.missing for r in neg)
    return {"n": n, "n_missing": sum(r.missing for r in neg), "N-Acc": (ok / n) if n else None}


class SegmentationMetric:
    """Cumulative §15.1 segmentation metrics; ``update`` once per pair, ``aggregate`` at the end."""

    def __init__(self, n_boot: int = 1000, seed: int = 0) -> None:
        self.n_boot = n_boot
        self.seed = seed
        self._records: list[_SegRecord] = []

    def reset(self) -> None:
        self._records.clear()

    def update(self, pair_id: str, pred_mask: Any | None, gt_mask: Any, target: str, type: str) -> float:
        """Add one pair (``pred_mask=None`` = missing, scored wrong); returns its IoU."""
        gt = as_mask(gt_mask, f"GT mask of pair {pair_id}")
        gt_area = int(gt.sum())
        positive = gt_area > 0
        if pred_mask is None:
            rec = _SegRecord(pair_id, target, type, positive, 0, gt_area if positive else 1, 0, gt_area, True)
            self._records.append(rec)
            return 0.0
        pred = as_mask(pred_mask, f"prediction mask of pair {pair_id}")
        check_same_shape((f"GT mask of pair {pair_id}", gt), (f"prediction mask of pair {pair_id}", pred))
        inter = int(np.logical_and(pred, gt).sum())
        union = int(np.logical_or(pred, gt).sum())
        rec = _SegRecord(pair_id, target, type, positive, inter, union, int(pred.sum()), gt_area, False)
        self._records.append(rec)
        return sample_iou(inter, union)

    def aggregate(self) -> dict[str, Any]:
        recs = self._records
        pos, neg = _pos_summary(recs), _neg_summary(recs)
        out: dict[str, Any] = {
            "n_positive": pos["n"], "n_negative": neg["n"],
            "n_missing": pos["n_missing"] + neg["n_missing"],
            "gIoU": pos["gIoU"], "cIoU": pos["cIoU"], "N-Acc": neg["N-Acc"], "Dice": pos["Dice"],
            "false_empty_ratio": pos["false_empty_ratio"],
            "ci": self._cis(), "ci_level": 0.95, "n_boot": self.n_boot, "seed": self.seed,
        }
        out["per_lesion"] = {
            lesion: {"positive": _pos_summary(sub), "negative": _neg_summary(sub)}
            for lesion in lesion_order({r.target for r in recs})
            for sub in [[r for r in recs if r.target == lesion]]
        }
        types = [t for t in INSTRUCTION_TYPES if any(r.type == t for r in recs)]
        types += sorted({r.type for r in recs} - set(INSTRUCTION_TYPES))
        out["per_type"] = {
            t: {"positive": _pos_summary(sub), "negative": _neg_summary(sub)}
            for t in types
            for sub in [[r for r in recs if r.type == t]]
        }
        out["missing"] = [r.pair_id for r in recs if r.missing]
        return out

    def _cis(self) -> dict[str, tuple[float, float] | None]:
        pos = [r for r in self._records if r.positive]
        neg = [r for r in self._records if not r.positive]
        iu = np.array([[r.inter, r.union] for r in pos], float).reshape(-1, 2)
        ious = np.array([sample_iou(i, u) for i, u in iu], float)
        empty = np.array([float(r.pred_area == 0 and not r.missing) for r in neg], float)
        return {
            "gIoU": bootstrap_ci(ious, lambda v: v.mean(axis=1), self.n_boot, self.seed),
            "cIoU": bootstrap_ci(iu, lambda v: v[..., 0].sum(axis=1) / (v[..., 1].sum(axis=1) + CIOU_EPS),
                                 self.n_boot, self.seed + 1),
            "N-Acc": bootstrap_ci(empty, lambda v: v.mean(axis=1), self.n_boot, self.seed + 2),
        }
