"""The CheXpercept runner against the mock OpenAI server: cache, oracle switch, faults, failures, resume, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ConfigError, InputError
from cxrground.evaluation.percept.clients import make_client
from cxrground.evaluation.percept.runner import EvalSettings, RetryPolicy, load_results, run_eval
from cxrground.evaluation.percept.scoring import score_run
from cxrground.percept.schema import load_benchmark
from cxrground.testing.mock_bench import make_benchmark
from cxrground.testing.mock_server import MockServer, OraclePolicy, fixed_policy, hash_policy

FAST = RetryPolicy(max_attempts=8, backoff=0.01, max_backoff=0.04, timeout=10.0)  # generous: a loaded CI machine


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return make_benchmark(tmp_path_factory.mktemp("bench"), {"LF": 2, "RF": 2, "RR": 2}, seed=1)


def _run(bench, out, server, oracle="implicit", **kw):
    settings = EvalSettings(bench, "openai:mock-vlm", oracle=oracle, **kw.pop("settings", {}))
    return run_eval(settings, out, base_url=server.base_url, progress=False, retry=kw.pop("retry", FAST),
                    concurrency=kw.pop("concurrency", 4), **kw)


def _answers(run: Path) -> dict[str, list]:
    return {cid: [(q["qid"], q["raw"], q["correct"], q["label"]) for q in r["questions"]]
            for cid, r in load_results(run).items()}


def test_rerun_is_served_from_cache_and_oracle_switch_reuses_stage1(bench, tmp_path):
    with MockServer(hash_policy(0), keep_bodies=True) as server:
        first = _run(bench, tmp_path / "implicit", server)
        n_turns = sum(len(r["questions"]) for r in load_results(tmp_path / "implicit").values())
        assert server.requests == n_turns == first["requests_sent"] and first["cache_hits"] == 0
        again = _run(bench, tmp_path / "implicit-again", server)
        assert server.requests == n_turns  # zero new requests
        assert again["cache_hits"] == n_turns and again["requests_sent"] == 0
        assert _answers(tmp_path / "implicit") == _answers(tmp_path / "implicit-again")
        before = len(server.bodies)
        _run(bench, tmp_path / "none", server, oracle="none")
        new = server.bodies[before:]
        assert all(len(b["messages"]) > 2 for b in new)  # no Stage-1 request reached the server
        assert 0 < len(new) < n_turns
        # wire format: model, decoding, images as PNG data URLs
        body = server.bodies[0]
        assert body["model"] == "mock-vlm" and body["temperature"] == 0.0 and body["max_tokens"] == 8192
        assert body["messages"][1]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    usage = json.loads((tmp_path / "implicit" / "usage.json").read_text())
    assert usage["model_versions"] == ["mock-1"] and usage["tokens"]["prompt_tokens"] > 0
    assert usage["cost_usd"] is None  # no price-table entry


def test_injected_faults_lose_nothing(bench, tmp_path):
    with MockServer(hash_policy(0)) as clean:
        _run(bench, tmp_path / "clean", clean, cache=tmp_path / "c1.sqlite")
    faults = {"429": 0.15, "500": 0.15, "timeout": 0.05}
    with MockServer(hash_policy(0), fault_rates=faults, seed=3, timeout_sleep=0.8, faults=["429:0.05", "500"]) as s:
        summary = _run(bench, tmp_path / "faulty", s, cache=tmp_path / "c2.sqlite",
                       retry=RetryPolicy(max_attempts=20, backoff=0.01, max_backoff=0.04, timeout=0.3))
        assert s.requests > s.completed - 1 and summary["retries"] > 0
    assert summary["failed_this_run"] == 0
    assert _answers(tmp_path / "faulty") == _answers(tmp_path / "clean")


def test_persistent_failure_is_recorded_and_counted_wrong(bench, tmp_path):
    """A server that stops answering (503 for good) fails the cases it gave no answer to: recorded as failed with
    ``no_answer``, counted wrong, and run again by a plain rerun (fewer than the stop rule's cases in a row)."""
    with MockServer(OraclePolicy(load_benchmark(bench)), max_requests=3) as server:
        summary = _run(bench, tmp_path / "run", server, concurrency=1, settings={"limit": 6},
                       retry=RetryPolicy(max_attempts=2, backoff=0.01, max_backoff=0.02, timeout=10.0))
    results = load_results(tmp_path / "run")
    assert len(results) == 6 and summary["failed_this_run"] > 0
    failed = [r for r in results.values() if r["status"] == "failed"]
    assert all("HTTP 503" in r["error"] and "after 2 attempts" in r["error"] and r["no_answer"] for r in failed)
    assert summary["no_answer_this_run"] == len(failed)
    assert all(q["label"] == "failed" and not q["correct"] for r in failed for q in r["questions"] if q["raw"] is None)
    score = score_run(tmp_path / "run", n_boot=0)
    assert sorted(score["failed_cases"]) == sorted(r["case_id"] for r in failed)
    assert sum(b["n"] for b in score["paths"].values()) == 6
    # a plain rerun runs the cases the server gave no answer to again (oracle answers → all correct)
    with MockServer(OraclePolicy(load_benchmark(bench))) as server:
        again = _run(bench, tmp_path / "run", server, settings={"limit": 6})
    assert again["n_run"] == len(failed)
    score = score_run(tmp_path / "run", n_boot=0)
    assert not score["failed_cases"]


@pytest.mark.parametrize("content", ["", None, "I cannot tell."])
def test_empty_none_or_unparseable_answers_count_wrong(bench, tmp_path, content):
    with MockServer(fixed_policy(content)) as server:
        _run(bench, tmp_path / "run", server, oracle="none", settings={"per_path_limit": 1})
    score = score_run(tmp_path / "run", n_boot=0)
    for block in score["paths"].values():
        assert block["n"] == 1 and block["end_to_end"]["stage1"]["acc"] == 0.0
    assert score["paths"]["RR"]["oracle_passed"]["stage3"]["n"] == 1
    assert score["parse"]["overall"]["unparseable"] == 1.0


def test_an_empty_reply_is_scored_but_not_cached(bench, tmp_path):
    """An empty or null reply (a glitch, maybe) is scored unparseable where it came, but a later run on the same
    cache asks that question again instead of reusing it."""
    asked: dict[str, int] = {}
    answer = hash_policy(0)

    def empty_once(body: dict) -> str | None:  # a yes/no question: "" or null the first time, then an answer
        key = json.dumps([body["messages"][1], body["messages"][-1]], sort_keys=True)  # case + question
        asked[key] = asked.get(key, 0) + 1
        if asked[key] == 1 and "Options:\\n(1) Yes" in json.dumps(body["messages"][-1]["content"]):
            return None if len(asked) % 2 else ""
        return answer(body)

    with MockServer(empty_once) as server:
        _run(bench, tmp_path / "first", server, oracle="none")
        blank = [(cid, q[0]) for cid, qs in _answers(tmp_path / "first").items() for q in qs if not q[1]]
        assert blank and all(qid in ("detection", "contour_eval") for _, qid in blank)
        assert all(q[3] == "unparseable" for qs in _answers(tmp_path / "first").values() for q in qs if not q[1])
        second = _run(bench, tmp_path / "second", server, oracle="none")
        assert second["requests_sent"] >= len(blank)
        assert all(q[1] for qs in _answers(tmp_path / "second").values() for q in qs)  # asked again: answered
        third = _run(bench, tmp_path / "third", server, oracle="none")
        assert third["requests_sent"] == 0  # the answers are cached


def test_config_mismatch_max_images_and_keys(bench, tmp_path, monkeypatch):
    with MockServer(hash_policy(1)) as server:
        _run(bench, tmp_path / "run", server, settings={"limit": 2})
        with pytest.raises(ConfigError, match="different configuration"):
            _run(bench, tmp_path / "run", server, settings={"limit": 2, "temperature": 0.5})
        with pytest.raises(ConfigError, match="needs 7"):
            _run(bench, tmp_path / "few", server, settings={"max_images": 5})
        monkeypatch.setenv("MOCK_KEY", "sk-test-123")
        cli = CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "openai:m", "--out",
                                        str(tmp_path / "keyed"), "--base-url", server.base_url, "--api-key-env",
                                        "MOCK_KEY", "--limit", "1", "--no-progress"])
        assert cli.exit_code == 0, cli.output
        assert server.headers[-1].get("Authorization") == "Bearer sk-test-123"
    cli = CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "openai:m", "--out",
                                    str(tmp_path / "x"), "--api-key", "sk-123"])
    assert cli.exit_code != 0 and "No such option" in cli.output
    with pytest.raises(ConfigError, match="not set"):
        make_client("openai:m", base_url="http://127.0.0.1:9/v1", api_key_env="UNSET_VAR_FOR_TEST")
    with pytest.raises(ConfigError):
        make_client("nonsense")
    with pytest.raises(ConfigError):
        make_client("oracle:x")


