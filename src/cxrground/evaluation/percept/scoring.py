"""``percept score``: the scoring views of CHEXPERCEPT.md §15 and the chance baselines of §16.

Input: ``RUN/cases.json`` (the selected cases, the denominators) and ``RUN/results.jsonl`` (last line per
case and repeat wins). A selected case with no result line is *missing*; a missing case, and a case that
failed (it could not be run to its end), is scored with all its stages wrong and listed (§15), whatever it
answered before it failed; the answers it gave still count in the parse rates. A line that holds no valid
record (not UTF-8, not JSON, fields of the wrong type) is listed in ``bad_lines`` by file and line number, and the
case it names counts as failed (:func:`score_run`). Empty, unparseable, failed and missing answers
count as wrong and stay in every denominator; the other answers are scored as the reference scores the reference
parser's numbers (:func:`~.parsing.is_correct`; an ``invalid-format`` answer by its first number or its set).

Repeats (``percept eval --repeats N``, N > 1): every number is the mean over the N repeats (per case, the
mean of its N correctness values; bootstrap CIs resample cases of these means), and each stage, depth and
sub-task block gains ``spread``: the accuracy of every repeat (``per_repeat``), their sample standard
deviation (``std``, ddof 1), ``min`` and ``max``. Depth distributions are mean counts per repeat; parse
rates pool every answer of every repeat; ``failed_units`` / ``missing_units`` list ``[case_id, repeat]``.
With one repeat the output is exactly that of a single run (no ``spread``, no ``repeats`` key).

Per case: S1 = detection, S2 = contour evaluation, S3 = expansion ∧ contraction ∧ revision result,
S4 = the four attributes (lung lesions only). Views per path (RR, RF, LF): **Oracle-Passed** = raw stage
correctness; **End-to-End** = the stage and every earlier asked stage correct; **Depth** = consecutive
End-to-End-correct stages from Stage 1, +1 for cardiomegaly RR/RF cases whose last asked stage is
End-to-End correct. Depth is one number per case; the summary CSV repeats it on both setting rows.
Sub-task accuracies (Oracle-Passed): expansion, contraction, revision result over RR; the attributes over
RR ∪ RF pooled. The overall aggregate pools all cases asked a stage across paths (case-weighted).
``lenient`` numbers use the option-text matches of :mod:`.parsing` in place of the canonical parse.

95 % CIs: percentile bootstrap over cases (:func:`cxrground.evaluation.bootstrap.bootstrap_ci`, seeded).

Chance (§16, mean over the actual items): uniform over the valid answers; single-pick (one random
option; a multi-select item is correct only when its GT is a single option: ``[|GT| = 1] / n``);
majority answer per question type and path (the most frequent GT answer among those items); always-Yes
for detection and contour evaluation per path. End-to-End chance per case = product of its stages' chances.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.errors import InputError
from cxrground.evaluation.bootstrap import bootstrap_ci
from cxrground.evaluation.percept.conversation import ATTRIBUTE_QIDS, QIDS, REVISION_QIDS
from cxrground.evaluation.percept.parsing import LABEL_ORDER
from cxrground.evaluation.percept.reference_names import REFERENCE_QUESTION_NAMES
from cxrground.evaluation.percept.runner import (
    CASES_FILE,
    CONFIG_FILE,
    RESULTS_FILE,
    USAGE_FILE,
    ResultLines,
    read_results,
)
from cxrground.vocab.percept_templates import PATH_ABBREVIATIONS
from cxrground.vocab.traits import LESION_TRAITS, traits

__all__ = ["PATH_ORDER", "SCORE_FILE", "SUMMARY_CSV", "case_view", "read_config", "read_plans", "reference_rows",
           "run_records", "score_lines", "score_records", "score_repeats", "score_run", "spread_rows",
           "write_csvs", "zero_path_note"]

PATH_ORDER: Final[tuple[str, ...]] = ("RR", "RF", "LF")
SCORE_FILE: Final[str] = "score.json"
SUMMARY_CSV: Final[str] = "model_performance_summary.csv"
REVISION_CSV: Final[str] = "model_performance_detail_contour_revision.csv"
ATTRIBUTE_CSV: Final[str] = "model_performance_detail_attribute_extraction.csv"
SUMMARY_COLUMNS: Final[tuple[str, ...]] = ("path", "model", "setting", "acc(stage1)", "acc(stage2)", "acc(stage3)",
                                           "acc(stage4)", "depth")
#: Parse labels whose rates are reported: those of :func:`~.parsing.parse_answer`, then ``failed`` (no answer).
LABELS: Final[tuple[str, ...]] = (*LABEL_ORDER, "failed")
#: The reference CSVs name paths in full (``revision_required`` …) and the severity question by its §12 key.
CSV_PATH_NAMES: Final[dict[str, str]] = {short: full for full, short in PATH_ABBREVIATIONS.items()}
CSV_QUESTION_NAMES: Final[dict[str, str]] = REFERENCE_QUESTION_NAMES
#: ``path`` of the two detail CSVs: the paths each sub-task is pooled over (as the reference writes it).
DETAIL_PATHS: Final[dict[str, str]] = {REVISION_CSV: "revision_required",
                                       ATTRIBUTE_CSV: "revision_required+revision_free"}


def _chance(q: dict[str, Any]) -> float:
    n = int(q["n_options"])
    if q["multi"]:
        return 1.0 / 2 ** (n - 1)  # 2^k valid answers (k = n - 1 point / region options)
    return 1.0 / n


def _single_pick(q: dict[str, Any]) -> float:
    n = int(q["n_options"])
    return (1.0 if len(q["gt"]) == 1 else 0.0) / n if q["multi"] else 1.0 / n


def case_view(plan: dict[str, Any], rec: dict[str, Any] | None, lenient: bool = False) -> dict[str, Any]:
    """Per-stage raw / End-to-End correctness, depth and per-question answers of one case."""
    answered = {q["qid"]: q for q in (rec or {}).get("questions", [])}
    key = "correct_lenient" if lenient else "correct"
    run_through = rec is not None and rec.get("status", "ok") != "failed"  # a failed case scores every stage wrong
    questions = []
    for q in plan["questions"]:
        a = answered.get(q["qid"])
        label = a.get("label", "failed") if a is not None else "failed"
        questions.append({**q, "correct": bool(run_through and a and a.get(key)), "label": label})
    stages = sorted({q["stage"] for q in questions})
    raw = {s: all(q["correct"] for q in questions if q["stage"] == s) for s in stages}
    e2e: dict[int, bool] = {}
    ok = True
    for s in stages:
        ok = ok and raw[s]
        e2e[s] = ok
    depth = 0
    for s in stages:
        if not e2e[s]:
            break
        depth += 1
    if plan["lesion"] in LESION_TRAITS and plan["path"] != "LF" and e2e[stages[-1]]:
        depth += traits(plan["lesion"]).percept.depth_bonus
    return {"case_id": plan["case_id"], "path": plan["path"], "lesion": plan["lesion"], "raw": raw, "e2e": e2e,
            "depth": depth, "questions": questions,
            "status": "missing" if rec is None else rec.get("status", "ok")}


def _stat(values: Sequence[float], n_boot: int, seed: int) -> dict[str, Any]:
    arr = np.asarray(values, float)
    if arr.size == 0:
        return {"acc": None, "ci": None, "n": 0}
    ci = bootstrap_ci(arr, lambda a: a.mean(axis=1), n_boot=n_boot, seed=seed)
    return {"acc": float(arr.mean()), "ci": list(ci) if ci else None, "n": int(arr.size)}


def _spread(per_repeat: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Accuracy of every repeat, their sample standard deviation, min and max."""
    accs = [float(np.mean(x)) for x in per_repeat]
    return {"per_repeat": accs, "std": float(np.std(accs, ddof=1)), "min": min(accs), "max": max(accs)}


