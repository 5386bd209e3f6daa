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


def test_a_daily_quota_stops_the_run_keeping_what_was_done_and_a_rerun_resumes(bench, tmp_path):
    """A Retry-After above --max-retry-after (a daily quota) is not waited for, nor retried: the run stops at once
    (exit 1, one line naming the wait and the option), the cases answered are kept, the plain rerun finishes."""
    oracle = OraclePolicy(load_benchmark(bench))
    run = tmp_path / "run"
    args = ["percept", "eval", "--bench", str(bench), "--model", "openai:mock-vlm", "--out", str(run),
            "--no-progress", "--concurrency", "1", "--timeout", "10", "--backoff", "0", "--max-retry-after", "2"]
    with MockServer(oracle, faults=["ok"] * 5 + ["429:86400"]) as server:
        res = CliRunner().invoke(main, [*args, "--base-url", server.base_url])
        assert server.requests == 6  # not retried
    assert res.exit_code == 1, res.output
    error = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, res.output
    assert ("the run stops: the server asks to wait 86400 s (24 h) before the next request (Retry-After of an HTTP "
            "429: a quota used up?), longer than --max-retry-after (2 s) allows") in error[0]
    done = load_results(run)
    answered = sum(r["status"] == "ok" for r in done.values())
    assert answered >= 1 and not any(r["status"] == "failed" for r in done.values())  # the stopped case: unrecorded
    assert f"{answered} of 12 cases are answered and kept in {run}; rerun the same command to resume" in error[0]
    with MockServer(oracle) as server:  # the wait is over: the plain rerun runs the rest
        res = CliRunner().invoke(main, [*args, "--base-url", server.base_url])
    assert res.exit_code == 0 and f"{12 - answered} of 12 cases run (0 failed)" in res.output, res.output
    with MockServer(oracle, faults=["429:0.05"]) as server:  # a wait within the cap is waited out
        summary = _run(bench, tmp_path / "short", server, settings={"limit": 1},
                       retry=RetryPolicy(max_attempts=2, backoff=0.0, max_backoff=0.0, max_retry_after=0.05,
                                         timeout=10.0))
    assert summary["failed_units"] == 0 and summary["retries"] == 1


def test_a_rate_limit_lowers_the_requests_in_flight_and_is_noted(bench, tmp_path):
    """Against a token-bucket rate limit the run keeps fewer requests in flight, says so once in the retry notes,
    and no case spends its attempts."""
    notes: list[str] = []
    with MockServer(OraclePolicy(load_benchmark(bench)), rate_limit=(200.0, 2.0), latency=0.02) as server:
        summary = _run(bench, tmp_path / "run", server, note=notes.append, concurrency=8,
                       retry=RetryPolicy(max_attempts=20, backoff=0.005, max_backoff=0.01, timeout=10.0))
    assert summary["failed_units"] == 0 and server.statuses[429] >= 1
    limited = [n for n in notes if "; rate limited: " in n]
    assert limited and limited[0].endswith("rate limited: 4 requests in flight"), notes  # the first cut: 8 -> 4
    assert len(set(limited)) == len(limited)  # each said once


def test_a_redirect_stops_the_run_naming_the_location(bench, tmp_path):
    with MockServer(OraclePolicy(load_benchmark(bench)), faults=["ok", "308"],
                    redirect_to="https://api.example.com/v1/chat/completions") as server:
        with pytest.raises(BatchStopped) as got:
            _run(bench, tmp_path / "run", server)
        assert server.requests == 2
    message = str(got.value)
    assert message.startswith(f"the run stops: {server.base_url}/chat/completions answered HTTP 308, a redirect to "
                              "https://api.example.com/v1/chat/completions; a POST is not followed")
    assert "use --base-url https://api.example.com/v1 if that is the server you mean" in message


def test_content_sent_as_a_list_of_parts_is_scored_as_its_text(bench, tmp_path):
    oracle = OraclePolicy(load_benchmark(bench))

    def parts(body):
        answer = oracle(body)
        return {"content": [{"type": "text", "text": answer[:3]}, {"type": "image_url", "image_url": {"url": "x"}},
                            {"type": "text", "text": answer[3:]}]}

    with MockServer(parts) as server:
        summary = _run(bench, tmp_path / "run", server)
    assert summary["failed_units"] == 0 and summary["empty_this_run"] == 0
    score = score_run(tmp_path / "run", n_boot=0)
    assert score["paths"]["RR"]["depth"]["mean"] == 4.0
    with MockServer(lambda body: {"content": [{"type": "image_url", "image_url": {"url": "x"}}]}) as server:
        empty = _run(bench, tmp_path / "empty", server, settings={"limit": 1})
    assert empty["empty_this_run"] >= 1  # no text part: an empty reply, scored unparseable, not cached


def test_no_cache_endpoint_reuses_the_answers_of_the_same_model_at_another_url(bench, tmp_path):
    oracle = OraclePolicy(load_benchmark(bench))
    cache = tmp_path / "c.sqlite"
    with MockServer(oracle) as server:
        first = _run(bench, tmp_path / "a", server, cache=cache, cache_endpoint=False)
    with MockServer(oracle) as moved:  # another port: another base URL
        again = _run(bench, tmp_path / "b", moved, cache=cache, cache_endpoint=False)
        assert moved.requests == 0
        keyed = _run(bench, tmp_path / "c", moved, cache=cache)  # the default keys by the endpoint too
    assert first["sent_this_run"] > 0 and again["sent_this_run"] == 0 and again["cache_hits_this_run"] > 0
    assert keyed["sent_this_run"] == first["sent_this_run"]