def test_baselines_end_to_end_via_cli(bench, tmp_path):
    runner = CliRunner()
    for spec, oracle in (("oracle", "implicit"), ("random", "none"), ("always-yes", "none")):
        res = runner.invoke(main, ["percept", "eval", "--bench", str(bench), "--model", spec, "--out",
                                   str(tmp_path / spec), "--oracle", oracle, "--no-progress", "--concurrency", "3"])
        assert res.exit_code == 0, res.output
        res = runner.invoke(main, ["percept", "score", str(tmp_path / spec), "--bootstrap", "50"])
        assert res.exit_code == 0, res.output
    oracle = json.loads((tmp_path / "oracle" / "score.json").read_text())
    assert all(b["end_to_end"][f"stage{s}"]["acc"] in (1.0, None)
               for b in oracle["paths"].values() for s in (1, 2, 3, 4))
    assert oracle["paths"]["RR"]["depth"]["mean"] == 4.0 and oracle["paths"]["RF"]["depth"]["mean"] == 3.0
    yes = json.loads((tmp_path / "always-yes" / "score.json").read_text())
    assert yes["paths"]["RR"]["oracle_passed"]["stage1"]["acc"] == 1.0
    assert yes["paths"]["LF"]["oracle_passed"]["stage1"]["acc"] == 0.0
    # the random baseline does not depend on concurrency
    res = runner.invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "random", "--out",
                               str(tmp_path / "random1"), "--oracle", "none", "--no-progress", "--concurrency", "1"])
    assert res.exit_code == 0
    assert _answers(tmp_path / "random1") == _answers(tmp_path / "random")


