"""The CheXpercept benchmark card (``card.md``): the §1.4 arithmetic requested and achieved, and the provenance."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cxrground.percept.cases import SAMPLE_PATHS, TASKS, Review, count_arithmetic
from cxrground.percept.options import BuildOptions
from cxrground.percept.plans import LUNG_EDGE_MAX, REFINEMENT_BACKEND
from cxrground.vocab.lesions import ABBREVIATIONS, CURATION_ORDER, LESIONS
from cxrground.vocab.percept_templates import PATH_ABBREVIATIONS, PATH_REVISION_REQUIRED

__all__ = ["answer_balance", "answer_lines", "render_card"]


def _arith_table(per_lesion: Sequence[int]) -> list[str]:
    lf, rf, rr = per_lesion
    table = count_arithmetic(per_lesion)
    lung = table.items_per_lesion["pneumonia"]
    card = table.items_per_lesion["cardiomegaly"]
    return [
        "| quantity | arithmetic | total |", "|---|---|---|",
        f"| CXRs (one per case) | {len(LESIONS)} lesions × {lf + rf + rr:,} cases | **{table.cxrs:,}** |",
        f"| items, each lung lesion | {lf}×1 (LF) + {rf}×(1+1+4) (RF) + {rr}×(1+1+3+4) (RR) | {lung:,} |",
        f"| items, cardiomegaly | {lf}×1 + {rf}×2 + {rr}×(1+1+3) | {card:,} |",
        f"| all items | {len(LESIONS) - 1} × {lung:,} + {card:,} | **{table.items:,}** |", "",
        "| task | count |", "|---|---|",
        *(f"| {t} | {n:,} |" for t, n in table.tasks.items()), ""]


def shortfall_lines(requested: Mapping[str, int], achieved: Mapping[str, Mapping[str, int]],
                    pools: Mapping[str, Mapping[str, int]], taken: Mapping[str, Mapping[str, int]],
                    sampled: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The card's "Why some counts fall short" section: one line per lesion and path built below its request,
    saying how many candidates were eligible, how many of them another case's CXR took, and how many sampled
    cases were dropped while rendering; nothing when every request was met."""
    lines = []
    for lesion in LESIONS:
        for path in SAMPLE_PATHS:
            want, got = requested[path], achieved.get(lesion, {}).get(path, 0)
            if got >= want:
                continue
            pool = pools.get(lesion, {}).get(path, 0)
            reasons = [f"{pool:,} eligible candidate{'s' if pool != 1 else ''}" + (
                " after the drops below" if pool else " (the drops below, or none in the dataset)")]
            if taken.get(lesion, {}).get(path, 0):
                reasons.append(f"{taken[lesion][path]:,} of them on CXRs that other cases took (no CXR is reused)")
            lost = sampled.get(lesion, {}).get(path, 0) - got
            if lost > 0:
                reasons.append(f"{lost:,} sampled case{'s' if lost != 1 else ''} dropped while rendering")
            lines.append(f"- {lesion} {PATH_ABBREVIATIONS[path]}: {got:,} of {want:,}: " + "; ".join(reasons) + ".")
    if not lines:
        return []
    return ["", "### Why some counts fall short", "", *lines]


