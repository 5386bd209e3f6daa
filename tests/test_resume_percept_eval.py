"""``percept eval`` resume safety: a model replaced at the same name/path (another identity) is refused, and
``usage.json`` keeps a killed session's request counts."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cxrground.errors import ConfigError
from cxrground.evaluation.percept.clients import make_client
from cxrground.evaluation.percept.runner import EvalSettings, run_eval
from cxrground.testing.mock_bench import make_benchmark


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return make_benchmark(tmp_path_factory.mktemp("bench"), {"LF": 1, "RF": 1, "RR": 1}, seed=1)


class _Wrapped:
    """A baseline client with another identity (a checkpoint digest) and a hook called before each request."""

    def __init__(self, digest: str, hook: Any = None, usage: dict[str, int] | None = None) -> None:
        self._inner = make_client("first-option")
        self._digest, self._hook, self.sent, self._usage = digest, hook, 0, usage

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def identity(self) -> dict[str, Any]:
        return {**self._inner.identity, "checkpoint_fingerprint": self._digest}

    async def complete(self, messages, question, case_id="", seed=None):
        self.sent += 1
        if self._hook is not None:
            self._hook(self.sent)
        got = await self._inner.complete(messages, question, case_id, seed)
        return replace(got, usage=dict(self._usage)) if self._usage else got


def test_a_replaced_model_at_the_same_name_is_refused_on_resume(bench, tmp_path) -> None:
    run = tmp_path / "run"
    settings = EvalSettings(bench, "first-option", limit=2)
    run_eval(settings, run, progress=False, client=_Wrapped("aaa"))
    cfg = json.loads((run / "config.json").read_text())["config"]
    assert cfg["client"]["identity"]["checkpoint_fingerprint"] == "aaa"
    run_eval(settings, run, progress=False, client=_Wrapped("aaa"))  # the same model resumes
    with pytest.raises(ConfigError, match=r"different configuration.*client"):
        run_eval(settings, run, progress=False, client=_Wrapped("bbb"))


def test_usage_keeps_the_request_counts_of_a_killed_session(bench, tmp_path) -> None:
    run, killed = tmp_path / "run", tmp_path / "killed"

    def snapshot(sent: int) -> None:
        if sent == 7:  # mid-run: the folder as a kill at this request leaves it
            shutil.copytree(run, killed)

    run_eval(EvalSettings(bench, "first-option"), run, progress=False, concurrency=1, cache=tmp_path / "a.sqlite",
             client=_Wrapped("x", snapshot))
    usage = json.loads((killed / "usage.json").read_text())
    records = [json.loads(line) for line in (killed / "results.jsonl").read_text().splitlines()]
    finished = sum(len(r["questions"]) for r in records)
    assert usage["requests_sent"] == 6 > finished > 0  # every answer before the kill, those of the open case too
    total = json.loads((run / "usage.json").read_text())["requests_sent"]
    resumed = run_eval(EvalSettings(bench, "first-option"), killed, progress=False, concurrency=1,
                       cache=tmp_path / "b.sqlite", client=_Wrapped("x"))
    # every request sent is counted: the killed session's and the resumed session's, which asks the open case's
    # questions again
    assert resumed["requests_sent"] == 6 + resumed["sent_this_run"] == total + 6 - finished
    assert json.loads((killed / "usage.json").read_text())["requests_sent"] == resumed["requests_sent"]


def test_usage_counts_the_tokens_of_every_response_received_as_it_counts_requests(bench, tmp_path) -> None:
    run, killed = tmp_path / "run", tmp_path / "killed"
    usage = {"prompt_tokens": 100, "completion_tokens": 3}

    def snapshot(sent: int) -> None:
        if sent == 7:
            shutil.copytree(run, killed)

    done = run_eval(EvalSettings(bench, "first-option"), run, progress=False, concurrency=1,
                    cache=tmp_path / "a.sqlite", client=_Wrapped("x", snapshot, usage))
    assert done["tokens_sent"]["completion_tokens"] == 3 * done["requests_sent"] == done["tokens"]["completion_tokens"]
    before = json.loads((killed / "usage.json").read_text())
    assert before["tokens_sent"]["completion_tokens"] == 3 * before["requests_sent"] > 0
    resumed = run_eval(EvalSettings(bench, "first-option"), killed, progress=False, concurrency=1,
                       cache=tmp_path / "b.sqlite", client=_Wrapped("x", None, usage))
    # over both sessions, as many tokens as responses received; the priced cost follows the same count
    assert resumed["tokens_sent"]["completion_tokens"] == 3 * resumed["requests_sent"]
    assert resumed["tokens_sent"]["prompt_tokens"] == 100 * resumed["requests_sent"]


def test_tokens_sent_is_unknown_for_a_folder_whose_earlier_sessions_did_not_count_them(bench, tmp_path) -> None:
    run, old = tmp_path / "run", tmp_path / "old"

    def snapshot(sent: int) -> None:
        if sent == 7:
            shutil.copytree(run, old)

    run_eval(EvalSettings(bench, "first-option"), run, progress=False, concurrency=1, cache=tmp_path / "a.sqlite",
             client=_Wrapped("x", snapshot, {"completion_tokens": 3}))
    usage = json.loads((old / "usage.json").read_text())
    del usage["tokens_sent"], usage["cost_usd_sent"]  # as an older version wrote it
    (old / "usage.json").write_text(json.dumps(usage))
    resumed = run_eval(EvalSettings(bench, "first-option"), old, progress=False, concurrency=1,
                       cache=tmp_path / "b.sqlite", client=_Wrapped("x", None, {"completion_tokens": 3}))
    assert resumed["requests_sent"] > 0 and resumed["tokens_sent"] is None and resumed["cost_usd_sent"] is None


class _AlwaysAnswers:
    """A plug-in client answering every question with one option, whose identity names only the model (as a
    plug-in's may): two of them differ by ``kind`` alone."""

    max_images, decoding = 7, {"temperature": 0.0}

    def __init__(self, kind: str, answer: int) -> None:
        self.kind, self.model, self._answer = kind, "m", answer

    @property
    def identity(self) -> dict[str, Any]:
        return {"model": self.model}

    def cache_context(self, question, case_id):
        return None

    async def complete(self, messages, question, case_id="", seed=None):
        from cxrground.evaluation.percept.clients import Completion

        return Completion(f"Answer: {self._answer}", {}, None)

    async def aclose(self) -> None:
        return None


def test_two_clients_whose_identities_agree_never_share_cached_answers(bench, tmp_path) -> None:
    cache = tmp_path / "shared.sqlite"
    settings = EvalSettings(bench, "first-option", limit=2)
    one = run_eval(settings, tmp_path / "one", progress=False, cache=cache, client=_AlwaysAnswers("alwaysone", 1))
    two = run_eval(settings, tmp_path / "two", progress=False, cache=cache, client=_AlwaysAnswers("alwaystwo", 2))
    assert one["requests_sent"] == two["requests_sent"] > 0 and two["cache_hits"] == 0
    raws = {q["raw"] for line in (tmp_path / "two" / "results.jsonl").read_text().splitlines()
            for q in json.loads(line)["questions"]}
    assert raws == {"Answer: 2"}
    again = run_eval(settings, tmp_path / "two-again", progress=False, cache=cache,
                     client=_AlwaysAnswers("alwaystwo", 2))
    assert again["requests_sent"] == 0 and again["cache_hits"] == two["requests_sent"]  # its own answers are reused
