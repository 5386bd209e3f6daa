"""Sampled decoding in the CheXpercept harness: --repeats, the cache key per sample, Stage-1 reuse for every client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ConfigError
from cxrground.evaluation.percept.mock_bench import make_benchmark
from cxrground.evaluation.percept.mock_server import MockServer, hash_policy
from cxrground.evaluation.percept.report import render_report
from cxrground.evaluation.percept.runner import (
    EvalSettings,
    RetryPolicy,
    load_all_results,
    load_results,
    run_eval,
    sample_seed,
)
from cxrground.evaluation.percept.scoring import score_records, score_repeats, score_run, spread_rows

FAST = RetryPolicy(max_attempts=4, backoff=0.01, max_backoff=0.02, timeout=2.0)


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return make_benchmark(tmp_path_factory.mktemp("bench"), {"LF": 1, "RF": 1, "RR": 1}, seed=4)  # 6 cases


def _eval(bench: Path, out: Path, server: MockServer, *extra: str) -> str:
    res = CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "openai:sampler", "--out",
                                    str(out), "--base-url", server.base_url, "--temperature", "0.8",
                                    "--max-attempts", "3", "--no-progress", *extra])
    assert res.exit_code == 0, res.output
    return res.output


def _turns(run: Path, repeat: int) -> int:
    return sum(len(r["questions"]) for r in load_results(run, repeat).values())


def test_repeats_sample_anew_and_reruns_send_nothing(bench, tmp_path):
    runs = tmp_path / "runs"
    with MockServer(hash_policy(0), keep_bodies=True) as server:
        # one sample at temperature 0.8
        _eval(bench, runs / "one", server)
        first = server.requests
        assert first == _turns(runs / "one", 0) > 0
        assert {b["seed"] for b in server.bodies} == {sample_seed(0, 0)} == {0}

        # a second run with --repeats 2 (same cache): sample 0 is reused, sample 1 is asked anew, stage 1 included
        out = _eval(bench, runs / "two", server, "--repeats", "2")
        assert "12 of 6 cases × 2 repeats run (0 failed)" in out
        new = server.bodies[first:]
        assert len(new) == server.requests - first == _turns(runs / "two", 1)
        assert {b["seed"] for b in new} == {sample_seed(0, 1)} != {0}
        stage1 = [b for b in new if len(b["messages"]) == 2]
        assert len(stage1) == 6  # the first request of every case, identical messages to sample 0's
        assert {json.dumps(b["messages"]) for b in stage1} <= {json.dumps(b["messages"]) for b in server.bodies[:first]}
        units = load_all_results(runs / "two")
        assert sorted({k for _, k in units}) == [0, 1] and len(units) == 12
        assert all(r["repeat"] == k for (_, k), r in units.items())
        assert all(q["cached"] for r in load_results(runs / "two", 0).values() for q in r["questions"])
        assert not any(q["cached"] for r in load_results(runs / "two", 1).values() for q in r["questions"])

        # the same command again sends nothing; nor does a sibling run of it
        sent = server.requests
        assert "0 of 6 cases × 2 repeats run" in _eval(bench, runs / "two", server, "--repeats", "2")
        _eval(bench, runs / "two-again", server, "--repeats", "2")
        assert server.requests == sent
        usage = json.loads((runs / "two-again" / "usage.json").read_text())
        assert usage["requests_sent"] == 0 and usage["cache_hits"] == _turns(runs / "two", 0) + _turns(runs / "two", 1)

        # resume per unit: lines lost at a kill are re-run from the cache, nothing is asked twice
        results = runs / "two" / "results.jsonl"
        lines = results.read_text().splitlines(keepends=True)
        results.write_text("".join(lines[:-3]) + lines[-3][: len(lines[-3]) // 2])  # a torn line too
        summary = json.loads(json.dumps(run_eval(
            EvalSettings(bench, "openai:sampler", temperature=0.8, repeats=2), runs / "two",
            base_url=server.base_url, retry=FAST, progress=False)))
        assert summary["n_run"] == 3 and server.requests == sent and len(load_all_results(runs / "two")) == 12

        # another seed is another sample
        _eval(bench, runs / "seed1", server, "--seed", "1", "--per-path-limit", "1")
        assert server.requests > sent and all(b["seed"] == 1 for b in server.bodies[sent:])

    # the two samples differ, so the spread is not zero; the headline is the mean of the repeats
    score = score_run(runs / "two", n_boot=0)
    assert score["repeats"] == 2
    rows = [score["paths"][p]["oracle_passed"][f"stage{s}"] for p in score["paths"] for s in (1, 2, 3, 4)]
    rows = [b for b in rows if b["n"]]
    assert all(b["acc"] == pytest.approx(sum(b["spread"]["per_repeat"]) / 2) for b in rows)
    assert all(b["spread"]["min"] <= b["acc"] <= b["spread"]["max"] for b in rows)
    assert any(b["spread"]["std"] > 0 for b in rows)
    config = json.loads((runs / "two" / "config.json").read_text())["config"]
    assert config["repeats"] == 2 and "repeats" not in json.loads((runs / "one" / "config.json").read_text())["config"]
    with pytest.raises(ConfigError, match="different configuration"):
        run_eval(EvalSettings(bench, "openai:sampler", temperature=0.8, repeats=3), runs / "two",
                 base_url="http://127.0.0.1:9/v1", retry=FAST, progress=False)
    res = CliRunner().invoke(main, ["percept", "score", str(runs / "two"), "--bootstrap", "0"])
    assert res.exit_code == 0, res.output
    printed = [json.loads(line) for line in res.output.splitlines() if line.startswith("{")]
    assert len(printed) == 2 * 2 * 3 and sum("std(stage1)" in r for r in printed) == 6
    html = render_report([score, score_run(runs / "one", n_boot=0)])
    assert "Spread across repeats" in html and " ± " in html
    assert "Spread across repeats" not in render_report([score_run(runs / "one", n_boot=0)])


def test_greedy_repeats_still_key_on_the_sample(bench, tmp_path):
    with MockServer(hash_policy(0), keep_bodies=True) as server:
        summary = run_eval(EvalSettings(bench, "openai:greedy", repeats=2, per_path_limit=1), tmp_path / "run",
                           base_url=server.base_url, retry=FAST, progress=False)
        assert summary["cache_hits"] == 0 and summary["requests_sent"] == server.requests
        assert all("seed" not in b for b in server.bodies)  # greedy requests carry no seed
    score = score_run(tmp_path / "run", n_boot=0)
    blocks = [b[s][f"stage{k}"] for b in score["paths"].values() for s in ("end_to_end", "oracle_passed")
              for k in (1, 2, 3, 4) if b[s][f"stage{k}"]["n"]]
    assert all(b["spread"]["std"] == 0.0 for b in blocks)  # the mock is deterministic without a seed


@pytest.mark.parametrize("spec", ["random", "oracle", "always-yes", "openai:mock"])
def test_stage1_is_reused_across_oracle_settings(bench, tmp_path, spec):
    """``--oracle none`` then ``--oracle implicit`` with one cache: every case's first request is a cache hit."""
    cache = tmp_path / "shared.sqlite"
    with MockServer(hash_policy(3)) as server:
        for oracle in ("none", "implicit"):
            summary = run_eval(EvalSettings(bench, spec, oracle=oracle), tmp_path / oracle, cache=cache,
                               base_url=server.base_url, retry=FAST, progress=False, concurrency=3)
            if oracle == "none":
                assert summary["cache_hits"] == 0
    records = load_results(tmp_path / "implicit")
    assert len(records) == 6 and summary["cache_hits"] >= 6
    assert all(r["questions"][0]["cached"] for r in records.values())
    assert summary["requests_sent"] == sum(not q["cached"] for r in records.values() for q in r["questions"])