def render_card(opts: BuildOptions, achieved: Mapping[str, Mapping[str, int]], dropped: Mapping[str, int],
                review: Review | None, ious: Sequence[float], max_cover: float | None, mask_source: str,
                split_of: Mapping[str, int], pools: Mapping[str, Mapping[str, int]],
                taken: Mapping[str, Mapping[str, int]] | None = None,
                sampled: Mapping[str, Mapping[str, int]] | None = None,
                hearts: Mapping[str, int] | None = None, sizes: Sequence[Sequence[int]] = (),
                cases: Iterable[Mapping[str, Any]] = ()) -> str:
    """The benchmark card: requested and achieved counts (§1.4) and why any fell short, provenance, review, IoU,
    distractors, drops. ``pools``: eligible candidates per lesion and path; ``taken``: those of them left out
    because another case had their CXR; ``sampled``: cases sampled (before any was dropped while rendering);
    ``hearts``: the sampled positive cases by where their heart mask comes from; ``sizes``: the cases' image sizes
    ``[H, W]``; ``cases``: the ``chexpercept.json`` entries, whose answers the card tallies (:func:`answer_lines`)."""
    table = count_arithmetic(achieved)
    req = dict(zip(SAMPLE_PATHS, opts.per_lesion, strict=True))
    lines = ["# CheXpercept benchmark card", "",
             "Built by `cxrground percept build` following CHEXPERCEPT.md. Seed "
             f"{opts.seed}; settings hash `{opts.settings_hash()}`.", "",
             f"## Requested arithmetic (§1.4) for (LF, RF, RR) = {tuple(opts.per_lesion)} per lesion", ""]
    lines += _arith_table(opts.per_lesion)
    lines += ["## Achieved counts", "",
              f"Cases: **{table.cxrs:,}** (one CXR per case, no CXR reused); items: **{table.items:,}**.", "",
              "| lesion | LF requested | LF achieved | RF requested | RF achieved | RR requested | RR achieved "
              "| eligible LF / RF / RR | items |", "|---|---|---|---|---|---|---|---|---|"]
    for lesion in LESIONS:
        row = achieved.get(lesion, {})
        pool = pools.get(lesion, {})
        cells = " | ".join(f"{req[p]:,} | {row.get(p, 0):,}" for p in SAMPLE_PATHS)
        elig = " / ".join(f"{pool.get(p, 0):,}" for p in SAMPLE_PATHS)
        lines.append(f"| {lesion} | {cells} | {elig} | {table.items_per_lesion[lesion]:,} |")
    lines += ["", "### Items per lesion, path and task (achieved)", "",
              "| lesion | path | cases | " + " | ".join(TASKS) + " |", "|---|---|---|" + "---|" * len(TASKS)]
    for lesion in LESIONS:
        for path in SAMPLE_PATHS:
            n = achieved.get(lesion, {}).get(path, 0)
            one = count_arithmetic({lesion: {path: n}}).tasks
            lines.append(f"| {lesion} | {PATH_ABBREVIATIONS[path]} | {n:,} | "
                         + " | ".join(f"{one[t]:,}" for t in TASKS) + " |")
    lines += ["", "| task | count (achieved) |", "|---|---|", *(f"| {t} | {n:,} |" for t, n in table.tasks.items())]
    lines += shortfall_lines(req, achieved, pools, taken or {}, sampled or {})
    lines += answer_lines(cases)
    iou_text = ("no positive case" if not ious else
                f"mean {statistics.fmean(ious):.3f}, median {statistics.median(ious):.3f}, "
                f"min {min(ious):.3f}, max {max(ious):.3f} over {len(ious)} positive cases")
    review_text = ("**No expert review was applied**: every candidate mask and every negative was taken as is."
                   if review is None else
                   f"Expert review applied from `{review.source}`: only items with an explicit `accept` are used; "
                   f"{sum(1 for d, _ in review.decisions.values() if d == 'accept')} accepted, "
                   f"{sum(1 for d, _ in review.decisions.values() if d == 'reject')} rejected, "
                   f"{sum(1 for d, _ in review.decisions.values() if not d)} blank rows; reviewers: "
                   f"{', '.join(sorted({r for _, r in review.decisions.values() if r})) or '(none named)'}.")
    lines += ["", "## Provenance and backends", "",
              f"- Source splits read: {', '.join(opts.splits)} (candidates per split: "
              f"{', '.join(f'{k}: {v}' for k, v in sorted(split_of.items())) or 'none'}). The reference drew "
              "from MIMIC-ILS train, on which its candidate model was trained.",
              f"- Candidate masks: {mask_source}.",
              "- Lung/heart masks for the geometry (§5.1): "
              + (f"`{opts.anatomy}` (given with --anatomy)." if opts.anatomy else
                 "the ILS dataset's `anatomy.jsonl` (the backends that built it)."),
              *heart_lines(hearts),
              *size_lines(sizes),
              f"- Refinement: {REFINEMENT_BACKEND}.",
              f"- Deformer: `{opts.deformer}`" + (f" (SAM weights `{opts.sam_model}`)" if opts.sam_model else "") + ".",
              f"- RF ratio {opts.rf_ratio_text()}; candidates per lesion ≤ {opts.max_candidates}; negatives per "
              f"lesion ≤ {opts.max_negatives}; exclude CXRs of positives from negatives: {opts.exclude_positive_cxrs}.",
              "- Negative (LF) candidates: the first global negatives in JSON order, lesions claiming CXRs in the "
              "reference's curation order " + ", ".join(ABBREVIATIONS[x] for x in CURATION_ORDER)
              + " (a CXR goes to the first lesion that takes it); "
              + ("any film with the lesion's global negative (the reference's rule, --lf-any-film)." if opts.lf_any_film
                 else "a lung-opacity lesion takes only films whose report names no lung-opacity lesion (no 'no "
                 "pneumonia' case on a film with consolidation)."),
              "- Costophrenic angle of a lung-base zone (§19.8): "
              + ("either side's (the reference's behaviour, --cpa-either-side)." if opts.cpa_either_side else
                 "its own side's only."),
              "- Final sample: seeded uniform sample per lesion and path (shuffle seeded by (seed, lesion, path), "
              "taken in order skipping CXRs already used), one CXR per case, no CXR reused across cases.",
              f"- Seed: {opts.seed}.", "",
              "## Review status", "", review_text, "",
              "## Optimal vs candidate mask (§19.6)", "",
              f"IoU between the refined (optimal) mask and the candidate mask: {iou_text}.", "",
              "## Location distractors (§9.4)", "",
              "Maximum coverage of any negative location option used: "
              + ("n/a" if max_cover is None else f"{max_cover:.3f}")
              + f" (strict switch ≤ 0.05: {'on' if opts.strict_negatives else 'off'}).", "",
              "## Dropped candidates, by reason", "", "| reason | cases |", "|---|---|"]
    for reason, n in sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| {reason} | {n:,} |")
    if not dropped:
        lines.append("| (none) | 0 |")
    explained = [f"- *{cause}*: {meaning}" for cause, meaning in DROP_MEANINGS.items()
                 if any(cause in reason for reason in dropped)]
    lines += ["", *(["What the reasons mean:", "", *explained, ""] if explained else []),
              "Per-case reasons are in `failures.jsonl`.", ""]
    return "\n".join(lines)