def _stat_r(per_repeat: Sequence[Sequence[float]], n_boot: int, seed: int) -> dict[str, Any]:
    """:func:`_stat` of the per-item means over repeats, with ``spread`` when there are several repeats."""
    arr = np.asarray(per_repeat, float)
    block = _stat(arr.mean(axis=0) if arr.size else [], n_boot, seed)
    if len(per_repeat) > 1 and arr.size:
        block["spread"] = _spread(per_repeat)
    return block


Runs = Sequence[Sequence[dict[str, Any]]]  # case views per repeat, in plan order


def _stage_block(runs: Runs, sel: Sequence[int], which: str, n_boot: int, seed: int) -> dict[str, Any]:
    out = {}
    for s in (1, 2, 3, 4):
        items = [i for i in sel if s in runs[0][i][which]]
        out[f"stage{s}"] = _stat_r([[float(views[i][which][s]) for i in items] for views in runs], n_boot, seed)
    return out


def _questions(views: Iterable[dict[str, Any]], qid: str, paths: Sequence[str]) -> list[dict[str, Any]]:
    return [q for v in views if v["path"] in paths for q in v["questions"] if q["qid"] == qid]


def _baselines(views: list[dict[str, Any]]) -> dict[str, Any]:
    per_q: dict[str, dict[str, Any]] = {}
    for qid in QIDS:
        per_q[qid] = {}
        for path in PATH_ORDER:
            items = _questions(views, qid, [path])
            if not items:
                continue
            answers = Counter(tuple(q["gt"]) for q in items)
            top, count = answers.most_common(1)[0]
            entry = {"n": len(items), "chance": float(np.mean([_chance(q) for q in items])),
                     "single_pick": float(np.mean([_single_pick(q) for q in items])),
                     "majority_answer": list(top), "majority": count / len(items)}
            if qid in ("detection", "contour_eval"):
                entry["always_yes"] = float(np.mean([q["gt"] == [1] for q in items]))
            per_q[qid][path] = entry
    stages: dict[str, dict[str, float]] = {}
    for path in PATH_ORDER:
        cases = [v for v in views if v["path"] == path]
        if not cases:
            continue
        stage_chance: dict[str, list[float]] = {}
        e2e_chance: dict[str, list[float]] = {}
        for v in cases:
            running = 1.0
            for s in sorted(v["raw"]):
                p = float(np.prod([_chance(q) for q in v["questions"] if q["stage"] == s]))
                running *= p
                stage_chance.setdefault(f"stage{s}", []).append(p)
                e2e_chance.setdefault(f"stage{s}", []).append(running)
        stages[path] = {"oracle_passed": {k: float(np.mean(x)) for k, x in stage_chance.items()},
                        "end_to_end": {k: float(np.mean(x)) for k, x in e2e_chance.items()}}
    return {"questions": per_q, "stages": stages}


