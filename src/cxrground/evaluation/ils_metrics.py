"""ILS evaluation (ILS.md §15): segmentation gIoU / cIoU / N-Acc / Dice and templated-text accuracy.

Cumulative metric objects in the MONAI style (``update`` per pair, ``aggregate`` at the end):

- :class:`SegmentationMetric`: per-sample ``IoU = I / (U + 1e-5)`` (both empty → 1.0); **gIoU** = mean IoU
  over positives (GT non-empty); **cIoU** = ``ΣI / (ΣU + 1e-10)`` over positives; **N-Acc** = share of
  negatives whose prediction has zero foreground pixels; **Dice** = mean ``2I / (|P| + |G|)`` over
  positives; **false-empty ratio** = share of positives predicted empty. Reported overall, per lesion
  (grouped by the JSON ``target``) and per ``type`` × positive/negative, with seeded percentile
  bootstrap 95 % CIs (resampling positives and negatives separately) for gIoU, cIoU and N-Acc.
- :class:`TextAccuracyMetric`: GT and predicted answers parsed with the §15.2 rules into
  ``(type, target, location, presence)``. The parsing patterns are derived from the answer templates
  of :mod:`cxrground.vocab.ils_templates` (lower-cased, ``[SEG]`` and the final dot removed, first match
  anywhere in the answer, trailing dots ignored). Lesion-inference positives: headline = lesion only
  (certainty ignored, predicted presence must be definite or tentative), plus ``strict`` (lesion and
  certainty); global positives: headline = exact location string, plus ``lenient`` (a predicted
  ``right lung`` / ``left lung`` counts when that side word occurs in the GT location) and ``unordered``
  (the same location labels in any order: ILS.md §18.14 asks parsers to be order-insensitive, while §15.2
  scores the exact string).

A pair without a prediction is never dropped: it is listed and scored wrong (IoU 0 on a positive,
"not empty" on a negative, text wrong). :func:`evaluate_dataset` compares masks at each image's native
``H×W`` (GT masks of another size are resized nearest-neighbour to the native size, which is read
from ``images_root`` or the study's ``height``/``width`` fields when given, else taken from the study's
GT masks — right for our generator, which writes native-size masks).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.errors import InputError
from cxrground.ils.build import DATASET_FILE, MASK_DIR
from cxrground.ils.frames import read_frame
from cxrground.ils.predictions import Prediction, load_predictions, resolve_seg_mode
from cxrground.ils.schema import load_dataset
from cxrground.io.masks import as_mask, check_same_shape, check_shape, read_mask_png
from cxrground.vocab.ils_templates import (
    BASIC_INSTRUCTION,
    BASIC_NEGATIVE,
    EOS,
    GLOBAL_NEGATIVE,
    GLOBAL_POSITIVE,
    INSTRUCTION_TYPES,
    LESION_INFERENCE_DEFINITIVE,
    LESION_INFERENCE_INSTRUCTION,
    LESION_INFERENCE_NEGATIVE,
    LESION_INFERENCE_TENTATIVE,
    LLAVA_PROMPT,
    SEG_TOKEN,
    TENTATIVE_WORD,
)
from cxrground.vocab.lesions import EVAL_ORDER
from cxrground.vocab.locations import SIDES, split_ils

__all__ = [
    "NOT_EXTRACTED",
    "ParsedAnswer",
    "SegmentationMetric",
    "TextAccuracyMetric",
    "bootstrap_ci",
    "clean_answer",
    "evaluate_dataset",
    "format_report",
    "parse_answer",
    "question_type",
    "sample_iou",
]

IOU_EPS = 1e-5
CIOU_EPS = 1e-10
NOT_EXTRACTED = "not extracted"
NONE_LOCATION = "none"

# --- text parsing (§15.2) ------------------------------------------------------------------------

_ASSISTANT = LLAVA_PROMPT.rsplit(" ", 1)[-1]  # "ASSISTANT:"


def _template_body(template: str) -> str:
    return template.replace(SEG_TOKEN, "").strip().lower().rstrip(".")


def _template_regex(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", _template_body(template))
    body = "".join(f"(?P<{p}>.+?)" if i % 2 else re.escape(p) for i, p in enumerate(parts))
    return re.compile(body + r"\.*$")


def _prefix(template: str, word: str) -> str:
    body = _template_body(template)
    return body[: body.index(word)]


_BASIC_NEG = _template_regex(BASIC_NEGATIVE)  # there is no (target) in the (location)
_GLOBAL_POS = _template_regex(GLOBAL_POSITIVE)  # it is located in the (location)
_GLOBAL_NEG = _template_regex(GLOBAL_NEGATIVE)  # there is no (target)
_LI_PHRASES = {
    _prefix(LESION_INFERENCE_DEFINITIVE, "{lesion}"): "definite",
    _prefix(LESION_INFERENCE_TENTATIVE, "{lesion}"): "tentative",
    _prefix(LESION_INFERENCE_NEGATIVE, TENTATIVE_WORD): "absent",
}
_LI = re.compile("(?P<phrase>" + "|".join(re.escape(p) for p in _LI_PHRASES) + r")(?P<target>.+?)\.*$")
_LI_MARK = LESION_INFERENCE_INSTRUCTION.lower().rstrip(".").rsplit(" and ", 1)[-1]  # "predict its type"
_SEGMENT = BASIC_INSTRUCTION.lower().split(" ", 1)[0]  # "segment"
_IN_THE = BASIC_INSTRUCTION.lower().split("{target}")[1].split("{location}")[0].strip()  # "in the"


@dataclass(frozen=True)
class ParsedAnswer:
    """The tuple compared in §15.2."""

    type: str
    target: str
    location: str
    presence: str

    def astuple(self) -> tuple[str, str, str, str]:
        return (self.type, self.target, self.location, self.presence)


def clean_answer(text: str) -> str:
    """The answer part (after ``ASSISTANT:``, before ``</s>``), newlines removed, spaces collapsed."""
    if _ASSISTANT in text:
        text = text.rsplit(_ASSISTANT, 1)[1]
    text = text.split(EOS, 1)[0]
    text = text.replace("\r", " ").replace("\n", " ")
    return re.sub(r" {2,}", " ", text).strip()


def question_type(instruction: str) -> str:
    """``lesion_inference`` / ``basic`` / ``global`` from the instruction text; ``unknown`` otherwise."""
    low = instruction.lower()
    if _LI_MARK in low:
        return "lesion_inference"
    if _SEGMENT in low and _IN_THE in low:
        return "basic"
    if _SEGMENT in low:
        return "global"
    return "unknown"


def parse_answer(answer: str, qtype: str) -> ParsedAnswer:
    """Parse one answer (GT or prediction) for a question of type ``qtype`` (§15.2)."""
    text = clean_answer(answer).lower()
    ne = NOT_EXTRACTED
    if qtype == "basic":
        m = _BASIC_NEG.search(text)
        if m:
            return ParsedAnswer(qtype, m["target"], m["location"], "absent")
        return ParsedAnswer(qtype, ne, ne, "present")
    if qtype == "global":
        m = _GLOBAL_POS.search(text)
        if m:
            return ParsedAnswer(qtype, ne, m["location"], "present")
        m = _GLOBAL_NEG.search(text)
        if m:
            return ParsedAnswer(qtype, m["target"], NONE_LOCATION, "absent")
        return ParsedAnswer(qtype, ne, ne, ne)
    if qtype == "lesion_inference":
        m = _LI.search(text)
        if m:
            return ParsedAnswer(qtype, m["target"], ne, _LI_PHRASES[m["phrase"]])
        return ParsedAnswer(qtype, ne, ne, ne)
    return ParsedAnswer(qtype, ne, ne, ne)


def _unordered_global(gt: ParsedAnswer, pred: ParsedAnswer) -> bool:
    if pred.astuple() == gt.astuple():
        return True
    same = pred.presence == gt.presence and pred.target == gt.target
    return same and frozenset(split_ils(pred.location)) == frozenset(split_ils(gt.location))


def _lenient_global(gt: ParsedAnswer, pred: ParsedAnswer) -> bool:
    if pred.astuple() == gt.astuple():
        return True
    sides = {f"{s} lung": s for s in SIDES}
    return (pred.presence == gt.presence and pred.target == gt.target and pred.location in sides
            and sides[pred.location] in gt.location)


# --- text metric ---------------------------------------------------------------------------------

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
            lenient = _lenient_global(gt, pred) if is_global else exact
            unordered = _unordered_global(gt, pred) if is_global else exact
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
        for lesion in _lesion_order({r.target for r in recs}):
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


def _lesion_order(names: set[str]) -> list[str]:
    return [lesion for lesion in EVAL_ORDER if lesion in names] + sorted(names - set(EVAL_ORDER))


# --- segmentation metric -------------------------------------------------------------------------

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


def bootstrap_ci(values: np.ndarray, stat: Callable[[np.ndarray], np.ndarray], n_boot: int = 1000,
                 seed: int = 0, level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap CI of ``stat`` over the rows of ``values`` (resampled with replacement).

    ``stat`` receives an array of shape ``(B, n, ...)`` (B resamples) and returns ``(B,)``.
    """
    n = len(values)
    if n == 0 or n_boot <= 0:
        return None
    rng = np.random.default_rng(seed)
    chunk = max(1, 2_000_000 // n)
    stats: list[np.ndarray] = []
    done = 0
    while done < n_boot:
        b = min(chunk, n_boot - done)
        idx = rng.integers(0, n, size=(b, n))
        stats.append(np.asarray(stat(values[idx]), float))
        done += b
    all_stats = np.concatenate(stats)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(all_stats, [tail, 100 - tail])
    return float(lo), float(hi)


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
            for lesion in _lesion_order({r.target for r in recs})
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


# --- whole-dataset evaluation --------------------------------------------------------------------

def _resize_nearest(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    im = Image.fromarray(mask.astype(np.uint8) * 255, mode="L")
    return np.asarray(im.resize((shape[1], shape[0]), Image.Resampling.NEAREST)) > 0


def _image_size(path: Path) -> tuple[int, int]:
    from PIL import Image, UnidentifiedImageError

    from cxrground.io.image import is_dicom, read_image

    if not path.is_file():
        raise InputError("image not found (needed for the native size)", path)
    if not is_dicom(path):
        try:
            with Image.open(path) as im:
                return int(im.height), int(im.width)
        except (OSError, UnidentifiedImageError):
            pass
    return read_image(path).shape


def _locate(dataset_dir: str | Path) -> tuple[Path, Path]:
    p = Path(dataset_dir)
    if p.is_file():
        return p, p.parent / MASK_DIR
    return p / DATASET_FILE, p / MASK_DIR


def evaluate_dataset(
    dataset_dir: str | Path,
    predictions_path: str | Path,
    split: str = "test",
    limit: int | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    images_root: str | Path | None = None,
    seg_mode: str = "unspecified",
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Score a predictions JSONL file (see :mod:`cxrground.ils.predictions`) on one split.

    Every pair of the split (or the first ``limit`` pairs in file order, when given) is scored;
    pairs without a prediction are counted wrong and listed under ``missing``. ``seg_mode`` records
    how the masks were produced (``teacher-forced`` / ``free``), as reports must state it; the mode the predictions
    file records is used when none is stated, and a stated mode contradicting it is an error.
    """
    json_path, mask_root = _locate(dataset_dir)
    data = load_dataset(json_path)
    frame = read_frame(json_path)  # released-frame masks map back to the recorded native sizes
    if split not in data:
        raise InputError(f"split {split!r} not in the dataset (has {', '.join(data) or 'none'})", json_path)
    preds = load_predictions(predictions_path)
    seg_mode = resolve_seg_mode(seg_mode, preds, predictions_path)
    seg = SegmentationMetric(n_boot=n_boot, seed=seed)
    text = TextAccuracyMetric()
    evaluated: list[str] = []
    missing: list[str] = []
    missing_mask: list[str] = []
    missing_answer: list[str] = []
    for study in data[split].values():
        if limit is not None and len(evaluated) >= limit:
            break
        pairs = study["instruction_answer_pairs"]
        items = [(p, True) for p in pairs.get("positive_pairs", [])]
        items += [(p, False) for p in pairs.get("negative_pairs", [])]
        if limit is not None:
            items = items[: limit - len(evaluated)]
        native: tuple[int, int] | None = None
        if images_root is not None:
            native = _image_size(Path(images_root) / study["image_path"])
        elif isinstance(study.get("height"), int) and isinstance(study.get("width"), int):
            native = (study["height"], study["width"])
        elif (recorded := frame.native_of(study["image_path"])) is not None:
            native = recorded
        native_known = native is not None
        for pair, is_pos in items:
            pid = pair["pair_id"]
            if is_pos:
                gt = read_mask_png(mask_root / pair["seg_mask_path"])
                if native is None:
                    native = (int(gt.shape[0]), int(gt.shape[1]))
                elif gt.shape != native:
                    if not native_known:  # masks of one study must share the image's size
                        check_shape(gt, native, f"GT mask of pair {pid}", mask_root / pair["seg_mask_path"])
                    gt = _resize_nearest(gt, native)
            pred: Prediction | None = preds.get(pid)
            pred_mask = pred.mask_array(native) if pred is not None else None
            if not is_pos:
                shape = native or (pred_mask.shape if pred_mask is not None else (1, 1))
                gt = np.zeros(shape, bool)
            if pred is None:
                missing.append(pid)
            else:
                if pred_mask is None:
                    missing_mask.append(pid)
                if pred.answer is None:
                    missing_answer.append(pid)
            seg.update(pid, pred_mask, gt, pair["target"], pair["type"])
            text.update(pid, pair["instruction"], pair["answer"], pred.answer if pred else None, pair["target"])
            evaluated.append(pid)
    seg_result = seg.aggregate()
    text_result = text.aggregate()
    counts = {
        t: {"positive": v["positive"]["n"], "negative": v["negative"]["n"]}
        for t, v in seg_result["per_type"].items()
    }
    result = {
        "dataset": str(json_path),
        "predictions": str(predictions_path),
        "split": split,
        "limit": limit,
        "seg_mode": seg_mode,
        "mask_frame": frame.frame,
        "n_pairs": len(evaluated),
        "counts": counts,
        "n_predictions_unused": len(set(preds) - set(evaluated)),
        "missing": missing,
        "missing_mask": missing_mask,
        "missing_answer": missing_answer,
        "segmentation": seg_result,
        "text": text_result,
    }
    if log is not None:
        log(_counts_line(result))
    return result


def _counts_line(result: dict[str, Any]) -> str:
    parts = [f"{t}: {c['positive']} pos / {c['negative']} neg" for t, c in result["counts"].items()]
    return (f"evaluated {result['n_pairs']} pairs of split {result['split']} ({'; '.join(parts)}); "
            f"missing predictions: {len(result['missing'])}")


# --- Markdown report -----------------------------------------------------------------------------

def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _ci(ci: Sequence[float] | None) -> str:
    return "" if not ci else f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def format_report(result: dict[str, Any]) -> str:
    """A Markdown report of :func:`evaluate_dataset`'s result (values in %)."""
    seg, txt = result["segmentation"], result["text"]
    lines = [
        f"# ILS evaluation — split `{result['split']}`",
        "",
        f"- dataset: `{result['dataset']}`",
        f"- predictions: `{result['predictions']}`",
        f"- evaluated pairs: {result['n_pairs']}"
        + (f" (limited to the first {result['limit']})" if result.get("limit") is not None else " (full split)"),
        f"- segmentation mode: {result.get('seg_mode', 'unspecified')}",
        f"- GT mask frame: {result.get('mask_frame', 'native')} (scored at each image's native size)",
        f"- missing predictions (counted wrong): {len(result['missing'])}; without mask: "
        f"{len(result['missing_mask'])}; without answer: {len(result['missing_answer'])}",
        "",
        "## Pairs per bucket",
        "",
        "| type | positive | negative |",
        "|---|---:|---:|",
    ]
    lines += [f"| {t} | {c['positive']} | {c['negative']} |" for t, c in result["counts"].items()]
    ci = seg["ci"]
    lines += [
        "",
        f"## Segmentation (native resolution; 95 % bootstrap CI, {seg['n_boot']} resamples)",
        "",
        "| gIoU | cIoU | N-Acc | Dice | false-empty | positives | negatives |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {_pct(seg['gIoU'])}{_ci(ci['gIoU'])} | {_pct(seg['cIoU'])}{_ci(ci['cIoU'])} | "
        f"{_pct(seg['N-Acc'])}{_ci(ci['N-Acc'])} | {_pct(seg['Dice'])} | {_pct(seg['false_empty_ratio'])} | "
        f"{seg['n_positive']} | {seg['n_negative']} |",
        "",
        "### Per lesion (JSON `target`)",
        "",
        "| lesion | gIoU | cIoU | N-Acc | Dice | false-empty | pos | neg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, v in seg["per_lesion"].items():
        p, n = v["positive"], v["negative"]
        lines.append(f"| {name} | {_pct(p['gIoU'])} | {_pct(p['cIoU'])} | {_pct(n['N-Acc'])} | {_pct(p['Dice'])} | "
                     f"{_pct(p['false_empty_ratio'])} | {p['n']} | {n['n']} |")
    lines += ["", "### Per type", "", "| type | gIoU | cIoU | N-Acc | pos | neg |", "|---|---:|---:|---:|---:|---:|"]
    for name, v in seg["per_type"].items():
        p, n = v["positive"], v["negative"]
        lines.append(f"| {name} | {_pct(p['gIoU'])} | {_pct(p['cIoU'])} | {_pct(n['N-Acc'])} | {p['n']} | {n['n']} |")
    lines += [
        "",
        "## Text accuracy (§15.2)",
        "",
        f"Total (headline: lesion-inference lesion-only, global exact): {_pct(txt['total']['accuracy'])} "
        f"({txt['total']['correct']}/{txt['total']['n']}); strict: {_pct(txt['total_strict']['accuracy'])}; "
        f"lenient: {_pct(txt['total_lenient']['accuracy'])}",
        "",
        "| type | positive | negative | overall | variant |",
        "|---|---:|---:|---:|---|",
    ]
    for name, v in txt["per_type"].items():
        p = v["positive"]
        variant = ""
        if "accuracy_strict" in p:
            variant = f"positive strict (lesion + certainty): {_pct(p['accuracy_strict'])}"
        if "accuracy_lenient" in p:
            variant = f"positive lenient (side): {_pct(p['accuracy_lenient'])}"
        if "accuracy_unordered" in p:
            variant += f"; labels in any order: {_pct(p['accuracy_unordered'])}"
        lines.append(f"| {name} | {_pct(p['accuracy'])} (n={p['n']}) | {_pct(v['negative']['accuracy'])} "
                     f"(n={v['negative']['n']}) | {_pct(v['overall']['accuracy'])} | {variant} |")
    types = list(txt["per_type"])
    lines += ["", "### Text accuracy per lesion", "", "| lesion | overall | " + " | ".join(types) + " |",
              "|---|---:|" + "---:|" * len(types)]
    for name, v in txt["per_lesion"].items():
        cells = [_pct(v[t]["accuracy"]) if t in v else "–" for t in types]
        lines.append(f"| {name} | {_pct(v['overall']['accuracy'])} | " + " | ".join(cells) + " |")
    if result["missing"]:
        shown = ", ".join(f"`{p}`" for p in result["missing"][:50])
        more = f" … and {len(result['missing']) - 50} more" if len(result["missing"]) > 50 else ""
        lines += ["", "## Missing predictions", "", shown + more]
    return "\n".join(lines) + "\n"
