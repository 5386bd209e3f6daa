"""§15.2 text accuracy as a cumulative metric (:class:`TextAccuracyMetric`, MONAI style).

Lesion-inference positives: headline = lesion only (certainty ignored, predicted presence must be definite
or tentative), plus ``strict`` (lesion and certainty); global positives: headline = exact location string,
plus ``lenient`` (a predicted ``right lung`` / ``left lung`` counts when that side word occurs in the GT
location) and ``unordered`` (the same location labels in any order: ILS.md §18.14 asks parsers to be
order-insensitive, while §15.2 scores the exact string). A missing prediction is scored wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cxrground.evaluation.ils.answers import lenient_match, parse_answer, question_type, unordered_match
from cxrground.evaluation.ils.grouping import lesion_order
from cxrground.vocab.ils_templates import INSTRUCTION_TYPES

__all__ = ["TextAccuracyMetric"]


@dataclass(frozen=True)
class _TextRecord:
    pair_id: str
    qtype: str
    positive: bool
    target: str
    correct: bool
    strict: bool
    lenient: bool
    unordered: bool
    missing: bool


def _acc(records: Sequence[_TextRecord], attr: str = "correct") -> dict[str, Any]:
    n = len(records)
    k = sum(bool(getattr(r, attr)) for r in records)
    return {"n": n, "correct": k, "accuracy": (k / n) if n else None}


class TextAccuracyMetric:
    """Cumulative §15.2 text accuracy; ``update`` once per pair, ``aggregate`` at the end."""

    def __init__(self) -> None:
        self._records: list[_TextRecord] = []

    def reset(self) -> None:
        self._records.clear()

    def update(self, pair_id: str, instruction: str, gt_answer: str, pred_answer: str | None,
               target: str) -> bool:
        """Score one pair (``pred_answer=None`` = missing, wrong); returns the headline correctness."""
        qtype = question_type(instruction)
        gt = parse_answer(gt_answer, qtype)
        positive = gt.presence != "absent"
        if pred_answer is None:
            rec = _TextRecord(pair_id, qtype, positive, target, False, False, False, False, True)
        else:
            pred = parse_answer(pred_answer, qtype)
            exact = pred.astuple() == gt.astuple()
            correct = exact
            if qtype == "lesion_inference" and positive:
                correct = pred.presence in ("definite", "tentative") and pred.target == gt.target
            is_global = qtype == "global" and positive
            lenient = lenient_match(gt, pred) if is_global else exact
            unordered = unordered_match(gt, pred) if is_global else exact
            rec = _TextRecord(pair_id, qtype, positive, target, correct, exact, lenient, unordered, False)
        self._records.append(rec)
        return rec.correct

    def aggregate(self) -> dict[str, Any]:
        recs = self._records
        types = [t for t in (*INSTRUCTION_TYPES, "unknown") if any(r.qtype == t for r in recs)]
        per_type: dict[str, Any] = {}
        for t in types:
            sub = [r for r in recs if r.qtype == t]
            entry: dict[str, Any] = {"overall": _acc(sub)}
            for bucket, flag in (("positive", True), ("negative", False)):
                b = [r for r in sub if r.positive == flag]
                entry[bucket] = _acc(b)
                if t == "lesion_inference" and flag:
                    entry[bucket]["accuracy_strict"] = _acc(b, "strict")["accuracy"]
                if t == "global" and flag:
                    entry[bucket]["accuracy_lenient"] = _acc(b, "lenient")["accuracy"]
                    entry[bucket]["accuracy_unordered"] = _acc(b, "unordered")["accuracy"]
            per_type[t] = entry
        per_lesion: dict[str, Any] = {}
        for lesion in lesion_order({r.target for r in recs}):
            sub = [r for r in recs if r.target == lesion]
            per_lesion[lesion] = {"overall": _acc(sub)}
            for t in types:
                tsub = [r for r in sub if r.qtype == t]
                if tsub:
                    per_lesion[lesion][t] = _acc(tsub)
        return {
            "total": _acc(recs),
            "total_strict": _acc(recs, "strict"),
            "total_lenient": _acc(recs, "lenient"),
            "positive": _acc([r for r in recs if r.positive]),
            "negative": _acc([r for r in recs if not r.positive]),
            "per_type": per_type,
            "per_lesion": per_lesion,
            "missing": [r.pair_id for r in recs if r.missing],
        }