def _parse_rates(views: list[dict[str, Any]]) -> dict[str, Any]:
    def rates(items: list[dict[str, Any]]) -> dict[str, Any]:
        c = Counter(q["label"] for q in items)
        n = len(items)
        return {"n": n, **{lab: (c[lab] / n if n else None) for lab in LABELS}}

    allq = [q for v in views for q in v["questions"]]
    return {"overall": rates(allq),
            "per_question": {qid: rates([q for q in allq if q["qid"] == qid]) for qid in QIDS},
            "per_stage": {f"stage{s}": rates([q for q in allq if q["stage"] == s]) for s in (1, 2, 3, 4)}}


def score_records(plans: list[dict[str, Any]], results: dict[str, dict[str, Any]], n_boot: int = 1000,
                  seed: int = 0) -> dict[str, Any]:
    """All views of §15 and the baselines of §16 from case plans and the result records of one run."""
    return score_repeats(plans, [results], n_boot=n_boot, seed=seed)


def score_repeats(plans: list[dict[str, Any]], per_repeat: Sequence[dict[str, dict[str, Any]]], n_boot: int = 1000,
                  seed: int = 0) -> dict[str, Any]:
    """:func:`score_records` over repeats (case id -> record, one mapping per repeat): means and spreads."""
    if not per_repeat:
        raise ValueError("no repeats to score")
    runs = [[case_view(p, res.get(p["case_id"])) for p in plans] for res in per_repeat]
    lenient = [[case_view(p, res.get(p["case_id"]), lenient=True) for p in plans] for res in per_repeat]
    views = runs[0]
    n_rep = len(runs)
    everything = range(len(views))
    paths: dict[str, Any] = {}
    for path in PATH_ORDER:
        sel = [i for i in everything if views[i]["path"] == path]
        if not sel:
            continue
        depths = [[float(run[i]["depth"]) for i in sel] for run in runs]
        counts = [sum(int(run[i]["depth"]) == k for run in runs for i in sel) for k in range(0, 5)]
        paths[path] = {"n": len(sel), "end_to_end": _stage_block(runs, sel, "e2e", n_boot, seed),
                       "oracle_passed": _stage_block(runs, sel, "raw", n_boot, seed),
                       "depth": {**_stat_r(depths, n_boot, seed), "mean": float(np.mean(depths)),
                                 "distribution": {str(k): c if n_rep == 1 else c / n_rep
                                                  for k, c in enumerate(counts)}}}
    subtasks: dict[str, Any] = {}
    for qid in (*REVISION_QIDS, *ATTRIBUTE_QIDS):
        over = ("RR",) if qid in REVISION_QIDS else ("RR", "RF")
        correct = [[float(q["correct"]) for q in _questions(run, qid, over)] for run in runs]
        loose = [[float(q["correct"]) for q in _questions(run, qid, over)] for run in lenient]
        subtasks[qid] = {**_stat_r(correct, n_boot, seed), "lenient_acc": _stat_r(loose, 0, seed)["acc"],
                         "paths": list(over)}
    per_lesion: dict[str, Any] = {}
    for lesion in sorted({v["lesion"] for v in views}):
        per_lesion[lesion] = {}
        for path in PATH_ORDER:
            sel = [i for i in everything if views[i]["lesion"] == lesion and views[i]["path"] == path]
            if sel:
                per_lesion[lesion][path] = {
                    "n": len(sel), "depth": float(np.mean([[run[i]["depth"] for i in sel] for run in runs])),
                    "end_to_end": {k: b["acc"] for k, b in _stage_block(runs, sel, "e2e", 0, seed).items()},
                    "oracle_passed": {k: b["acc"] for k, b in _stage_block(runs, sel, "raw", 0, seed).items()}}
    units = [(v["case_id"], r, v["status"]) for r, run in enumerate(runs) for v in run]
    score: dict[str, Any] = {
        "n_cases": len(views), "paths": paths, "subtasks": subtasks, "per_lesion": per_lesion,
        "overall": {"n": len(views), "end_to_end": _stage_block(runs, everything, "e2e", n_boot, seed),
                    "oracle_passed": _stage_block(runs, everything, "raw", n_boot, seed)},
        "chance": _baselines(views), "parse": _parse_rates([v for run in runs for v in run]),
        "failed_cases": sorted({cid for cid, _, status in units if status == "failed"}),
        "missing_cases": sorted({cid for cid, _, status in units if status == "missing"}),
        "bootstrap": {"n_boot": n_boot, "seed": seed, "level": 0.95},
    }
    if n_rep > 1:
        score["repeats"] = n_rep
        score["failed_units"] = sorted([cid, r] for cid, r, status in units if status == "failed")
        score["missing_units"] = sorted([cid, r] for cid, r, status in units if status == "missing")
    return score


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("not an evaluation run folder (file missing)", path) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start + 1})", path) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON ({exc.msg}, line {exc.lineno})", path) from None
    except OSError as exc:
        raise InputError(f"cannot be read ({exc.strerror or exc})", path) from None