def test_random_baseline_draws_anew_per_repeat(bench, tmp_path):
    run_eval(EvalSettings(bench, "random", oracle="none", repeats=3), tmp_path / "r3", progress=False)
    run_eval(EvalSettings(bench, "random", oracle="none"), tmp_path / "r1", cache=tmp_path / "other.sqlite",
             progress=False)
    answers = [{cid: [q["raw"] for q in r["questions"]] for cid, r in load_results(tmp_path / "r3", k).items()}
               for k in range(3)]
    assert answers[0] == {cid: [q["raw"] for q in r["questions"]] for cid, r in load_results(tmp_path / "r1").items()}
    assert answers[1] != answers[0] and answers[2] != answers[1]


def test_score_repeats_means_and_spread():
    plans = [{"case_id": f"c{i}", "path": "LF", "lesion": "edema",
              "questions": [{"qid": "detection", "stage": 1, "gt": [1], "n_options": 2, "multi": False}]}
             for i in range(4)]

    def results(correct: list[bool]) -> dict:
        return {f"c{i}": {"status": "ok", "questions": [{"qid": "detection", "correct": ok, "correct_lenient": ok,
                                                          "label": "parsed"}]} for i, ok in enumerate(correct)}

    a, b = results([True, True, False, False]), results([True, True, True, False])
    one = score_records(plans, a, n_boot=0)
    assert score_repeats(plans, [a], n_boot=0) == one and "repeats" not in one and spread_rows({**one, "run": {}}) == []
    same = score_repeats(plans, [a, a], n_boot=0)
    block = same["paths"]["LF"]["end_to_end"]["stage1"]
    assert block["acc"] == one["paths"]["LF"]["end_to_end"]["stage1"]["acc"] == 0.5 and block["spread"]["std"] == 0
    two = score_repeats(plans, [a, b], n_boot=50)
    block = two["paths"]["LF"]["oracle_passed"]["stage1"]
    assert block["acc"] == pytest.approx(0.625) and block["spread"]["per_repeat"] == [0.5, 0.75]
    assert block["spread"]["std"] == pytest.approx(0.1767767) and (block["spread"]["min"], block["spread"]["max"]) == (
        0.5, 0.75)
    assert block["n"] == 4 and block["ci"][0] <= 0.625 <= block["ci"][1]
    depth = two["paths"]["LF"]["depth"]
    assert depth["mean"] == pytest.approx(0.625) and depth["distribution"] == {"0": 1.5, "1": 2.5, "2": 0.0,
                                                                               "3": 0.0, "4": 0.0}
    assert two["parse"]["overall"]["n"] == 8 and two["repeats"] == 2
    missing = score_repeats(plans, [a, {k: v for k, v in b.items() if k != "c3"}], n_boot=0)
    assert missing["missing_cases"] == ["c3"] and missing["missing_units"] == [["c3", 1]]
