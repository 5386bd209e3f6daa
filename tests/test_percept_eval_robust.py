"""``percept eval`` against servers that die, hang, cut answers, send empty replies, and a damaged cache."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import BatchStopped
from cxrground.evaluation.percept.runner import EvalSettings, RetryPolicy, load_results, run_eval
from cxrground.evaluation.percept.scoring import score_lines, score_run
from cxrground.percept.schema import load_benchmark
from cxrground.testing.mock_bench import make_benchmark
from cxrground.testing.mock_server import MockServer, OraclePolicy

ONE_TRY = RetryPolicy(max_attempts=1, backoff=0.0, max_backoff=0.0, timeout=10.0)  # generous: a loaded CI machine
#: For the hanging server: a request it holds (3 s) times out; an answered one has a second.
HANG_TRY = RetryPolicy(max_attempts=1, backoff=0.0, max_backoff=0.0, timeout=1.0)


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return make_benchmark(tmp_path_factory.mktemp("bench"), {"LF": 2, "RF": 2, "RR": 2}, seed=1)


def _run(bench, out, server, **kw):
    settings = EvalSettings(bench, "openai:mock-vlm", oracle="implicit", **kw.pop("settings", {}))
    return run_eval(settings, out, base_url=server.base_url, progress=False, retry=kw.pop("retry", ONE_TRY),
                    concurrency=kw.pop("concurrency", 1), **kw)


@pytest.mark.parametrize("fault", ["503", "hang"])
def test_a_server_that_dies_or_hangs_stops_the_run_and_a_rerun_resumes(bench, tmp_path, fault):
    oracle = OraclePolicy(load_benchmark(bench))
    kw = {"max_requests": 3} if fault == "503" else {"faults": ["ok"] * 3 + ["timeout"] * 40, "timeout_sleep": 3.0}
    with MockServer(oracle, **kw) as server:
        with pytest.raises(BatchStopped) as got:
            _run(bench, tmp_path / "run", server, retry=HANG_TRY if fault == "hang" else ONE_TRY)
        assert server.requests <= 3 + 8  # stopped after 8 cases in a row without an answer, not one per case
    message = str(got.value)
    assert "the run stops: 8 cases in a row got no answer from" in message
    assert "the server has stopped answering" in message and "rerun the same command to resume" in message
    done = load_results(tmp_path / "run")
    answered = sum(r["status"] == "ok" for r in done.values())
    assert f"{answered} of 12 cases are answered" in message
    failed = [r for r in done.values() if r["status"] == "failed"]
    assert len(failed) == 7 and all(r["no_answer"] for r in failed)  # the 8th stopped the run unrecorded
    _, note = score_lines(score_run(tmp_path / "run", n_boot=0))
    assert note is not None and "7 of them got no answer from the model server" in note
    with MockServer(oracle) as server:  # the same command once the server is back: every case answered
        summary = _run(bench, tmp_path / "run", server)
    assert summary["failed_units"] == 0 and summary["n_run"] == 12 - answered
    score = score_run(tmp_path / "run", n_boot=0)
    assert not score["failed_cases"] and score["paths"]["RR"]["depth"]["mean"] == 4.0


def test_strict_exits_3_when_cases_failed(bench, tmp_path):
    with MockServer(OraclePolicy(load_benchmark(bench)), faults=["ok"] * 4 + ["400-schema"]) as server:
        args = ["percept", "eval", "--bench", str(bench), "--model", "openai:mock-vlm", "--base-url",
                server.base_url, "--out", str(tmp_path / "run"), "--no-progress", "--max-attempts", "1",
                "--concurrency", "1", "--limit", "3", "--extra-body", '{"response_format": {"type": "text"}}']
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0 and "3 of 3 cases run (1 failed)" in res.output, res.output
        res = CliRunner().invoke(main, [*args, "--strict"])
        assert res.exit_code == 3 and "1 cases of the run folder failed" in res.output, res.output


def _cut_some(oracle):
    def policy(body):
        answer = oracle(body)
        text = json.dumps(body["messages"][-1]["content"])
        if "Options:\\n(1) Yes" in text and len(body["messages"]) <= 2:  # the first (yes/no) question: cut
            return {"content": f"<think>Maybe {answer}, or", "finish_reason": "length"}
        return answer
    return policy


def test_an_answer_cut_at_max_tokens_is_a_failed_question_not_the_models_answer(bench, tmp_path):
    oracle = OraclePolicy(load_benchmark(bench))
    with MockServer(_cut_some(oracle)) as server:
        summary = _run(bench, tmp_path / "cut", server, cache=tmp_path / "c.sqlite")
    assert summary["cut_this_run"] == 12 and summary["answers_cut"] == 12
    first = [r["questions"][0] for r in load_results(tmp_path / "cut").values()]
    assert all(q["label"] == "failed" and not q["correct"] and q["finish_reason"] == "length" for q in first)
    assert all(q["error"] == "answer cut at max_tokens=8192 (finish_reason=length): raise --max-tokens"
               for q in first)
    _, note = score_lines(score_run(tmp_path / "cut", n_boot=0))
    assert note is not None and "answers cut at max_tokens: 12" in note
    with MockServer(oracle) as server:  # cut answers were not cached: asked again on the same cache
        again = _run(bench, tmp_path / "again", server, cache=tmp_path / "c.sqlite")
    assert again["cut_this_run"] == 0
    assert all(r["questions"][0]["correct"] for r in load_results(tmp_path / "again").values())


@pytest.mark.parametrize(("message", "said"), [
    ({"content": None, "tool_calls": [{"id": "1", "type": "function",
                                       "function": {"name": "answer", "arguments": "{}"}}]},
     "12 empty replies (no answer text; scored unparseable; 12 held tool calls only"),
    ({"content": None, "reasoning_content": "Let me think"}, "12 empty replies (no answer text; scored unparseable)"),
])
def test_empty_replies_are_counted_and_reasoning_only_is_not_cached(bench, tmp_path, message, said):
    oracle = OraclePolicy(load_benchmark(bench))

    def policy(body):
        if len(body["messages"]) <= 2:  # the first question of each case
            return dict(message)
        return oracle(body)

    with MockServer(policy) as server:
        summary = _run(bench, tmp_path / "run", server, cache=tmp_path / "c.sqlite")
    from cxrground.evaluation.percept.runner import run_summary_line

    assert said in run_summary_line(summary, 1, tmp_path / "run")
    with MockServer(oracle) as server:
        again = _run(bench, tmp_path / "again", server, cache=tmp_path / "c.sqlite")
    assert again["empty_this_run"] == 0  # none of them was cached: asked again
    assert all(r["questions"][0]["correct"] for r in load_results(tmp_path / "again").values())


def test_a_damaged_cache_row_is_asked_again_and_overwritten(bench, tmp_path):
    oracle = OraclePolicy(load_benchmark(bench))
    cache = tmp_path / "c.sqlite"
    with MockServer(oracle) as server:
        _run(bench, tmp_path / "first", server, cache=cache, settings={"limit": 2})
        with sqlite3.connect(cache) as db:
            db.execute("UPDATE responses SET response = substr(response, 1, 20) WHERE rowid = 1")
            db.execute("UPDATE responses SET response = '[1, 2]' WHERE rowid = 2")
        summary = _run(bench, tmp_path / "second", server, cache=cache, settings={"limit": 2})
        assert summary["failed_units"] == 0 and summary["sent_this_run"] == 2
        assert summary["cache_corrupt_this_run"] == 2
        third = _run(bench, tmp_path / "third", server, cache=cache, settings={"limit": 2})
        assert third["sent_this_run"] == 0 and third["cache_corrupt_this_run"] == 0  # overwritten
    assert load_results(tmp_path / "first") .keys() == load_results(tmp_path / "second").keys()


def test_retries_are_noted_and_a_long_retry_after_is_capped(bench, tmp_path):
    notes: list[str] = []
    with MockServer(OraclePolicy(load_benchmark(bench)), faults=["429:86400"]) as server:
        summary = _run(bench, tmp_path / "run", server, note=notes.append, settings={"limit": 1},
                       retry=RetryPolicy(max_attempts=3, backoff=0.01, max_backoff=0.02, max_retry_after=0.05))
    assert summary["failed_units"] == 0 and summary["retries"] == 1
    assert notes == ["percept eval: retrying 1 request (HTTP 429), next in 0.1 s; the server asked to wait 86400 s "
                     "(Retry-After), capped at 0.05 s (max_retry_after)"]