def read_config(run: str | Path) -> dict[str, Any]:
    """The settings of the run folder ``run`` (the ``config`` object of its ``config.json``); a missing or invalid
    file is an :class:`InputError` naming it."""
    path = Path(run) / CONFIG_FILE
    data = _read_json(path)
    cfg = data.get("config") if isinstance(data, dict) else None
    if not isinstance(cfg, dict):
        raise InputError('not a run configuration: expected {"config": {...}}, as percept eval writes it', path)
    for key in ("model", "oracle"):
        if not isinstance(cfg.get(key), str):
            raise InputError(f"the configuration has no {key} (a string)", path)
    for key, low in (("repeats", 1), ("seed", None)):
        value = cfg.get(key, low or 0)
        if type(value) is not int or (low is not None and value < low):
            raise InputError(f"the configuration's {key} {value!r} is not an integer"
                             + (f" >= {low}" if low is not None else ""), path)
    return cfg


def _plan_problem(plan: Any) -> str | None:
    """Why ``plan`` is not a case plan of ``cases.json`` (None when it is)."""
    if not isinstance(plan, dict):
        return "not a JSON object"
    for key in ("case_id", "lesion"):
        if not isinstance(plan.get(key), str):
            return f"no {key} (a string)"
    if plan.get("path") not in PATH_ORDER:
        return f"path {plan.get('path')!r} is not one of {', '.join(PATH_ORDER)}"
    questions = plan.get("questions")
    if not isinstance(questions, list) or not questions:
        return "no questions (a non-empty list)"
    for k, q in enumerate(questions, start=1):
        if not (isinstance(q, dict) and isinstance(q.get("qid"), str) and q.get("stage") in (1, 2, 3, 4)
                and type(q.get("n_options")) is int and q["n_options"] >= 1 and isinstance(q.get("multi"), bool)
                and isinstance(q.get("gt"), list) and all(type(g) is int for g in q["gt"])):
            return f"question {k} is not an object with qid, stage 1-4, n_options, multi and gt (a list of integers)"
    return None


