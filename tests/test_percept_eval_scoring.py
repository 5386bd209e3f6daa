"""Scoring views (CHEXPERCEPT.md §15) and chance baselines (§16) on hand-made result sets."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.evaluation.percept.scoring import reference_rows, score_records, score_run

STAGE = {"detection": 1, "contour_eval": 2, "expansion": 3, "contraction": 3, "revision_result": 3,
         "distribution": 4, "location": 4, "severity": 4, "comparison": 4}
N_OPT = {"detection": 2, "contour_eval": 2, "expansion": 3, "contraction": 3, "revision_result": 4,
         "distribution": 4, "location": 4, "severity": 3, "comparison": 4}
GT = {"expansion": [1, 2], "contraction": [3], "location": [2]}
MULTI = {"expansion", "contraction", "location"}
RR = ["detection", "contour_eval", "expansion", "contraction", "revision_result"]
ATTR = ["distribution", "location", "severity", "comparison"]


def plan(case_id, path, lesion):
    qids = {"LF": ["detection"], "RF": ["detection", "contour_eval"], "RR": RR}[path]
    if lesion != "cardiomegaly" and path != "LF":
        qids = qids + ATTR
    return {"case_id": case_id, "path": path, "lesion": lesion,
            "questions": [{"qid": q, "stage": STAGE[q], "gt": GT.get(q, [1]), "n_options": N_OPT[q],
                           "multi": q in MULTI} for q in qids]}


def record(p, wrong=(), failed_from=None, labels=None):
    qs = []
    for k, q in enumerate(p["questions"]):
        if failed_from is not None and k >= failed_from:
            qs.append({**q, "raw": None, "label": "failed", "correct": False, "correct_lenient": False})
        else:
            ok = q["qid"] not in wrong
            label = (labels or {}).get(q["qid"], "parsed")
            qs.append({**q, "raw": "x", "label": label, "correct": ok,
                       "correct_lenient": ok or label == "matched-by-text"})
    return {"case_id": p["case_id"], "path": p["path"], "lesion": p["lesion"],
            "status": "failed" if failed_from is not None else "ok", "questions": qs}


@pytest.fixture
def score():
    plans = [plan("A", "RR", "edema"), plan("B", "RR", "cardiomegaly"), plan("G", "RR", "edema"),
             plan("C", "RF", "edema"), plan("D", "RF", "cardiomegaly"), plan("E", "LF", "edema"),
             plan("F", "LF", "cardiomegaly")]
    p = {x["case_id"]: x for x in plans}
    results = {
        "A": record(p["A"], wrong={"location"}),
        "B": record(p["B"]),
        "G": record(p["G"], failed_from=1),
        "C": record(p["C"], wrong={"detection"}, labels={"detection": "unparseable", "severity": "matched-by-text"}),
        "D": record(p["D"]),
        "E": record(p["E"]),
        # F: missing
    }
    return score_records(plans, results, n_boot=200, seed=1)


def acc(block, stage):
    return block[f"stage{stage}"]["acc"]


def test_end_to_end_oracle_passed_and_depth(score):
    rr, rf, lf = score["paths"]["RR"], score["paths"]["RF"], score["paths"]["LF"]
    assert rr["n"] == 3 and rf["n"] == 2 and lf["n"] == 2
    e2e = rr["end_to_end"]
    third = pytest.approx(2 / 3)
    # G failed after a right Stage 1 answer: a case that could not be run scores every stage wrong (§15)
    assert (acc(e2e, 1), acc(e2e, 2), acc(e2e, 3), acc(e2e, 4)) == (third, third, third, 0.0)
    assert rr["oracle_passed"]["stage1"]["acc"] == third
    assert e2e["stage4"]["n"] == 2  # cardiomegaly has no Stage 4; the failed case stays in
    assert rr["depth"]["mean"] == pytest.approx((3 + 4 + 0) / 3)  # cardiomegaly +1 rule
    assert rr["depth"]["distribution"] == {"0": 1, "1": 0, "2": 0, "3": 1, "4": 1}
    # RF: C wrong at Stage 1 breaks its chain; D (cardiomegaly) correct → depth 2 + 1
    assert (acc(rf["end_to_end"], 1), acc(rf["end_to_end"], 2), acc(rf["end_to_end"], 4)) == (0.5, 0.5, 0.0)
    assert (acc(rf["oracle_passed"], 2), acc(rf["oracle_passed"], 4)) == (1.0, 1.0)
    assert rf["end_to_end"]["stage3"]["n"] == 0
    assert rf["depth"]["mean"] == 1.5
    # LF: the missing case counts wrong
    assert acc(lf["end_to_end"], 1) == 0.5 and lf["depth"]["mean"] == 0.5
    lo, hi = rr["end_to_end"]["stage2"]["ci"]
    assert 0.0 <= lo <= 2 / 3 <= hi <= 1.0


def test_subtasks_failed_missing_and_parse_rates(score):
    sub = score["subtasks"]
    assert sub["expansion"]["n"] == 3 and sub["expansion"]["acc"] == pytest.approx(2 / 3)
    assert sub["location"]["n"] == 3 and sub["location"]["acc"] == pytest.approx(1 / 3)
    assert sub["distribution"]["acc"] == pytest.approx(2 / 3)
    assert sub["severity"]["lenient_acc"] == pytest.approx(2 / 3)
    assert score["failed_cases"] == ["G"] and score["missing_cases"] == ["F"]
    total = 9 + 5 + 9 + 6 + 2 + 1 + 1
    overall = score["parse"]["overall"]
    assert overall["n"] == total
    assert overall["unparseable"] == pytest.approx(1 / total)
    assert overall["failed"] == pytest.approx((8 + 1) / total)  # G's 8 unanswered + F's detection
    assert score["parse"]["per_stage"]["stage1"]["unparseable"] == pytest.approx(1 / 7)
    assert score["per_lesion"]["cardiomegaly"]["RR"]["depth"] == 4.0
    assert score["per_lesion"]["edema"]["RR"]["end_to_end"]["stage4"] == 0.0


def test_chance_baselines_on_items(score):
    ch = score["chance"]
    q = ch["questions"]
    assert q["detection"]["LF"]["chance"] == 0.5 and q["detection"]["LF"]["always_yes"] == 1.0  # GT 1 here
    assert q["expansion"]["RR"]["chance"] == 0.25  # k = 2 points: 2^-2
    assert q["location"]["RR"]["chance"] == 1 / 8
    assert q["revision_result"]["RR"]["chance"] == 1 / 4
    assert q["expansion"]["RR"]["single_pick"] == 0.0  # |GT| = 2
    assert q["contraction"]["RR"]["single_pick"] == pytest.approx(1 / 3)
    assert q["location"]["RF"]["single_pick"] == 1 / 4
    s3 = 0.25 * 0.25 * 0.25
    assert ch["stages"]["RR"]["oracle_passed"]["stage3"] == pytest.approx(s3)
    assert ch["stages"]["RR"]["oracle_passed"]["stage4"] == pytest.approx(1 / 4 * 1 / 8 * 1 / 3 * 1 / 4)
    assert ch["stages"]["RR"]["end_to_end"]["stage4"] == pytest.approx(0.5 * 0.5 * s3 / 384)
    assert q["severity"]["RF"]["majority"] == 1.0


def test_reference_rows_write_floats_as_python_does(score):
    rows = reference_rows(score, "x")["model_performance_summary.csv"]
    rr_e2e = rows[0]
    assert rr_e2e["acc(stage2)"] == repr(2 / 3) == "0.6666666666666666" and rr_e2e["acc(stage1)"] == repr(2 / 3)
    assert score["parse"]["overall"]["invalid-format"] == 0.0  # every label of parse_answer has a rate


def test_score_run_writes_reference_csvs(tmp_path):
    plans = [plan("A", "RR", "edema"), plan("E", "LF", "edema")]
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"config": {"model": "m", "oracle": "none", "seed": 0}}))
    (run / "cases.json").write_text(json.dumps(plans))
    (run / "results.jsonl").write_text(json.dumps(record(plans[0], wrong={"severity"})) + "\n{torn")
    s = score_run(run, n_boot=50)
    assert s["missing_cases"] == ["E"]
    # the reference's columns, path names and order, model name and number format (Python floats)
    assert b"\r" not in (run / "model_performance_summary.csv").read_bytes()  # LF line ends, as the reference's
    text = (run / "model_performance_summary.csv").read_text()
    assert text.splitlines()[0] == "path,model,setting,acc(stage1),acc(stage2),acc(stage3),acc(stage4),depth"
    rows = list(csv.DictReader(text.splitlines()))
    assert [(r["path"], r["setting"]) for r in rows] == [
        (p, s) for p in ("revision_required", "revision_free", "lesion_free") for s in ("end_to_end", "oracle_passed")]
    assert {r["model"] for r in rows} == {"m"}
    rr = rows[0]
    assert (rr["acc(stage1)"], rr["acc(stage3)"], rr["acc(stage4)"], rr["depth"]) == ("1.0", "1.0", "0.0", "3.0")
    # the reference writes the mean of nothing as 0.0, never an empty cell (no RF case; LF asks no Stage 2-4)
    assert all(v == "0.0" for r in rows[2:4] for k, v in r.items() if k not in ("path", "model", "setting"))
    lf = rows[4]
    assert (lf["acc(stage1)"], lf["acc(stage2)"], lf["acc(stage3)"], lf["acc(stage4)"]) == ("0.0",) * 4
    det = (run / "model_performance_detail_contour_revision.csv").read_text().splitlines()
    assert det == ["path,model,acc(expansion),acc(contraction),acc(revision_result)",
                   "revision_required,m,1.0,1.0,1.0"]
    attr = (run / "model_performance_detail_attribute_extraction.csv").read_text().splitlines()
    assert attr == ["path,model,acc(distribution),acc(location),acc(severity/measurement),acc(comparison)",
                    "revision_required+revision_free,m,1.0,1.0,0.0,1.0"]
    assert json.loads((run / "score.json").read_text())["run"]["label"] == "m [none]"


def _run_folder(run: Path, plans: list[dict]) -> Path:
    """A run folder of model ``m`` (oracle none) whose every case of ``plans`` was answered right."""
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"config": {"model": "m", "oracle": "none", "seed": 0}}))
    (run / "cases.json").write_text(json.dumps(plans))
    (run / "results.jsonl").write_text("".join(json.dumps(record(p)) + "\n" for p in plans))
    return run


def test_score_prints_a_dash_for_a_stage_no_case_asks(tmp_path):
    plans = [plan("A", "RR", "edema"), plan("C", "RF", "edema"), plan("E", "LF", "edema")]
    run = _run_folder(tmp_path / "run", plans)
    result = CliRunner().invoke(main, ["percept", "score", str(run), "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    rows = {(r["path"], r["setting"]): r for r in map(json.loads, result.stdout.splitlines())}
    stages = {key: [r[f"acc(stage{s})"] for s in (1, 2, 3, 4)] for key, r in rows.items()}
    assert stages["RR", "end_to_end"] == ["1.0000"] * 4
    assert stages["RF", "end_to_end"] == ["1.0000", "1.0000", "–", "1.0000"]  # RF asks no revision
    assert stages["LF", "oracle_passed"] == ["1.0000", "–", "–", "–"]
    assert "–" in result.stdout  # printed as is, not as a JSON escape
    score = json.loads((run / "score.json").read_text())
    assert score["paths"]["LF"]["end_to_end"]["stage2"] == {"acc": None, "ci": None, "n": 0}
    summary = list(csv.DictReader((run / "model_performance_summary.csv").read_text().splitlines()))
    assert summary[4]["acc(stage2)"] == "0.0"  # the reference CSV keeps the reference's 0.0


def test_score_and_report_name_the_paths_the_csvs_write_as_zero(tmp_path):
    """A run with no case of a path (--limit, a benchmark without it) gets 0.0 rows for it in the reference CSVs
    (their format); `percept score` and `percept report` print a note naming those paths."""
    plans = [plan("A", "RR", "edema"), plan("B", "RR", "edema")]
    run = _run_folder(tmp_path / "run", plans)
    result = CliRunner().invoke(main, ["percept", "score", str(run), "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    note = [line for line in result.stderr.splitlines() if "0.0" in line]
    assert len(note) == 1 and "model_performance_summary.csv" in note[0], result.stderr
    assert "revision_free, lesion_free" in note[0] and "revision_required" not in note[0] and "m [none]" in note[0]
    summary = list(csv.DictReader((run / "model_performance_summary.csv").read_text().splitlines()))
    assert [r["acc(stage1)"] for r in summary] == ["1.0", "1.0", "0.0", "0.0", "0.0", "0.0"]  # the format is kept
    result = CliRunner().invoke(main, ["percept", "report", str(run), "--out", str(tmp_path / "r.html"),
                                       "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    assert "all_models_summary.csv writes 0.0 for revision_free, lesion_free of m [none]" in result.stderr
