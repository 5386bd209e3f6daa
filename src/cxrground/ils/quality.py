"""Scoring a built ILS dataset against the exact truth of a synthetic cohort.

- **Positive masks**: each generated lesion mask against the union of the truth masks of the same
  lesion whose overlapped labels meet the finding's reported location; gIoU (mean IoU) and cIoU
  (ΣI/ΣU) per lesion. A generated mask with no matching truth scores 0.
- **Negatives**: a negative pair is *correct* when no truth lesion of its target lies in its location
  (``lung`` = both lungs; ``heart`` = the heart is not enlarged). ``opacity`` negatives (and all
  lesion-inference negatives) are violated by any lung lesion (opacity is the umbrella term);
  ``consolidation`` by consolidation or pneumonia.
- **Recall**: share of present, reported truth findings whose lesion received a mask in the study.

These numbers say how well the built-in backends recover what the synthetic generator drew; they
are not a claim about real radiographs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.anatomy import ils_location_masks
from cxrground.datasets.synthetic import load_truth
from cxrground.io.files import finite_json
from cxrground.io.masks import decode_rle, read_mask_png
from cxrground.vocab.lesions import LESIONS, LUNG_LESIONS
from cxrground.vocab.locations import BOTH_LUNGS, HEART
from cxrground.vocab.traits import traits

__all__ = ["format_findings_quality", "format_quality", "quality_text", "score_against_truth", "score_findings"]

_VIOLATORS = {"opacity": set(LUNG_LESIONS), "consolidation": {"consolidation", "pneumonia"}}


def score_against_truth(dataset_dir: str | Path, cohort_dir: str | Path) -> dict[str, Any]:
    """Per-lesion mask quality, negative correctness and recall of a dataset built from a synthetic cohort."""
    out = Path(dataset_dir)
    data = json.loads((out / "mimic_ils_instruction_answer.json").read_text())
    truths = {t.study_id: t for t in load_truth(cohort_dir)}
    inter: dict[str, list[float]] = defaultdict(list)
    union: dict[str, list[float]] = defaultdict(list)
    neg_total: dict[str, int] = defaultdict(int)
    neg_ok: dict[str, int] = defaultdict(int)
    rec_total: dict[str, int] = defaultdict(int)
    rec_hit: dict[str, int] = defaultdict(int)
    for split in data.values():
        for key, study in split.items():
            truth = truths.get(key)
            if truth is None:
                continue
            shape = (truth.height, truth.width)
            lesion_masks = [(f, decode_rle(f.mask.rle, shape)) for f in truth.present_findings if f.mask]
            pairs = study["instruction_answer_pairs"]
            seen: set[str] = set()
            masked_lesions = set()
            for p in pairs["positive_pairs"]:
                if p["seg_mask_path"] in seen:
                    continue
                seen.add(p["seg_mask_path"])
                lesion = p["target"]
                masked_lesions.add(lesion)
                pred = read_mask_png(out / "lesion_mask" / p["seg_mask_path"], shape)
                rl = set(p["reported_location"])
                gt = np.zeros(shape, bool)
                for f, m in lesion_masks:
                    if f.lesion == lesion and (traits(lesion).heart_mask or rl & set(f.overlap_location)):
                        gt |= m
                inter[lesion].append(float((pred & gt).sum()))
                union[lesion].append(float((pred | gt).sum()))
            regions = _regions(truth, shape)
            for n in pairs["negative_pairs"]:
                target = n["target"]
                neg_total[target] += 1
                neg_ok[target] += int(_negative_correct(n, truth, lesion_masks, regions))
            for f in truth.present_findings:
                if f.reported:
                    rec_total[f.lesion] += 1
                    rec_hit[f.lesion] += int(f.lesion in masked_lesions)
    per_lesion: dict[str, Any] = {}
    for lesion in LESIONS:
        i, u = np.array(inter[lesion]), np.array(union[lesion])
        per_lesion[lesion] = {
            "masks": int(i.size),
            "gIoU": float(np.mean(i / np.maximum(u, 1e-5))) if i.size else float("nan"),
            "cIoU": float(i.sum() / (u.sum() + 1e-10)) if i.size else float("nan"),
            "negatives": neg_total[lesion],
            "negative_correct": neg_ok[lesion] / neg_total[lesion] if neg_total[lesion] else float("nan"),
            "reported_present": rec_total[lesion],
            "recall": rec_hit[lesion] / rec_total[lesion] if rec_total[lesion] else float("nan"),
        }
    all_i = np.concatenate([np.array(inter[x]) for x in LESIONS]) if any(inter.values()) else np.zeros(0)
    all_u = np.concatenate([np.array(union[x]) for x in LESIONS]) if any(union.values()) else np.zeros(0)
    total = {
        "masks": int(all_i.size),
        "gIoU": float(np.mean(all_i / np.maximum(all_u, 1e-5))) if all_i.size else float("nan"),
        "cIoU": float(all_i.sum() / (all_u.sum() + 1e-10)) if all_i.size else float("nan"),
        "negatives": sum(neg_total.values()),
        "negative_correct": sum(neg_ok.values()) / max(1, sum(neg_total.values())),
        "reported_present": sum(rec_total.values()),
        "recall": sum(rec_hit.values()) / max(1, sum(rec_total.values())),
    }
    return {"per_lesion": per_lesion, "total": total}


def _pct(v: float) -> str:
    return "–" if v != v else f"{100 * v:.1f}"


def _regions(truth: Any, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    right = decode_rle(truth.anatomy["right_lung"].rle, shape)
    left = decode_rle(truth.anatomy["left_lung"].rle, shape)
    regions = ils_location_masks(right, left)
    regions[BOTH_LUNGS] = right | left
    return regions


def _negative_correct(pair: dict[str, Any], truth: Any, lesion_masks: list, regions: dict[str, np.ndarray]) -> bool:
    target = pair["target"]
    if traits(target).heart_mask:  # the lesion is the enlarged heart itself
        return truth.heart_status != "enlarged"
    violators = _VIOLATORS.get(target, {target})
    if pair["type"] == "lesion_inference":
        violators = set(LUNG_LESIONS)
    location = pair["location"]
    area = np.zeros_like(next(iter(regions.values())))
    for label in location:
        if label != HEART:
            area |= regions[label]
    return not any(f.lesion in violators and (m & area).any() for f, m in lesion_masks)


def quality_text(dataset_dir: str | Path, cohort_dir: str | Path, as_json: bool = False) -> str:
    """:func:`score_against_truth` as JSON, or as :func:`format_quality`'s table."""
    scores = score_against_truth(dataset_dir, cohort_dir)
    return json.dumps(finite_json(scores), indent=2, allow_nan=False) if as_json else format_quality(scores)