def read_plans(run: str | Path) -> list[dict[str, Any]]:
    """The case plans of the run folder ``run`` (its ``cases.json``, the denominators); a missing or invalid file
    is an :class:`InputError` naming it and the bad entry."""
    path = Path(run) / CASES_FILE
    plans = _read_json(path)
    if not isinstance(plans, list):
        raise InputError("not a list of case plans (a JSON array), as percept eval writes it", path)
    for k, plan in enumerate(plans, start=1):
        problem = _plan_problem(plan)
        if problem is not None:
            raise InputError(f"case plan {k}: {problem}", path)
    return plans


def run_label(config: dict[str, Any]) -> str:
    """``{model spec} [{oracle}]``: the name of a run in tables."""
    return f"{config['model']} [{config['oracle']}]"


def score_run(run: str | Path, n_boot: int = 1000) -> dict[str, Any]:
    """Score ``RUN/`` and write ``score.json`` and the reference CSVs there; returns the score. A line of
    ``results.jsonl`` that holds no valid record is listed in ``bad_lines`` (``file:line: reason``); the case it
    names, when it names one and no later line replaces it, counts as failed. When the lines that name no case
    (a torn last line aside) are at least as many as the cases without a readable line, those cases are taken
    to be in them and count as failed; otherwise they stay missing. A missing or invalid ``config.json`` or
    ``cases.json`` is an :class:`InputError` naming it."""
    run = Path(run)
    cfg, plans, per_repeat, lines = run_records(run)
    score = score_repeats(plans, per_repeat, n_boot=n_boot, seed=int(cfg.get("seed", 0)))
    usage = run / USAGE_FILE
    score["run"] = {"label": run_label(cfg), "model": cfg["model"], "oracle": cfg["oracle"], "config": cfg,
                    "usage": _read_json(usage) if usage.is_file() else None}
    if lines.bad:
        score["bad_lines"] = [str(b) for b in lines.bad]
    records = [rec for res in per_repeat for rec in res.values()]
    # failures of the server, not answers of the model: said apart from the model's wrong answers
    score["no_answer_cases"] = sorted({r["case_id"] for r in records
                                       if r.get("status") == "failed" and r.get("no_answer") is True})
    score["cut_answers"] = sum(1 for r in records for q in r.get("questions", [])
                               if isinstance(q, dict) and q.get("finish_reason") == "length")
    (run / SCORE_FILE).write_text(json.dumps(score, indent=2), encoding="utf-8")
    write_csvs(run, [score])
    return score