#: The card's question types, in asking order: (name, where the question is in a case entry, multi-select).
_QUESTIONS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("detection", ("detection_qa",), False),
    ("contour evaluation", ("contour_qa", "contour_eval_qa"), False),
    ("expansion", ("contour_qa", "contour_revision_qa_expansion"), True),
    ("contraction", ("contour_qa", "contour_revision_qa_contraction"), True),
    ("revision result", ("contour_qa", "contour_revision_qa_revision_result"), False),
    ("distribution", ("attribute_extraction_qa", "distribution"), False),
    ("location", ("attribute_extraction_qa", "location"), True),
    ("severity", ("attribute_extraction_qa", "severity/measurement"), False),
    ("comparison", ("attribute_extraction_qa", "comparison"), False),
)
_STAGE3 = frozenset({"expansion", "contraction", "revision result"})


def _question(case: Mapping[str, Any], keys: Sequence[str]) -> Mapping[str, Any] | None:
    q: Any = case
    for key in keys:
        q = q.get(key) if isinstance(q, Mapping) else None
    return q if isinstance(q, Mapping) else None


def answer_balance(cases: Iterable[Mapping[str, Any]]) -> dict[str, tuple[Counter, Counter]]:
    """Per question type asked in ``cases`` (``chexpercept.json`` entries; Stage 3 on RR cases only, as asked):
    how often each option is a correct one (``None`` for the None option of a multi-select question) and how often
    each whole answer is the answer (the answer as text: ``2``, ``1,3``, ``None``)."""
    out: dict[str, tuple[Counter, Counter]] = {}
    for case in cases:
        for name, keys, multi in _QUESTIONS:
            if name in _STAGE3 and case.get("qa_path") != PATH_REVISION_REQUIRED:
                continue
            q = _question(case, keys)
            if q is None or q.get("answer_index") is None:
                continue
            gt = q["answer_index"] if isinstance(q["answer_index"], list) else [q["answer_index"]]
            n_options = len(q.get("answer_options") or ())
            labels = ["None" if multi and i == n_options else str(i) for i in sorted(gt)]
            options, answers = out.setdefault(name, (Counter(), Counter()))
            options.update(labels)
            answers[",".join(labels)] += 1
    return out