def format_quality(scores: dict[str, Any]) -> str:
    """A Markdown table of :func:`score_against_truth` results."""
    lines = ["| lesion | masks | gIoU % | cIoU % | recall % | negatives | negatives correct % |",
             "|---|---|---|---|---|---|---|"]
    for name, row in [*scores["per_lesion"].items(), ("total", scores["total"])]:
        lines.append(f"| {name} | {row['masks']} | {_pct(row['gIoU'])} | {_pct(row['cIoU'])} | {_pct(row['recall'])} "
                     f"| {row['negatives']} | {_pct(row['negative_correct'])} |")
    return "\n".join(lines)


def score_findings(dataset_dir: str | Path, cohort_dir: str | Path) -> dict[str, Any]:
    """Structured findings (``findings.jsonl``) vs the report truth, per lesion.

    Per study and lesion: truth positive = a present, reported finding; predicted positive = a present or
    uncertain finding. ``certainty_acc``: on true positives, tentative ↔ uncertain agreement of the first
    finding of that lesion; ``location_exact``: its reported location equals the truth's (same order).
    """
    out = Path(dataset_dir)
    truths = {t.study_id: t for t in load_truth(cohort_dir)}
    predicted: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    studies: set[str] = set()
    for line in (out / "findings.jsonl").read_text().splitlines():
        f = json.loads(line)
        studies.add(f["study"])
        if f.get("lesion") and f["assertion"] != "absent":
            predicted[(f["study"], f["lesion"])].append(f)
    rows: dict[str, dict[str, int]] = {lesion: defaultdict(int) for lesion in (*LESIONS, "total")}
    for key in studies:
        truth = truths.get(key)
        if truth is None:
            continue
        true_f = {}
        for f in truth.present_findings:
            if f.reported:
                true_f.setdefault(f.lesion, f)
        for lesion in LESIONS:
            t, p = true_f.get(lesion), predicted.get((key, lesion))
            for row in (rows[lesion], rows["total"]):
                row["tp"] += int(t is not None and bool(p))
                row["fp"] += int(t is None and bool(p))
                row["fn"] += int(t is not None and not p)
                if t is not None and p:
                    row["cert_ok"] += int((t.certainty == "tentative") == (p[0]["assertion"] == "uncertain"))
                    row["loc_ok"] += int(list(t.reported_location) == list(p[0]["reported_location"]))
    result = {}
    for name, r in rows.items():
        tp, fp, fn = r["tp"], r["fp"], r["fn"]
        result[name] = {"tp": tp, "fp": fp, "fn": fn,
                        "precision": tp / (tp + fp) if tp + fp else float("nan"),
                        "recall": tp / (tp + fn) if tp + fn else float("nan"),
                        "certainty_acc": r["cert_ok"] / tp if tp else float("nan"),
                        "location_exact": r["loc_ok"] / tp if tp else float("nan")}
    return result


def format_findings_quality(scores: dict[str, Any]) -> str:
    """A Markdown table of :func:`score_findings` results."""
    lines = ["| lesion | TP | FP | FN | precision % | recall % | certainty % | location exact % |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in scores.items():
        lines.append(f"| {name} | {r['tp']} | {r['fp']} | {r['fn']} | {_pct(r['precision'])} | {_pct(r['recall'])} "
                     f"| {_pct(r['certainty_acc'])} | {_pct(r['location_exact'])} |")
    return "\n".join(lines)