def run_records(run: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, dict[str, Any]]],
                                    ResultLines]:
    """What :func:`score_run` scores: the run's config, its case plans, per repeat the result record of each case
    (an unreadable line's case, or a case taken to be in a nameless bad line, as a failed record) and the result
    lines as read."""
    cfg = read_config(run)
    plans = read_plans(run)
    if not (run / RESULTS_FILE).is_file():
        raise InputError("no results yet", run / RESULTS_FILE)
    repeats = int(cfg.get("repeats", 1))
    lines = read_results(run)
    found = dict(lines.records)
    for (cid, k), bad in lines.broken_units().items():
        found[cid, k] = {"case_id": cid, "status": "failed", "error": f"unreadable result line: {bad}",
                         "questions": []}
    nameless = [str(b) for b in lines.bad if b.case_id is None and not b.torn]
    lost = [(p["case_id"], r) for r in range(repeats) for p in plans if (p["case_id"], r) not in found]
    if lost and len(lost) <= len(nameless):  # each may be in one of them: failed, not missing
        for cid, k in lost:
            found[cid, k] = {"case_id": cid, "status": "failed", "questions": [],
                             "error": f"no readable result line; taken to be among {'; '.join(nameless)}"}
    per_repeat = [{cid: rec for (cid, k), rec in found.items() if k == r} for r in range(repeats)]
    return cfg, plans, per_repeat, lines


def _fmt(x: float | None) -> str:
    """A printed accuracy (:func:`score_lines`): 4 decimals; "–" where there is no item to score (as the report
    shows it; the reference CSVs write 0.0 there, :func:`_ref_value`)."""
    return "–" if x is None else f"{x:.4f}"


def summary_rows(score: dict[str, Any]) -> list[dict[str, str]]:
    """The summary rows :func:`score_lines` prints per path with cases (settings ``end_to_end`` and
    ``oracle_passed``; ``model`` = the run label, 4 decimals, "–" for a stage the path's cases never ask); the CSV
    rows are :func:`reference_rows`."""
    rows = []
    for path, block in score["paths"].items():
        for setting in ("end_to_end", "oracle_passed"):
            row = {"path": path, "model": score["run"]["label"], "setting": setting}
            for s in (1, 2, 3, 4):
                row[f"acc(stage{s})"] = _fmt(block[setting][f"stage{s}"]["acc"])
            row["depth"] = _fmt(block["depth"]["mean"])
            rows.append(row)
    return rows


def spread_rows(score: dict[str, Any]) -> list[dict[str, str]]:
    """Per path and setting: std, min and max over repeats of each stage's accuracy and of depth (none for 1)."""
    if score.get("repeats", 1) <= 1:
        return []
    rows = []
    for path, block in score["paths"].items():
        for setting in ("end_to_end", "oracle_passed"):
            row = {"path": path, "model": score["run"]["label"], "setting": setting, "repeats": str(score["repeats"])}
            for name, b in [*((f"stage{s}", block[setting][f"stage{s}"]) for s in (1, 2, 3, 4)),
                            ("depth", block["depth"])]:
                sp = b.get("spread")
                for stat in ("std", "min", "max"):
                    row[f"{stat}({name})"] = _fmt(sp[stat] if sp else None)
            rows.append(row)
    return rows


