"""`percept export-results`: runs in the reference evaluator's `all_results.json` layout, read back with the
reference analyzer's rules (CHEXPERCEPT.md §15: End-to-End gating, Oracle-Passed, the per-stage `correct` flags)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cxrground.errors import ConfigError
from cxrground.evaluation.percept.reference_results import export_results, reference_folder
from cxrground.evaluation.percept.scoring import score_run
from test_percept_eval_scoring import plan, record

STAGE_KEYS = ("detection_qa", "contour_evaluation_qa", "contour_revision_qa", "attribute_extraction_qa")
PATH_STAGES = {"revision_required": STAGE_KEYS, "revision_free": (STAGE_KEYS[0], STAGE_KEYS[1], STAGE_KEYS[3]),
               "lesion_free": STAGE_KEYS[:1]}


def _run(folder: Path, model: str, oracle: str = "none", repeats: int = 1) -> tuple[Path, dict[str, dict]]:
    plans = [plan("edema_a", "RR", "edema"), plan("cardiomegaly_b", "RR", "cardiomegaly"),
             plan("edema_c", "RF", "edema"), plan("edema_d", "LF", "edema"), plan("edema_g", "RR", "edema"),
             plan("edema_m", "RF", "edema")]
    p = {x["case_id"]: x for x in plans}
    recs = {"edema_a": record(p["edema_a"], wrong={"location"}), "cardiomegaly_b": record(p["cardiomegaly_b"]),
            "edema_c": record(p["edema_c"], wrong={"detection"}), "edema_d": record(p["edema_d"]),
            "edema_g": record(p["edema_g"], failed_from=2)}  # edema_m: missing
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": {"model": model, "oracle": oracle, "seed": 0,
                                                               "repeats": repeats}}))
    (folder / "cases.json").write_text(json.dumps(plans))
    lines = [json.dumps({**r, "repeat": k}) for k in range(repeats) for r in recs.values()]
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
    return folder, p


def _analyze(results: dict[str, dict]) -> dict[str, dict[str, list[bool]]]:
    """Per path and stage, End-to-End correctness as the reference analyzer computes it from the file."""
    out: dict[str, dict[str, list[bool]]] = {}
    for case in results.values():
        still = True
        for key in PATH_STAGES[case["qa_path"]]:
            block = case.get(key)
            if not block and key != "detection_qa":
                continue  # a stage the case does not ask (cardiomegaly's Stage 4)
            still = still and bool(block.get("correct"))
            out.setdefault(case["qa_path"], {}).setdefault(key, []).append(still)
    return out


def test_export_matches_cxrground_scoring_under_the_reference_rules(tmp_path) -> None:
    run, plans = _run(tmp_path / "run", "openai:gpt-4o")
    (path,) = export_results([run], tmp_path / "ref")
    assert path == tmp_path / "ref" / "openai_gpt-4o" / "oracle_none" / "all_results.json"
    results = json.loads(path.read_text())
    assert list(results) == list(plans)  # every selected case, missing and failed ones included
    a = results["edema_a"]
    assert a["qa_path"] == "revision_required" and a["key_id"] == "edema_a"
    assert a["contour_revision_qa"]["ground_truth"] == {"expansion": [1, 2], "contraction": [3], "revision_result": 1}
    assert a["attribute_extraction_qa"]["location"] == {"correct": False}
    assert a["attribute_extraction_qa"]["severity/measurement"] == {"correct": True}
    assert a["attribute_extraction_qa"]["correct"] is False and a["detection_qa"]["ground_truth"] == 1
    assert "attribute_extraction_qa" not in results["cardiomegaly_b"]  # no Stage 4 for cardiomegaly
    assert set(results["edema_d"]) == {"key_id", "qa_path", "detection_qa"}
    failed = results["edema_g"]  # failed at its third question: every stage wrong, as cxrground scores it
    assert [failed[k]["correct"] for k in STAGE_KEYS] == [False] * 4
    assert [results["edema_m"][k]["correct"] for k in PATH_STAGES["revision_free"]] == [False] * 3
    # the reference analyzer's End-to-End numbers from the file equal cxrground's score of the run
    score = score_run(run, n_boot=0)
    analyzed = _analyze(results)
    for short, full in (("RR", "revision_required"), ("RF", "revision_free"), ("LF", "lesion_free")):
        block = score["paths"][short]["end_to_end"]
        for stage, key in enumerate(STAGE_KEYS, start=1):
            values = analyzed[full].get(key)
            want = block.get(f"stage{stage}", {}).get("acc")
            assert (sum(values) / len(values) if values else None) == pytest.approx(want), (short, key)


def test_folder_names_and_refusals(tmp_path) -> None:
    assert reference_folder("hf:/models/Qwen2.5-VL-7B/", "implicit") == "opensource_Qwen2.5-VL-7B/oracle_implicit"
    assert reference_folder("ils:ckpt/base line", "none") == "opensource_ils-base-line/oracle_none"
    assert reference_folder("random", "explicit") == "dummy_random/oracle_explicit"
    assert reference_folder("openai:org/model:v1", "none") == "openai_org-model-v1/oracle_none"
    one, _ = _run(tmp_path / "one", "random")
    two, _ = _run(tmp_path / "two", "random")
    with pytest.raises(ConfigError, match="both go to dummy_random/oracle_none"):
        export_results([one, two], tmp_path / "ref")
    assert not (tmp_path / "ref").exists()  # refused before anything is written
    with pytest.raises(ConfigError, match=r"--repeat 1: run .* has 1 repeat"):
        export_results([one], tmp_path / "ref", repeat=1)
    three, _ = _run(tmp_path / "three", "random", repeats=2)
    (path,) = export_results([three], tmp_path / "ref3", repeat=1)
    assert len(json.loads(path.read_text())) == 6


def test_cli_export_results(tmp_path) -> None:
    run, _ = _run(tmp_path / "run", "hf:/w/llava")
    proc = subprocess.run([sys.executable, "-m", "cxrground", "percept", "export-results", str(run), "--out",
                           str(tmp_path / "ref")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ref" / "opensource_llava" / "oracle_none" / "all_results.json").is_file()
    assert "wrote" in proc.stdout


def test_export_results_refuses_to_replace_an_earlier_export_without_overwrite(tmp_path) -> None:
    from click.testing import CliRunner

    from cxrground.cli import main

    first, _ = _run(tmp_path / "first", "random")
    second, _ = _run(tmp_path / "second", "random", oracle="implicit")
    third, _ = _run(tmp_path / "third", "random")
    third_plans = json.loads((third / "cases.json").read_text())[:-1]  # another selection, same model and setting
    (third / "cases.json").write_text(json.dumps(third_plans))
    out = tmp_path / "ref"
    runner = CliRunner()
    for run in (first, second):  # another model or setting goes beside it
        res = runner.invoke(main, ["percept", "export-results", str(run), "--out", str(out)])
        assert res.exit_code == 0, res.output
    path = out / "dummy_random" / "oracle_none" / "all_results.json"
    before = path.read_text()
    res = runner.invoke(main, ["percept", "export-results", str(third), "--out", str(out)])
    assert res.exit_code == 1 and str(path) in res.output and "--overwrite" in res.output, res.output
    assert path.read_text() == before
    res = runner.invoke(main, ["percept", "export-results", str(third), "--out", str(out), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert len(json.loads(path.read_text())) == len(third_plans)


def _eval(bench: Path, out: Path, model: str, oracle: str = "none", *extra: str):
    from click.testing import CliRunner

    from cxrground.cli import main

    return CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", model, "--oracle", oracle,
                                     "--out", str(out), "--no-progress", "--seed", "4", *extra])


def _answers(run: Path) -> dict[tuple[str, str], tuple[str, bool]]:
    recs = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    return {(r["case_id"], q["qid"]): (q.get("raw"), q.get("correct")) for r in recs for q in r["questions"]}


@pytest.mark.parametrize("oracle", ["none", "implicit"])
def test_replayed_reference_results_score_as_the_run_that_made_them(tmp_path, oracle) -> None:
    from cxrground.testing.mock_bench import make_benchmark

    bench = make_benchmark(tmp_path / "bench", {"LF": 2, "RF": 2, "RR": 3}, lesions=("edema", "cardiomegaly"), seed=5)
    res = _eval(bench, tmp_path / "random", "random", oracle)
    assert res.exit_code == 0, res.output
    (results,) = export_results([tmp_path / "random"], tmp_path / "ref")
    res = _eval(bench, tmp_path / "replay", f"replay:{results}", oracle)
    assert res.exit_code == 0, res.output
    original, replayed = _answers(tmp_path / "random"), _answers(tmp_path / "replay")
    assert replayed == original and len(original) > 10
    a, b = score_run(tmp_path / "random", n_boot=0), score_run(tmp_path / "replay", n_boot=0)
    assert a["paths"] == b["paths"]


def test_a_null_reply_exports_as_empty_and_replays_to_the_same_scores(tmp_path) -> None:
    """A model's null content is scored as an unparseable answer and its case goes on: the export writes it as the
    empty string (not as null, which is an unanswered question), so the replay scores the run as it was."""
    from cxrground.testing.mock_bench import make_benchmark
    from cxrground.testing.mock_server import MockServer, hash_policy

    answer = hash_policy(0)

    def null_location(body: dict) -> str | None:
        return None if "Select all locations" in json.dumps(body["messages"][-1]["content"]) else answer(body)

    bench = make_benchmark(tmp_path / "bench", {"LF": 1, "RF": 2, "RR": 2}, lesions=("edema",), seed=5)
    with MockServer(null_location) as server:
        res = _eval(bench, tmp_path / "run", "openai:mock-vlm", "none", "--base-url", server.base_url)
    assert res.exit_code == 0, res.output
    nulls = [k for k, (raw, _) in _answers(tmp_path / "run").items() if raw is None]
    assert len(nulls) == 4 and {qid for _, qid in nulls} == {"location"}  # one per positive case
    (results,) = export_results([tmp_path / "run"], tmp_path / "ref")
    exported = json.loads(results.read_text())
    assert {case["attribute_extraction_qa"]["raw_responses"]["location"] for case in exported.values()
            if "attribute_extraction_qa" in case} == {""}
    res = _eval(bench, tmp_path / "replay", f"replay:{results}", "none")
    assert res.exit_code == 0, res.output
    a, b = score_run(tmp_path / "run", n_boot=0), score_run(tmp_path / "replay", n_boot=0)
    assert b["failed_cases"] == [] and a["paths"] == b["paths"] and a["subtasks"] == b["subtasks"]


def test_replay_fails_the_cases_the_file_has_no_response_for(tmp_path) -> None:
    from cxrground.testing.mock_bench import make_benchmark

    bench = make_benchmark(tmp_path / "bench", {"LF": 1, "RF": 1, "RR": 1}, lesions=("edema",), seed=2)
    assert _eval(bench, tmp_path / "random", "random").exit_code == 0
    (results,) = export_results([tmp_path / "random"], tmp_path / "ref")
    data = json.loads(results.read_text())
    rr = next(k for k, v in data.items() if v["qa_path"] == "revision_required")
    for source in ("responses", "raw_responses"):
        del data[rr]["contour_revision_qa"][source]["contraction"]
    lf = next(k for k, v in data.items() if v["qa_path"] == "lesion_free")
    del data[lf]
    results.write_text(json.dumps(data))
    res = _eval(bench, tmp_path / "replay", f"replay:{results}")
    assert res.exit_code == 0, res.output
    recs = {r["case_id"]: r for r in map(json.loads, (tmp_path / "replay" / "results.jsonl").read_text().splitlines())}
    assert recs[rr]["status"] == "failed" and "no response to question contraction" in recs[rr]["error"]
    assert recs[lf]["status"] == "failed" and f"no record of case {lf}" in recs[lf]["error"]
    assert all(r["status"] != "failed" for k, r in recs.items() if k not in (rr, lf))
    for bad, needle in (("[1, 2]", "not an all_results.json"), ("{oops", "not a JSON file")):
        (tmp_path / "bad.json").write_text(bad)
        res = _eval(bench, tmp_path / f"bad{len(bad)}", f"replay:{tmp_path / 'bad.json'}")
        assert res.exit_code != 0 and needle in res.output and "Traceback" not in res.output
    res = _eval(bench, tmp_path / "gone", f"replay:{tmp_path / 'nothing.json'}")
    assert res.exit_code != 0 and "no such file" in res.output


def test_replay_refuses_another_oracle_setting_and_fails_cases_recorded_on_another_benchmark(tmp_path) -> None:
    from cxrground.testing.mock_bench import make_benchmark

    bench = make_benchmark(tmp_path / "bench", {"LF": 1, "RF": 1, "RR": 2}, lesions=("edema",), seed=3)
    assert _eval(bench, tmp_path / "random", "random", "implicit").exit_code == 0
    (results,) = export_results([tmp_path / "random"], tmp_path / "ref")
    assert results.parent.name == "oracle_implicit"
    for other in ("none", "explicit"):
        res = _eval(bench, tmp_path / f"as-{other}", f"replay:{results}", other)
        assert res.exit_code != 0 and "oracle_implicit folder" in res.output and "--oracle implicit" in res.output
        assert not (tmp_path / f"as-{other}" / "results.jsonl").exists()
    data = json.loads(results.read_text())
    rr = next(k for k, v in data.items() if v["qa_path"] == "revision_required")
    gt = data[rr]["detection_qa"]["ground_truth"]
    data[rr]["detection_qa"]["ground_truth"] = 1 - gt  # as if recorded on another build of the benchmark
    moved = tmp_path / "oracle_runs" / "all_results.json"  # a folder that names no oracle setting: any --oracle
    moved.parent.mkdir()
    moved.write_text(json.dumps(data))
    res = _eval(bench, tmp_path / "replay", f"replay:{moved}", "implicit")
    assert res.exit_code == 0, res.output
    recs = {r["case_id"]: r for r in map(json.loads, (tmp_path / "replay" / "results.jsonl").read_text().splitlines())}
    assert recs[rr]["status"] == "failed" and "another build of the benchmark" in recs[rr]["error"]
    assert all(r["status"] != "failed" for k, r in recs.items() if k != rr)


def _reference_style(data: dict[str, dict]) -> dict[str, dict]:
    """The file as the reference evaluator writes it: parsed answers only, no raw replies."""
    for case in data.values():
        for key in STAGE_KEYS:
            block = case.get(key)
            if isinstance(block, dict):
                block.pop("raw_response", None)
                block.pop("raw_responses", None)
    return data


def test_export_records_the_reference_parsed_answer_beside_the_raw_reply(tmp_path) -> None:
    from cxrground.evaluation.percept.parsing import reference_parse

    run, _plans = _run(tmp_path / "run", "random")
    lines = (run / "results.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["questions"][0]["raw"] = "I think option 4.\nAnswer: 2"
    (run / "results.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    (path,) = export_results([run], tmp_path / "ref")
    block = json.loads(path.read_text())[first["case_id"]]["detection_qa"]
    assert block["response"] == "2" and block["raw_response"] == "I think option 4.\nAnswer: 2"
    assert reference_parse(block["response"]) == reference_parse(block["raw_response"]) == [2]


def test_replay_of_an_empty_stage_block_answers_empty_and_goes_on(tmp_path) -> None:
    """The reference evaluator records ``{}`` for a Stage-1/2 reply that parsed to nothing and still asks the later
    stages: replayed, that question is answered empty (wrong) and the case goes on, scored as the reference does."""
    from cxrground.testing.mock_bench import make_benchmark

    bench = make_benchmark(tmp_path / "bench", {"LF": 1, "RF": 2, "RR": 2}, lesions=("edema",), seed=6)
    assert _eval(bench, tmp_path / "oracle", "oracle").exit_code == 0
    (results,) = export_results([tmp_path / "oracle"], tmp_path / "ref")
    data = _reference_style(json.loads(results.read_text()))
    rr = next(k for k, v in data.items() if v["qa_path"] == "revision_required")
    rf = next(k for k, v in data.items() if v["qa_path"] == "revision_free")
    data[rr]["contour_evaluation_qa"] = {}
    data[rf]["detection_qa"] = {}
    results.write_text(json.dumps(data))
    res = _eval(bench, tmp_path / "replay", f"replay:{results}")
    assert res.exit_code == 0, res.output
    recs = {r["case_id"]: r for r in map(json.loads, (tmp_path / "replay" / "results.jsonl").read_text().splitlines())}
    assert all(r["status"] == "ok" for r in recs.values())
    answered = {(k, q["qid"]): (q["raw"], q["correct"]) for k, r in recs.items() for q in r["questions"]}
    assert answered[rr, "contour_eval"] == ("", False) and answered[rf, "detection"] == ("", False)
    later = [v for (k, qid), v in answered.items() if k == rr and qid not in ("detection", "contour_eval")]
    assert later and all(correct for _raw, correct in later)  # the later stages are scored as answered


def test_reference_selection_takes_cases_in_file_order(tmp_path) -> None:
    """``--selection reference`` keeps the cases the reference evaluator's flags keep: the first in benchmark file
    order (``--limit``), or the first of each path, lesion-free then revision-free then revision-required
    (``--per-path-limit``)."""
    import random

    from click.testing import CliRunner

    from cxrground.cli import main
    from cxrground.evaluation.percept.conversation import CasePlan
    from cxrground.evaluation.percept.runner import select_cases
    from cxrground.testing.mock_bench import make_benchmark

    paths = ["RR", "LF", "RF", "RR", "RF", "LF", "LF", "RR"]
    plans = [CasePlan(f"c{i}", path, "edema", ()) for i, path in enumerate(paths)]
    assert [p.case_id for p in select_cases(plans, 0, limit=3, selection="reference")] == ["c0", "c1", "c2"]
    by_path = select_cases(plans, 0, per_path_limit=2, selection="reference")
    assert [p.case_id for p in by_path] == ["c1", "c5", "c2", "c4", "c0", "c3"]
    assert [p.case_id for p in select_cases(plans, 0, selection="reference")] == [p.case_id for p in plans]
    with pytest.raises(ConfigError, match="not both"):
        select_cases(plans, 0, limit=2, per_path_limit=1, selection="reference")
    with pytest.raises(ConfigError, match="selection must be one of"):
        select_cases(plans, 0, selection="first")

    bench = make_benchmark(tmp_path / "bench", {"LF": 3, "RF": 3, "RR": 3}, lesions=("edema",), seed=8)
    file = bench / "chexpercept.json"
    cases = json.loads(file.read_text())
    order = list(cases)
    random.Random(1).shuffle(order)  # a file whose order is not the sorted one
    file.write_text(json.dumps({k: cases[k] for k in order}))

    def picked(*flags: str) -> list[str]:
        out = tmp_path / f"sel{len(list(tmp_path.iterdir()))}"
        res = CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "random", "--out",
                                        str(out), "--no-progress", "--oracle", "none", *flags])
        assert res.exit_code == 0, res.output
        return [c["case_id"] for c in json.loads((out / "cases.json").read_text())]

    assert picked("--selection", "reference", "--limit", "4") == order[:4]
    path_of = {k: {"_plf": "LF", "_prf": "RF", "_prr": "RR"}[k[5:9]] for k in order}  # keys edema_p<path><i>
    want = [k for path in ("LF", "RF", "RR") for k in [c for c in order if path_of[c] == path][:2]]
    assert picked("--selection", "reference", "--per-path-limit", "2") == want


def test_a_failed_case_of_an_export_replays_as_failed(tmp_path) -> None:
    """An export writes a failed case's blocks with a null response: replayed, the case fails again (an empty
    block ``{}`` is the reference's record of an empty reply, a block without a response is no answer)."""
    from cxrground.evaluation.percept.reference_names import recorded_response

    run, _plans = _run(tmp_path / "run", "random")
    (path,) = export_results([run], tmp_path / "ref")
    data = json.loads(path.read_text())
    assert data["edema_m"]["detection_qa"]["raw_response"] is None  # missing from the run: failed
    assert recorded_response(data["edema_m"], 1, "detection") is None
    assert recorded_response(data["edema_m"], 2, "contour_eval") is None
    assert recorded_response({"detection_qa": {}}, 1, "detection") == ""
    assert recorded_response({"detection_qa": {"response": "2"}}, 1, "detection") == "2"
    assert recorded_response({"detection_qa": {"raw_response": None, "response": "2"}}, 1, "detection") == "2"