def _option_order(item: tuple[str, int]) -> tuple[bool, int]:
    """Options by index, the None option last."""
    return item[0] == "None", int(item[0]) if item[0].isdigit() else 0


def answer_lines(cases: Iterable[Mapping[str, Any]]) -> list[str]:
    """The card's "Answer balance" section: per question type the correct options' histogram and the share of the
    commonest answer (what always giving it scores); nothing without cases."""
    balance = answer_balance(cases)
    if not balance:
        return []
    lines = ["", "### Answer balance", "",
             "Correct option per question type (`index: items`; a multi-select item counts once per correct option, "
             "`None`: its None option) and the commonest whole answer with its share, which a model that always "
             "gives it scores; `percept score` reports these baselines per path (§16).", "",
             "| question | items | correct options | commonest answer | share |", "|---|---|---|---|---|"]
    for name, _keys, _multi in _QUESTIONS:
        if name not in balance:
            continue
        options, answers = balance[name]
        n = sum(answers.values())
        hist = ", ".join(f"{k}: {v}" for k, v in sorted(options.items(), key=_option_order))
        top, count = sorted(answers.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        lines.append(f"| {name} | {n:,} | {hist} | {top} | {count / n:.0%} |")
    return lines


#: What the cause at the end of a drop reason of the card says about the candidate.
DROP_MEANINGS: dict[str, str] = {
    "no overlapping anatomy": "a component of the candidate mask overlaps no lung region or heart the geometry "
                              "reads, so it cannot be deformed towards one; usually a mask lying outside the lungs "
                              "(on the mediastinum, the abdomen, devices or outside the body): worth a look",
    "lung mask reaches the film edge": f"the lung mask runs into the border band of the film's bottom or side edge "
                                       f"along more than {LUNG_EDGE_MAX:.0%} of it (a lung running into the "
                                       "abdomen, or a film cropped through the lungs): its zones and points cannot "
                                       "be trusted",
    "heart mask is an estimate": "the study's heart mask is an outline fitted to the film and lungs, not a "
                                 "segmented heart (the built-in anatomy's), and --drop-estimated-hearts keeps such "
                                 "outlines from being shown as the optimal heart contour",
}


#: Films whose short side is below this many pixels are counted on the card (points and deformations shrink with
#: the film: the §10.1 point disc is 15 px at 1024).
SMALL_FILM: int = 512


def size_lines(sizes: Sequence[Sequence[int]]) -> list[str]:
    """The card's line on the cases' film sizes (none without cases)."""
    if not sizes:
        return []
    ordered = sorted((int(h), int(w)) for h, w in sizes)  # by height, then width
    small = sum(1 for h, w in ordered if min(h, w) < SMALL_FILM)
    line = (f"- Films: {len(ordered):,}, from {ordered[0][0]}×{ordered[0][1]} to {ordered[-1][0]}×{ordered[-1][1]} "
            "pixels (H×W)")
    if small:
        line += (f"; {small:,} with a short side under {SMALL_FILM} px, where the point discs (15 px at 1024) and the "
                 "deformations shrink with the film and may be hard to see")
    return [line + "."]


def heart_lines(hearts: Mapping[str, int] | None) -> list[str]:
    """The card's line on where the positive cases' heart masks come from (none without counts)."""
    if not hearts:
        return []
    total = sum(hearts.values())
    parts = ", ".join(f"{source} {n:,}" for source, n in sorted(hearts.items(), key=lambda kv: (-kv[1], kv[0])))
    line = f"- Heart masks of the {total:,} sampled positive cases, by source: {parts}."
    if hearts.get("estimate"):
        line += (" An `estimate` is an outline fitted to the lungs and the film, not a segmented heart: the "
                 "cardiomegaly masks, and the heart the geometry reads, are estimates there.")
    return [line]