def score_lines(score: dict[str, Any]) -> tuple[list[str], str | None]:
    """The summary rows, then the spread rows (runs with repeats), as JSON lines; and a note on failed or missing
    cases and unreadable result lines (None when there are none)."""
    lines = [json.dumps(row, ensure_ascii=False) for row in summary_rows(score) + spread_rows(score)]
    bad = score.get("bad_lines", [])
    no_answer, cut = len(score.get("no_answer_cases", [])), int(score.get("cut_answers", 0))
    if not (score["failed_cases"] or score["missing_cases"] or bad or cut):
        return lines, None
    unreadable = f", unreadable result lines: {len(bad)}" if bad else ""
    server = (f" ({no_answer} of them got no answer from the model server: a failure of the server, not answers of "
              "the model; rerun percept eval to run them again)" if no_answer else "")
    cut_note = f", answers cut at max_tokens: {cut} (failed questions; raise --max-tokens)" if cut else ""
    return lines, (f"failed: {len(score['failed_cases'])}{server}, missing: {len(score['missing_cases'])} (counted "
                   f"wrong){cut_note}{unreadable}")


def _ref_value(x: float | None) -> str:
    """A reference-CSV number: the float as Python writes it (``0.5``, ``0.3333333333333333``); the mean of
    nothing is ``0.0``, as the reference writes it."""
    return repr(float(0.0 if x is None else x))


def reference_rows(score: dict[str, Any], model: str) -> dict[str, list[dict[str, str]]]:
    """The rows of the three reference CSVs (file name -> rows) for one run, with ``model`` in the model column:
    the reference's columns and number format, all three paths in its order (a path without cases is all 0.0)."""
    summary = []
    for path in PATH_ORDER:
        block = score["paths"].get(path)
        for setting in ("end_to_end", "oracle_passed"):
            row = {"path": CSV_PATH_NAMES[path], "model": model, "setting": setting}
            for s in (1, 2, 3, 4):
                row[f"acc(stage{s})"] = _ref_value(block[setting][f"stage{s}"]["acc"] if block else None)
            row["depth"] = _ref_value(block["depth"]["mean"] if block else None)
            summary.append(row)
    out = {SUMMARY_CSV: summary}
    for name, qids in ((REVISION_CSV, REVISION_QIDS), (ATTRIBUTE_CSV, ATTRIBUTE_QIDS)):
        out[name] = [{"path": DETAIL_PATHS[name], "model": model,
                      **{f"acc({CSV_QUESTION_NAMES.get(q, q)})": _ref_value(score["subtasks"][q]["acc"])
                         for q in qids}}]
    return out


def zero_path_note(score: dict[str, Any], csv_name: str = SUMMARY_CSV) -> str | None:
    """A note naming the paths the run has no case of, which the summary CSV ``csv_name`` writes as 0.0 rows
    (:func:`reference_rows`); None when the run has cases of every path."""
    empty = [CSV_PATH_NAMES[p] for p in PATH_ORDER if p not in score["paths"]]
    if not empty:
        return None
    them = "it" if len(empty) == 1 else "them"
    return (f"note: {csv_name} writes 0.0 for {', '.join(empty)} of {score['run']['label']}: the run has no case of "
            f"{them} (score.json and the report leave {them} out)")


def write_csvs(folder: Path, scores: Sequence[dict[str, Any]], summary_name: str = SUMMARY_CSV) -> None:
    """The reference CSVs for ``scores`` (one run each) in ``folder``: the reference's columns and number format.
    Per run (``summary_name`` = :data:`SUMMARY_CSV`): the three files, ``model`` = the run's model spec. Across
    runs (``all_models_summary.csv``): the summary rows only, ``model`` = the run label ``{model} [{oracle}]``,
    since one report may hold runs of several oracle settings."""
    def write(name: str, rows: list[dict[str, str]]) -> None:
        columns = list(rows[0]) if rows else list(SUMMARY_COLUMNS)
        with (folder / name).open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)

    if summary_name != SUMMARY_CSV:
        write(summary_name, [r for s in scores for r in reference_rows(s, s["run"]["label"])[SUMMARY_CSV]])
        return
    tables: dict[str, list[dict[str, str]]] = {}
    for s in scores:
        for name, rows in reference_rows(s, s["run"]["model"]).items():
            tables.setdefault(name, []).extend(rows)
    for name, rows in tables.items():
        write(name, rows)
