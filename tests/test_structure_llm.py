"""LLM structurer against a real local HTTP server speaking the OpenAI chat-completions wire format.

The fake server (127.0.0.1, ephemeral port, one per test) answers step 1 with the rule structurer's findings
of the numbered section and step 2 with the lexicon's labels; it can inject 429 / 500 / timeouts / a 400 for
``response_format`` and refuses to serve more than ``max_requests`` requests.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cxrground.errors import BatchStopped, ConfigError
from cxrground.llm import RetryPolicy
from cxrground.reports import make_section_choice, parse_numbered, parse_report_text
from cxrground.reports.structure import (
    LLMError,
    LLMStructurer,
    ResponseCache,
    RuleStructurer,
    cache_key,
    get_structurer,
    load_prompt,
    structure_reports,
)
from cxrground.reports.structure.lexicon import LOCATION_KINDS, LOCATION_RE, is_extent_phrase, location_labels
from cxrground.reports.structure.llm import LOCATION_PROMPT, STRUCTURE_PROMPT, extract_json
from cxrground.testing.mock_server import MockServer
from cxrground.vocab import ILS_LOCATION_LABELS, LESIONS

RULES = RuleStructurer()


def _rule_answer(body: dict[str, Any]) -> dict[str, Any]:
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    if system.startswith("# ILS report structuring"):
        content = user.split("\n", 1)[1]
        findings = []
        for idx, text in parse_numbered(content):
            for f in RULES.structure_sentence(idx, text):
                findings.append({"entity": f.entity, "sent_idx": f.sent_idx, "assertion": f.assertion,
                                 "lesion": f.lesion, "location_phrases": list(f.location_phrases),
                                 "hedge": f.hedge})
        return {"findings": findings}
    items = json.loads(user)
    mappings = []
    for item in items:
        labels: list[str] = []
        placed = [p for p in item["location_phrases"] if not is_extent_phrase(p)]  # location_v3: extent words
        for phrase in placed or item["location_phrases"]:
            for m in LOCATION_RE.finditer(phrase.lower()):
                labels.extend(location_labels(LOCATION_KINDS[m.lastgroup], m.group()))
        mappings.append({"id": item["id"], "labels": list(dict.fromkeys(labels))})
    return {"mappings": mappings}


class FakeLLM(MockServer):
    """The harness's mock OpenAI server answering with ``answer(body)`` as JSON text; ``requests`` counts all.

    Faults (``faults``, one per request): "429", "429:SECONDS", "500", "timeout" (2.5 s), "400-schema", "ok";
    ``fail_if(body)`` → 500; ``text_wrap`` puts the answer in a ```json fence with prose; ``delay`` seconds per
    answer; at most ``max_requests`` requests are served; other keywords go to :class:`MockServer` (``rate_limit``).
    """

    def __init__(self, answer: Callable[[dict[str, Any]], Any] = _rule_answer, max_requests: int = 60,
                 port: int = 0, **kw: Any) -> None:
        self.answer = answer
        self.text_wrap = False
        super().__init__(self._content, max_requests=max_requests, keep_bodies=True, timeout_sleep=2.5, port=port,
                         **kw)

    def _content(self, body: dict[str, Any]) -> str:
        content = json.dumps(self.answer(body))
        return f"Here is the JSON:\n```json\n{content}\n```\nDone." if self.text_wrap else content

    @property
    def delay(self) -> float:
        return self.latency

    @delay.setter
    def delay(self, value: float) -> None:
        self.latency = value


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def _llm(fake: FakeLLM, **kw: Any) -> LLMStructurer:
    opts: dict[str, Any] = {"backoff": 0.01, "max_backoff": 0.05, "timeout": 10.0, "max_retries": 3,
                            "concurrency": 3}
    opts.update(kw)
    return LLMStructurer(fake.base_url, "fake-model", **opts)


SECTIONS = [
    "Right lower lobe opacity concerning for pneumonia. No pleural effusion or pneumothorax.",
    "The heart is mildly enlarged. Bibasilar atelectasis. Small left pleural effusion.",
    "The lungs are clear. No focal consolidation.",
    "Pulmonary edema cannot be excluded. The lower lung opacity is pneumonia.",
]


def _items(texts: list[str] = SECTIONS) -> list[tuple[str, Any]]:
    return [(f"r{i}", make_section_choice("findings", t)) for i, t in enumerate(texts)]


def test_llm_matches_rules_and_records_provenance(fake: FakeLLM) -> None:
    llm = _llm(fake)
    done, failed = llm.structure_many(_items())
    assert not failed
    assert [r.report_id for r in done] == ["r0", "r1", "r2", "r3"]
    for (rid, section), rep in zip(_items(), done, strict=True):
        expected = RULES.structure(rid, section).findings
        got = rep.findings
        assert [(f.entity, f.sent_idx, f.assertion, f.lesion, f.location_phrases, f.reported_location, f.hedge)
                for f in got] == [
            (f.entity, f.sent_idx, f.assertion, f.lesion, f.location_phrases, f.reported_location, f.hedge)
            for f in expected]
        assert all(f.source == "llm:fake-model" for f in got)
    # the paper example through the LLM path
    assert any(f.entity == "opacity" and f.lesion == "pneumonia" and f.assertion == "present"
               and f.reported_location == ("right lung base", "left lung base") for f in done[3].findings)
    # wire format: model, messages, decoding, JSON-schema response_format
    body = fake.bodies[0]
    assert body["model"] == "fake-model" and body["temperature"] == 0.0
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["strict"] is True
    assert body["messages"][0]["content"] == load_prompt(STRUCTURE_PROMPT).text
    prov = llm.provenance
    assert prov["prompts"]["structure"]["version"] == STRUCTURE_PROMPT == "structure_v10"
    assert prov["prompts"]["location"]["version"] == LOCATION_PROMPT == "location_v6"
    # structure_v5 asks for the hedge grade: the schema requires it (null allowed), and it comes back
    item = body["response_format"]["json_schema"]["schema"]["properties"]["findings"]["items"]
    assert "hedge" in item["required"] and item["properties"]["hedge"]["enum"] == ["likely", "possible", None]
    assert any(f.hedge == "possible" for rep in done for f in rep.findings)
    assert prov["prompts"]["location"]["sha256"] == load_prompt(LOCATION_PROMPT).sha256
    assert len(prov["prompts"]["structure"]["sha256"]) == 64
    # step 2 only for reports with location phrases: r0, r1, r3 (two calls each) and r2 (one call)
    assert llm.stats["requests"] == fake.requests == 7


def test_prompts_name_the_vocabulary() -> None:
    structure, location = load_prompt(STRUCTURE_PROMPT), load_prompt(LOCATION_PROMPT)
    # the earlier versions stay loadable, so cached runs with them can be reproduced
    assert load_prompt("structure_v2").sha256 != structure.sha256 and load_prompt("location_v1").text
    assert load_prompt("structure_v3").sha256 != structure.sha256
    assert load_prompt("structure_v4").sha256 != structure.sha256 and load_prompt("location_v2").text
    assert load_prompt("structure_v5").sha256 != structure.sha256
    assert load_prompt("structure_v6").sha256 != structure.sha256 and load_prompt("location_v3").text
    assert load_prompt("structure_v7").sha256 != structure.sha256 and load_prompt("location_v4").text
    # the guidance follows the rule structurer's classes (rules versions 8-41)
    for phrase in ("not present on prior", "nipple shadow", "ARDS or multifocal pneumonia", "Whiteout",
                   "left basilar atelectasis and effusion", "right upper and left lower lobes", "blunting",
                   "almost complete resolution of", "with residual opacity", "c/w", "PNA",
                   "no evidence of pleural effusion on the left, small effusion on the right", "minor fissure",
                   "the left costophrenic angle is blunted", "increased heart size",
                   "opacity in the right lower lobe and atelectasis", "most pronounced at the base",
                   "in the right upper lobe and the left lower lobe", "no evidence of worsening edema",
                   "shadowing", "most prominent in the left upper lobe", "Lt basal",
                   "no effusion and mild cardiomegaly", "with air bronchograms, consistent with pneumonia",
                   "the left hemidiaphragm is obscured, likely due to atelectasis",
                   "left basilar opacity with persistent small effusion", "cannot be assessed",
                   "small bilateral effusions are likely present", "basilar opacity on the left",
                   "fluid in a costophrenic angle", "tiny if any left effusion", "trace left effusion possible",
                   "possible pneumonia, moderate cardiomegaly", "GGO", "atx", "infective changes",
                   "has disappeared", "right basilar atelectasis, pneumonia not excluded",
                   "likely cardiogenic, with bilateral effusions", "likely atelectasis, with small bilateral",
                   "base of the right lung", "effusion, if present, is small", "infectious in etiology",
                   "mass-like", "cardiac prominence", "upper normal to mildly enlarged",
                   "the opacity is not consistent with pneumonia"):
        assert phrase in " ".join(structure.text.split()), phrase
    for phrase in ("minor or horizontal fissure -> `right mid zone lung`", "costophrenic or cardiophrenic angle",
                   "a few words after a sided place of the same item takes that side",
                   "where the disease is worst", "Rt / Lt mean right / left", "or for one that obscures it",
                   "middle zone(s) without a side -> both mid zones", "extent word or not",
                   '"base of the right lung" -> `right lung base`', "right upper and both mid zones"):
        assert phrase in " ".join(location.text.split()), phrase
    assert all(f"`{lesion}`" in structure.text for lesion in LESIONS)
    assert all(f"`{label}`" in location.text for label in ILS_LOCATION_LABELS)
    assert "{{" not in structure.text + location.text
    with pytest.raises(ConfigError):
        load_prompt("structure_v999")


def test_a_prominent_heart_lies_at_the_heart_on_the_llm_path(fake: FakeLLM) -> None:
    """A non-target heart-prominence finding gets the heart label, as the rules give it (not both lungs)."""
    items = _items(["The cardiac silhouette is prominent. Left basilar atelectasis."])
    (rep,), failed = _llm(fake).structure_many(items)
    assert not failed
    expected = RULES.structure(*items[0]).findings
    assert [(f.lesion, f.assertion, f.reported_location) for f in rep.findings] == [
        (f.lesion, f.assertion, f.reported_location) for f in expected] == [
        (None, "present", ("heart",)), ("atelectasis", "present", ("left lung base",))]


def test_cache_makes_rerun_request_free(fake: FakeLLM, tmp_path: Path) -> None:
    db = tmp_path / "cache.sqlite"
    first = _llm(fake, cache=db)
    done1, _ = first.structure_many(_items())
    n = fake.requests
    assert n > 0 and first.stats["cache_hits"] == 0
    second = _llm(fake, cache=db)  # a new process would open the same file
    done2, failed2 = second.structure_many(_items())
    assert fake.requests == n, "a rerun must make zero requests"
    assert not failed2 and second.stats["requests"] == 0 and second.stats["cache_hits"] == n
    assert [r.findings for r in done1] == [r.findings for r in done2]
    # a different decoding setting is a different key
    assert cache_key("m", {"temperature": 0}, [{"role": "user", "content": "x"}]) != cache_key(
        "m", {"temperature": 0.7}, [{"role": "user", "content": "x"}])
    with ResponseCache(db) as cache:
        assert len(cache) == n


def test_concurrency_is_bounded(fake: FakeLLM) -> None:
    fake.delay = 0.05
    texts = [f"Small right pleural effusion number {i}." for i in range(12)]
    done, failed = _llm(fake, concurrency=3).structure_many(_items(texts))
    assert len(done) == 12 and not failed
    assert 2 <= fake.max_inflight <= 3


def test_retries_on_429_500_and_timeouts(fake: FakeLLM) -> None:
    fake.faults = ["429", "500", "timeout"]
    llm = _llm(fake, concurrency=1, timeout=0.8)
    rep = llm.structure("r0", make_section_choice("findings", SECTIONS[0]))
    assert llm.stats["retries"] == 3
    assert any(f.lesion == "pneumonia" and f.assertion == "uncertain" for f in rep.findings)


def test_retry_after_is_honoured(fake: FakeLLM) -> None:
    fake.faults = ["429:0.4"]
    llm = _llm(fake, concurrency=1, backoff=0.0, max_backoff=0.0)
    start = time.perf_counter()
    llm.structure("r2", make_section_choice("findings", SECTIONS[2]))
    assert time.perf_counter() - start >= 0.38
    assert llm.stats["retries"] == 1


def test_failure_is_recorded_and_batch_goes_on(fake: FakeLLM) -> None:
    fake.fail_if = lambda body: "pneumothorax" in body["messages"][1]["content"]
    llm = _llm(fake, max_retries=2)
    done, failed = llm.structure_many(_items())
    assert [r.report_id for r in done] == ["r1", "r2", "r3"]
    assert len(failed) == 1
    f = failed[0]
    assert f.path == "r0" and f.stage == "structure" and f.error == "LLMError"
    assert "HTTP 500" in f.reason and "3 attempts" in f.reason
    with pytest.raises(LLMError):
        llm.structure("r0", make_section_choice("findings", SECTIONS[0]))


def test_structure_reports_with_llm_and_no_section(fake: FakeLLM) -> None:
    reports = [parse_report_text("FINDINGS: Small right pleural effusion.\n", "a"),
               parse_report_text("INDICATION: cough\n", "b")]
    done, failed = structure_reports(reports, _llm(fake), progress=False)
    assert [r.report_id for r in done] == ["a"]
    assert done[0].findings[0].reported_location == ("right lung",)
    assert [(f.path, f.reason) for f in failed] == [("b", "no usable section")]


def test_json_schema_fallback_and_text_parsing(fake: FakeLLM) -> None:
    fake.faults = ["400-schema"]
    fake.text_wrap = True
    llm = _llm(fake, concurrency=1)
    rep = llm.structure("r1", make_section_choice("findings", SECTIONS[1]))
    assert llm.json_schema is False and llm.stats["json_schema_fallbacks"] == 1
    assert "response_format" not in fake.bodies[-1]
    assert {f.lesion for f in rep.findings} == {"cardiomegaly", "atelectasis", "effusion"}
    assert extract_json('noise {"a": 1} noise') == {"a": 1}
    with pytest.raises(LLMError):
        extract_json("no json here")


def test_out_of_vocabulary_values_are_rejected_and_recorded() -> None:
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][0]["content"].startswith("# ILS report structuring"):
            return {"findings": [
                {"entity": "opacity", "sent_idx": 1, "assertion": "present", "lesion": "opacity",
                 "location_phrases": ["right apex"]},
                {"entity": "mass", "sent_idx": 1, "assertion": "present", "lesion": "lung mass",
                 "location_phrases": []},
                {"entity": "ghost", "sent_idx": 7, "assertion": "present", "lesion": "edema",
                 "location_phrases": []},
            ]}
        return {"mappings": [{"id": 0, "labels": ["right lung apex", "Right apical zone lung"]}]}

    with FakeLLM(answer) as server:
        llm = _llm(server)
        rep = llm.structure("x", make_section_choice("findings", "Right apical opacity and a mass."))
    assert [(f.entity, f.lesion, f.reported_location) for f in rep.findings] == [
        ("opacity", "opacity", ("right apical zone lung",)),
        ("mass", None, ("right lung", "left lung")),
    ]
    rejected = {(r["field"], r["value"]) for r in llm.rejections}
    assert rejected == {("lesion", "lung mass"), ("sent_idx", 7), ("label", "right lung apex")}


def test_invalid_answer_is_a_failure() -> None:
    with FakeLLM(lambda body: {"unexpected": True}) as server:
        llm = _llm(server)
        done, failed = llm.structure_many(_items(SECTIONS[:1]))
    assert not done and "does not match the schema" in failed[0].reason


def test_api_key_comes_from_the_environment(fake: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="CXRG_TEST_KEY"):
        _llm(fake, api_key_env="CXRG_TEST_KEY")
    monkeypatch.setenv("CXRG_TEST_KEY", "sk-test-123")
    llm = _llm(fake, api_key_env="CXRG_TEST_KEY")
    llm.structure("r2", make_section_choice("findings", SECTIONS[2]))
    assert fake.headers[-1]["Authorization"] == "Bearer sk-test-123"
    assert "sk-test-123" not in json.dumps(llm.provenance)
    assert isinstance(get_structurer("llm", base_url=fake.base_url, model="m"), LLMStructurer)


def _dead_url() -> str:
    """The base URL of a server that was stopped: its port refuses connections."""
    with FakeLLM() as server:
        return server.base_url


def test_a_server_that_cannot_be_reached_stops_the_batch_naming_the_url() -> None:
    url = _dead_url()
    llm = LLMStructurer(url, "m", max_retries=2, backoff=0.01, timeout=0.5, concurrency=2)
    started = time.perf_counter()
    with pytest.raises(BatchStopped, match="the LLM structurer stops: cannot reach") as got:
        llm.structure_many(_items())
    assert f"{url}/chat/completions" in str(got.value) and "connection error" in str(got.value)
    assert "(after 3 attempts)" in str(got.value) and time.perf_counter() - started < 5
    assert llm.stats["requests"] <= 2 * 3  # the first two reports' retries; the others were not sent
    with pytest.raises(BatchStopped, match="cannot reach"):  # the pre-pass of ils build stops too
        LLMStructurer(url, "m", max_retries=0, cache=None).warm_cache(_items())


def test_a_server_that_answered_and_went_away_fails_the_reports_and_the_batch_goes_on() -> None:
    with FakeLLM() as server:
        llm = _llm(server, max_retries=1)
        llm.structure("r2", make_section_choice("findings", SECTIONS[2]))
    done, failed = llm.structure_many(_items(SECTIONS[:2]))  # retried like any transient error, then recorded
    assert not done and [f.reason.startswith("connection error") for f in failed] == [True, True]


def test_cli_llm(fake: FakeLLM, tmp_path: Path) -> None:
    importlib.import_module("cxrground.cli.structure_cmds")  # registers `reports structure`
    from cxrground.cli import main

    report = tmp_path / "r1.txt"
    report.write_text("FINDINGS: Right lower lobe opacity concerning for pneumonia.\n")
    out = tmp_path / "findings.jsonl"
    args = ["reports", "structure", str(report), "--structurer", "llm", "--base-url", fake.base_url,
            "--model", "fake-model", "--cache", str(tmp_path / "c.sqlite"), "--out", str(out), "--no-progress"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["report_id"] == "r1" and rows[0]["lesion"] == "pneumonia"
    assert rows[0]["provenance"]["model"] == "fake-model"
    n = fake.requests
    assert CliRunner().invoke(main, args).exit_code == 0
    assert fake.requests == n


def test_cache_is_per_endpoint_and_retry_defaults_are_shared(tmp_path: Path) -> None:
    db = tmp_path / "cache.sqlite"
    section = make_section_choice("findings", SECTIONS[2])
    with FakeLLM() as a, FakeLLM() as b:
        _llm(a, cache=db).structure("r2", section)
        _llm(b, cache=db).structure("r2", section)  # same model name, another server: not the same model
        _llm(a, cache=db).structure("r2", section)
        assert a.requests == b.requests == 1
        llm = LLMStructurer(a.base_url, "m")
    assert llm.retry == RetryPolicy() and llm.max_retries == RetryPolicy().max_attempts - 1
    assert llm.timeout == RetryPolicy().timeout


def test_a_cache_keyed_without_the_endpoint_follows_a_moved_server(tmp_path: Path) -> None:
    """``cache_endpoint=False``: the answers of one server are reused when the same model is reached elsewhere; the
    option is how answers are fetched, so a build resumes across it."""
    db = tmp_path / "cache.sqlite"
    section = make_section_choice("findings", SECTIONS[2])
    with FakeLLM() as a, FakeLLM() as b:
        first = _llm(a, cache=db, cache_endpoint=False).structure("r2", section)
        again = _llm(b, cache=db, cache_endpoint=False).structure("r2", section)  # the server moved
        assert (a.requests, b.requests) == (1, 0) and again == first
        _llm(b, cache=db).structure("r2", section)  # keyed by the endpoint (the default): asked again
        assert b.requests == 1
    from cxrground.ils.backend_spec import BackendSpec

    base = {"base_url": "http://a/v1", "model": "m"}
    assert (BackendSpec(structurer="llm", structurer_kwargs=base).resume_hash()
            == BackendSpec(structurer="llm", structurer_kwargs={**base, "cache_endpoint": False}).resume_hash())


def test_hedge_grades_outside_the_rules_are_rejected_and_recorded() -> None:
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][0]["content"].startswith("# ILS report structuring"):
            return {"findings": [
                {"entity": "pneumonia", "sent_idx": 1, "assertion": "present", "lesion": "pneumonia",
                 "location_phrases": [], "hedge": "likely"},  # a grade on a present finding
                {"entity": "effusion", "sent_idx": 2, "assertion": "uncertain", "lesion": "effusion",
                 "location_phrases": [], "hedge": "surely"},  # not a grade
                {"entity": "edema", "sent_idx": 3, "assertion": "uncertain", "lesion": "edema",
                 "location_phrases": [], "hedge": "Likely"},
            ]}
        return {"mappings": []}

    with FakeLLM(answer) as server:
        llm = _llm(server)
        section = make_section_choice("findings", "Pneumonia. Possible effusion. Probable edema.")
        assert section is not None
        rep = llm.structure("h", section)
    assert [(f.lesion, f.assertion, f.hedge) for f in rep.findings] == [
        ("pneumonia", "present", None), ("effusion", "uncertain", None), ("edema", "uncertain", "likely")]
    assert [(r["field"], r["value"]) for r in llm.rejections] == [("hedge", "likely"), ("hedge", "surely")]