def test_resume_after_kill_loses_and_repeats_nothing(bench, tmp_path):
    cmd = [sys.executable, "-m", "cxrground", "percept", "eval", "--bench", str(bench), "--model", "openai:mock",
           "--oracle", "implicit", "--concurrency", "2", "--no-progress", "--timeout", "5"]
    with MockServer(hash_policy(2), latency=0.03) as server:
        run = tmp_path / "killed"
        proc = subprocess.Popen([*cmd, "--out", str(run), "--base-url", server.base_url],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        results = run / "results.jsonl"
        while time.time() < deadline:
            if results.is_file() and results.read_text().count("\n") >= 3:
                break
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        lines_before = results.read_text().count("\n")
        assert 3 <= lines_before < 12
        requests_killed = server.requests
        summary = run_eval(EvalSettings(bench, "openai:mock", oracle="implicit"), run, base_url=server.base_url,
                           progress=False, retry=FAST, concurrency=2)
        assert summary["n_run"] == 12 - lines_before
        lines = [json.loads(x) for x in results.read_text().splitlines()]
        ids = [x["case_id"] for x in lines]
        assert len(ids) == len(set(ids)) == 12
        # answered turns of the partial cases came from the cache: only the (at most 2) requests in flight at
        # the kill were sent twice
        turns = sum(len(x["questions"]) for x in lines)
        assert turns <= server.requests <= turns + 2 and server.requests >= requests_killed
    with MockServer(hash_policy(2)) as fresh:
        _run(bench, tmp_path / "uninterrupted", fresh, cache=tmp_path / "other.sqlite")
    assert _answers(run) == _answers(tmp_path / "uninterrupted")


def test_a_refused_key_or_a_wrong_url_stops_the_run_and_keeps_what_was_done(bench, tmp_path):
    with MockServer(hash_policy(0), faults=["ok"] * 3 + ["401"]) as server:
        with pytest.raises(ConfigError, match=r"the run stops: .*refused the request \(HTTP 401"):
            _run(bench, tmp_path / "key", server, concurrency=1)
        kept = load_results(tmp_path / "key")
        assert all(r["status"] == "ok" for r in kept.values())  # no case recorded as failed for the key
        with pytest.raises(ConfigError, match=r"HTTP 404"):  # the API root without /v1
            run_eval(EvalSettings(bench, "openai:mock-vlm", oracle="none"), tmp_path / "path",
                     base_url=server.base_url.removesuffix("/v1"), progress=False, retry=FAST)
    with pytest.raises(ConfigError, match="not an http:// or https:// URL"):
        run_eval(EvalSettings(bench, "openai:mock-vlm", oracle="none"), tmp_path / "url", base_url="not-a-url",
                 progress=False, retry=FAST)


def test_eval_exits_1_when_every_case_it_ran_failed(bench, tmp_path):
    # every request refused with a 400 (an answer of the server, not a transport failure): failures are kept
    with MockServer(hash_policy(0), faults=["400-schema"] * 4) as server:
        args = ["percept", "eval", "--bench", str(bench), "--model", "openai:mock-vlm", "--base-url",
                server.base_url, "--out", str(tmp_path / "run"), "--oracle", "none", "--no-progress",
                "--max-attempts", "1", "--limit", "2", "--extra-body", '{"response_format": {"type": "text"}}']
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 1 and "2 of 2 cases run (2 failed)" in res.output
        assert "every case failed" in res.output
        again = CliRunner().invoke(main, args)  # a rerun keeps the failures: said, and still exit 1
        assert again.exit_code == 1 and "0 of 2 cases run (0 failed); 2 failed in an earlier run and kept" in \
            again.output and "--retry-failed" in again.output
    with MockServer(hash_policy(0), max_requests=0) as server:  # every request: 503, no answer
        args[args.index("--base-url") + 1] = server.base_url
        args[args.index("--out") + 1] = str(tmp_path / "down")
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 1 and "2 of 2 cases run (2 failed, 2 of them got no answer from the server: rerun "\
            "to run them again)" in res.output
    with MockServer(OraclePolicy(load_benchmark(bench))) as server:
        args[args.index("--base-url") + 1] = server.base_url
        res = CliRunner().invoke(main, args)  # the cases without an answer run again without --retry-failed
        assert res.exit_code == 0 and "2 of 2 cases run (0 failed)" in res.output, res.output
        args[args.index("--out") + 1] = str(tmp_path / "run")
        res = CliRunner().invoke(main, [*args, "--retry-failed"])
        assert res.exit_code == 0 and "(0 failed)" in res.output, res.output


def test_the_oracle_answers_a_changed_ground_truth_afresh(bench, tmp_path):
    from cxrground.evaluation.percept.clients.baselines import BaselineClient
    from cxrground.evaluation.percept.conversation import Question

    q = Question("location", 4, "Where?", (), ("a", "b", "c", "None"), (1,))
    oracle, rand = BaselineClient("oracle"), BaselineClient("random")
    changed = Question("location", 4, "Where?", (), ("a", "b", "c", "None"), (1, 2))
    assert oracle.cache_context(q, "c1") != oracle.cache_context(changed, "c1")
    assert rand.cache_context(q, "c1") == rand.cache_context(changed, "c1")  # random reads no ground truth
    assert rand.cache_context(q, "c1") != rand.cache_context(q, "c2")


def test_a_benchmark_edited_since_its_manifest_is_refused_by_name(bench, tmp_path):
    import shutil

    from cxrground.percept.layout import MANIFEST_FILE
    from cxrground.percept.manifest import manifest_lines

    copy = tmp_path / "bench"
    shutil.copytree(bench, copy)
    (copy / MANIFEST_FILE).write_text("".join(line + "\n" for line in manifest_lines(copy)))
    settings = EvalSettings(copy, "oracle", oracle="none")
    run_eval(settings, tmp_path / "clean", progress=False)  # as built: runs
    image = sorted((copy / "cases").rglob("*.png"))[0]
    data = bytearray(image.read_bytes())
    data[-20] ^= 1
    image.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"benchmark changed since it was built: 1 file\(s\) differ .*" +
                       image.relative_to(copy).as_posix()):
        run_eval(settings, tmp_path / "edited", progress=False)


def test_a_server_no_request_reaches_stops_the_run(bench, tmp_path):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"the run stops: cannot reach http://127.0.0.1:{port}/v1 .*--base-url"):
        run_eval(EvalSettings(bench, "openai:mock-vlm", oracle="none"), tmp_path / "run",
                 base_url=f"http://127.0.0.1:{port}/v1", progress=False, retry=FAST, concurrency=2)
    assert time.perf_counter() - started < 30
    assert not load_results(tmp_path / "run")  # no case recorded as failed for the URL
