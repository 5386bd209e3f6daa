"""The LLM structurer when things go wrong: a damaged cache, a server that stops answering, inline reasoning, an
answer cut at max_tokens, identical requests in flight, loose options; and the run summary of the CLI."""

from __future__ import annotations

import importlib
import json
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from cxrground.errors import BatchStopped, ConfigError
from cxrground.llm import CacheError
from cxrground.reports import make_section_choice
from cxrground.reports.structure import STRUCTURERS, LLMError, LLMStructurer, get_structurer
from cxrground.reports.structure.llm import extract_json, strip_reasoning
from test_structure_llm import SECTIONS, FakeLLM, _items, _llm

CLEAR = [f"The lungs are clear {i}." for i in range(12)]  # one request per report (no location step)


# -- 1. a damaged cache -----------------------------------------------------------------------------------------


def test_a_cached_row_that_does_not_read_is_a_miss_asked_again_and_overwritten(tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite"
    with FakeLLM() as fake:
        first, _ = _llm(fake, cache=db).structure_many(_items(SECTIONS[:3]))
        sent = fake.requests
        with sqlite3.connect(db) as conn:
            keys = [k for (k,) in conn.execute("SELECT key FROM responses ORDER BY key LIMIT 2")]
            conn.execute("UPDATE responses SET response = '{not json' WHERE key = ?", (keys[0],))
            conn.execute("UPDATE responses SET response = '{\"results\": []}' WHERE key = ?", (keys[1],))
        llm = _llm(fake, cache=db)
        again, failed = llm.structure_many(_items(SECTIONS[:3]))
        assert not failed and again == first
        assert fake.requests == sent + 2 and llm.stats["cache_corrupt"] == 2
        assert "2 unreadable cache rows asked again" in llm.stats_summary()
        third = _llm(fake, cache=db)
        third.structure_many(_items(SECTIONS[:3]))  # overwritten: all answered from the cache now
        assert fake.requests == sent + 2 and third.stats["cache_hits"] == sent


def test_a_cache_file_that_is_not_a_cache_stops_before_any_request(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"\x17not a database" * 400)
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE responses (key TEXT, answer TEXT)")
    with FakeLLM() as fake:
        for path in (bad, foreign):
            with pytest.raises(CacheError, match=f"--cache {path}: not a readable SQLite response cache"):
                _llm(fake, cache=path)
        importlib.import_module("cxrground.cli.structure_cmds")
        from cxrground.cli import main

        report = tmp_path / "r.txt"
        report.write_text("FINDINGS: The lungs are clear.\n")
        result = CliRunner().invoke(main, ["reports", "structure", str(report), "--structurer", "llm", "--base-url",
                                           fake.base_url, "--model", "m", "--cache", str(bad), "--no-progress"])
        assert result.exit_code != 0 and result.exc_info is not None and result.exc_info[0] is SystemExit
        assert f"--cache {bad}: not a readable SQLite response cache (file is not a database)" in result.output
        assert fake.requests == 0


def test_an_unexpected_error_in_one_report_is_that_reports_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeLLM() as fake:
        llm = _llm(fake)
        real = llm._structure

        async def buggy(report_id: str, section: Any) -> Any:
            if report_id == "r1":
                raise KeyError("a bug")
            return await real(report_id, section)

        monkeypatch.setattr(llm, "_structure", buggy)
        done, failed = llm.structure_many(_items())
    assert [d.report_id for d in done] == ["r0", "r2", "r3"]
    assert [(f.path, f.error) for f in failed] == [("r1", "KeyError")]
    assert "unexpected error structuring report 'r1': KeyError" in failed[0].reason


# -- 3. a server that dies or hangs -------------------------------------------------------------------------------


def test_a_server_that_answered_then_died_stops_the_batch_after_a_run_of_reports() -> None:
    with FakeLLM() as fake:
        llm = _llm(fake, max_retries=0, concurrency=1)
        llm.structure("a", make_section_choice("findings", "The lungs are clear."))
    assert llm.stop_after == 8 and _llm(fake, concurrency=6).stop_after == 12
    started = time.perf_counter()
    with pytest.raises(BatchStopped) as got:
        llm.structure_many(_items(CLEAR))
    message = str(got.value)
    assert "8 reports in a row got no answer from" in message and "the server has stopped answering" in message
    assert "0 of 12 reports were answered before the stop" in message
    assert llm.stats["requests"] == 1 + 8 and time.perf_counter() - started < 5


def test_a_server_that_never_answers_stops_like_one_that_refuses_connections() -> None:
    with FakeLLM() as fake:
        fake.delay = 2.0
        llm = _llm(fake, max_retries=1, timeout=0.8, concurrency=1)
        with pytest.raises(BatchStopped, match=r"stops: got no answer from .*timed out after 0\.8 s \(after 2 "
                                               r"attempts\).*--timeout"):
            llm.structure_many(_items(CLEAR))
        assert llm.stats["requests"] == 2


def test_timeouts_after_answers_count_and_any_answer_resets_the_run() -> None:
    with FakeLLM() as fake:
        llm = _llm(fake, max_retries=0, timeout=0.8, concurrency=1)
        fake.faults = ["ok", *["timeout", "ok"] * 5]  # every other report times out: never 8 in a row
        done, failed = llm.structure_many(_items(CLEAR[:11]))
        assert len(done) == 6 and len(failed) == 5
        assert all(f.reason == "timed out after 0.8 s (after 1 attempt)" for f in failed)
        fake.faults = ["timeout"] * 8
        with pytest.raises(BatchStopped, match="8 reports in a row got no answer"):
            llm.structure_many(_items([f"Small effusion {i}." for i in range(10)]))


# -- 5. inline reasoning ------------------------------------------------------------------------------------------


def test_inline_reasoning_is_stripped_and_the_last_object_that_parses_is_taken() -> None:
    answer = {"findings": []}
    think = '<think>The schema wants {findings: [...]}; {"draft": 1} then fix it.</think>\n' + json.dumps(answer)
    assert extract_json(think) == answer
    assert extract_json("<think>unclosed, with {braces: yes}\n" + json.dumps(answer)) == answer
    assert extract_json('the template opened it {x}</think> {"findings": []}') == answer
    assert extract_json('First try {"a": 1}, corrected: {"b": 2} done') == {"b": 2}
    assert extract_json('{"outer": {"inner": 1}} trailing') == {"outer": {"inner": 1}}
    assert strip_reasoning("<THINK>x</THINK> y") == "y"
    with pytest.raises(LLMError, match="not valid JSON"):
        extract_json("<think>{a: 1}</think> {broken")

    class Thinking(FakeLLM):
        def _content(self, body: dict[str, Any]) -> str:
            return "<think>The schema wants {findings: [...]}.</think>\n" + super()._content(body)

    with Thinking() as fake:
        done, failed = _llm(fake).structure_many(_items(SECTIONS[1:2]))
    assert not failed and {f.lesion for f in done[0].findings} == {"cardiomegaly", "atelectasis", "effusion"}


# -- 8, 9. what a failure says --------------------------------------------------------------------------------------


def _transport(content: str | None, finish: str = "stop") -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(200, json={
        "choices": [{"finish_reason": finish, "message": {"role": "assistant", "content": content}}]}))


def test_an_answer_cut_at_max_tokens_says_so() -> None:
    section = make_section_choice("findings", "The lungs are clear.")
    cut = LLMStructurer("http://llm.test/v1", "m", max_tokens=64, max_retries=0,
                        transport=_transport('{"findings": [{"entity": "lu', "length"))
    with pytest.raises(LLMError, match=r"structure answer cut at max_tokens=64 \(finish_reason=length\); raise it "
                                       r"with --max-tokens$"):
        cut.structure("r", section)
    empty = LLMStructurer("http://llm.test/v1", "m", max_tokens=64, max_retries=0, transport=_transport(None, "length"))
    with pytest.raises(LLMError, match=r"no text content .*cut at max_tokens=64"):
        empty.structure("r", section)


def test_a_schema_failure_names_the_field() -> None:
    with FakeLLM(lambda body: {"findings": [{"entity": "x", "sent_idx": "one", "assertion": "present"}]}) as fake:
        _, failed = _llm(fake, max_retries=0).structure_many(_items(SECTIONS[:1]))
    assert failed[0].reason == ("structure answer does not match the schema: findings.0.sent_idx: Input should be a "
                                "valid integer, unable to parse string as an integer")


# -- 7. a stop says what was done -----------------------------------------------------------------------------------


def test_a_stop_says_how_many_reports_were_answered_and_how_to_resume(tmp_path: Path) -> None:
    with FakeLLM() as fake:
        fake.faults = ["ok", "ok", "401"]
        with pytest.raises(BatchStopped) as memory:
            _llm(fake, concurrency=1).structure_many(_items(CLEAR[:5]))
        assert "HTTP 401" in str(memory.value)
        assert ("2 of 5 reports were answered before the stop and kept in memory only: give a response cache file "
                "(--cache FILE) so that a rerun resumes") in str(memory.value)
        fake.faults = ["ok", "401"]
        db = tmp_path / "c.sqlite"
        with pytest.raises(BatchStopped) as kept:
            _llm(fake, concurrency=1, cache=db).structure_many(_items(CLEAR[5:10]))
        assert f"1 of 5 reports were answered before the stop; their answers are in the response cache {db}, so a " \
               "rerun with it resumes" in str(kept.value)


# -- 12. single flight ------------------------------------------------------------------------------------------------


def test_identical_requests_in_flight_are_sent_once() -> None:
    with FakeLLM() as fake:
        fake.delay = 0.15
        llm = _llm(fake, concurrency=4, timeout=2.0)
        done, failed = llm.structure_many(_items(["The lungs are clear."] * 4 + ["No effusion."]))
        assert not failed and len(done) == 5 and len({tuple(d.findings) for d in done[:4]}) == 1
        assert fake.requests == 2 and llm.stats["shared_in_flight"] == 3
        fake.faults = ["500"]
        llm = _llm(fake, concurrency=3, max_retries=0, timeout=2.0)
        _, failed = llm.structure_many(_items(["Small effusion."] * 3))  # the one request failed: all three fail
        assert [f.reason for f in failed] == ["HTTP 500: {\"error\": \"boom\"} (after 1 attempt)"] * 3
        assert fake.requests == 3


# -- 14. options ----------------------------------------------------------------------------------------------------


def test_test_only_parameters_are_no_options_and_numbers_are_checked() -> None:
    assert "transport" not in STRUCTURERS.options("llm") and "max_tokens" in STRUCTURERS.options("llm")
    with pytest.raises(ConfigError, match="does not accept option 'transport'"):
        get_structurer("llm", base_url="http://llm.test/v1", model="m", transport="x")
    for option, value in (("max_tokens", "-5"), ("max_tokens", "0"), ("temperature", "-1"), ("top_p", "0"),
                          ("top_p", "1.5"), ("timeout", "0"), ("backoff", "-1"), ("max_retry_after", "nan")):
        with pytest.raises(ConfigError, match=rf"option {option} must be"):
            get_structurer("llm", base_url="http://llm.test/v1", model="m", **{option: value})
    ok = get_structurer("llm", base_url="http://llm.test/v1", model="m", max_tokens="16", temperature="0.7",
                        top_p="1")
    assert isinstance(ok, LLMStructurer) and ok.decoding == {"temperature": 0.7, "max_tokens": 16, "top_p": 1.0,
                                                             "seed": 0}


# -- 11. the run summary ----------------------------------------------------------------------------------------------


def test_the_cli_prints_one_summary_line_of_the_llm_run(tmp_path: Path) -> None:
    importlib.import_module("cxrground.cli.structure_cmds")
    from cxrground.cli import main

    report = tmp_path / "r.txt"
    report.write_text("FINDINGS: The lungs are clear.\n")
    with FakeLLM() as fake:
        fake.faults = ["500"]
        for command in ("structure", "label"):
            args = ["reports", command, str(report), "--structurer", "llm", "--base-url", fake.base_url, "--model",
                    "m", "--cache", str(tmp_path / "c.sqlite"), "--out", str(tmp_path / f"o.{command}"),
                    "--no-progress"]
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 0, result.output
            summary = [line for line in result.stderr.splitlines() if line.startswith("LLM structurer:")
                       and " retrying " not in line]
            notes = [line for line in result.stderr.splitlines() if line.startswith("LLM structurer: retrying")]
            if command == "structure":
                assert len(notes) == 1 and re.fullmatch(r"LLM structurer: retrying 1 request \(HTTP 500\), next in "
                                                        r"\d\.\d s", notes[0]), result.stderr
                assert summary == ["LLM structurer: 2 requests, 0 cache hits, 1 retry, 0 schema fallbacks, "
                                   "0 rejections"]
            else:
                assert not notes
                assert summary == ["LLM structurer: 0 requests, 1 cache hit, 0 retries, 0 schema fallbacks, "
                                   "0 rejections"]
        rules = CliRunner().invoke(main, ["reports", "structure", str(report)])
        assert "LLM structurer" not in rules.stderr


# -- 9. failure records: the step, the HTTP status, the attempts, the report; paths named as the readers name them --


def test_failure_records_name_the_step_the_http_status_and_the_attempts() -> None:
    with FakeLLM() as fake:
        llm = _llm(fake, max_retries=2, concurrency=1)
        location = llm.prompts["location"].text
        fake.fail_if = lambda body: body["messages"][0]["content"] == location  # every location request: 500
        done, failed = llm.structure_many(_items([SECTIONS[0], SECTIONS[2]]))
        assert [d.report_id for d in done] == ["r1"]  # r1 has no location phrase: no location step
        assert failed[0].to_dict() == {"path": "r0", "stage": "structure", "error": "LLMError", "report": "r0",
                                       "step": "location", "http_status": 500, "attempts": 3,
                                       "reason": 'HTTP 500: {"error": "boom"} (after 3 attempts)'}
        fake.fail_if = None
        fake.faults = ["400-schema", "500"]  # the JSON-schema fallback's request counts too
        llm = _llm(fake, max_retries=0, timeout=0.8)
        _, failed = llm.structure_many(_items(["Small effusion."]))
        assert (failed[0].step, failed[0].http_status, failed[0].attempts) == ("structure", 500, 2)
        fake.faults = ["timeout"]  # no HTTP answer: no status
        _, failed = llm.structure_many(_items(["Tiny effusion."]))
        assert (failed[0].step, failed[0].http_status, failed[0].attempts) == ("structure", None, 1)
        assert "http_status" not in failed[0].to_dict()
    with FakeLLM(lambda body: {"findings": [{"entity": "x", "sent_idx": "one", "assertion": "present"}]}) as fake:
        _, failed = _llm(fake).structure_many(_items(SECTIONS[:1]))  # an answer of status 200 that is wrong
    assert (failed[0].step, failed[0].http_status, failed[0].attempts) == ("structure", None, 1)


def test_report_failures_name_files_alike_with_the_report_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    importlib.import_module("cxrground.cli.structure_cmds")
    from cxrground.cli import main
    from test_reports_iu import SMALL_XML

    monkeypatch.chdir(tmp_path)
    rows = [{"study_id": "a", "report": "FINDINGS: The lungs are clear."}, {"study_id": "b"},
            {"study_id": "c", "report": "FINDINGS: Small left effusion, boom."}]
    Path("tab.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    Path("iu.xml").write_text(SMALL_XML.replace("Right lower lobe opacity", "Boom: right lower lobe opacity"))
    with FakeLLM() as fake:
        fake.fail_if = lambda body: "boom" in body["messages"][1]["content"].lower()
        result = CliRunner().invoke(main, ["reports", "label", "tab.jsonl", "iu.xml", "--structurer", "llm",
                                           "--base-url", fake.base_url, "--model", "m", "--max-retries", "1",
                                           "--structurer-opt", "backoff=0.01", "--out", "out.csv", "--no-progress"])
    assert result.exit_code == 0, result.output
    got = [json.loads(line) for line in Path("out.csv.failures.jsonl").read_text().splitlines()]
    table = str(tmp_path / "tab.jsonl")
    assert got == [
        {"path": f"{table}:2", "stage": "reports", "reason": "missing text column 'report'", "error": "ReportError",
         "report": "b"},
        {"path": f"{table}:3", "stage": "structure", "reason": 'HTTP 500: {"error": "boom"} (after 2 attempts)',
         "error": "LLMError", "report": "c", "step": "structure", "http_status": 500, "attempts": 2},
        {"path": str(tmp_path / "iu.xml"), "stage": "structure", "reason": 'HTTP 500: {"error": "boom"} (after 2 '
         "attempts)", "error": "LLMError", "report": "CXR9001", "step": "structure", "http_status": 500,
         "attempts": 2}]
    assert f"first: {table}:2: missing text column" in result.stderr


def test_retries_are_noted_at_most_once_per_interval_with_their_causes() -> None:
    with FakeLLM() as fake:
        fake.faults = ["500", "500", "429", "timeout", "500"]
        llm = _llm(fake, max_retries=5, concurrency=2, timeout=0.8)
        notes: list[str] = []
        llm.on_note = notes.append
        done, failed = llm.structure_many(_items(["Small effusion.", "No effusion."]))
        assert not failed and len(done) == 2 and llm.stats["retries"] == 5
        assert len(notes) == 1, notes  # within 10 s: one note
        assert re.fullmatch(r"LLM structurer: retrying [12] requests? \(HTTP 500\), next in 0\.0 s", notes[0])
        fake.faults = ["500", "429", "timeout", "500"]
        llm = _llm(fake, max_retries=5, concurrency=1, timeout=0.8)
        notes = []
        llm.on_note, llm.note_every = notes.append, 0.0
        llm.structure_many(_items(["Tiny effusion."]))
        assert [n.split("(")[1].split(")")[0] for n in notes] == ["HTTP 500", "HTTP 429", "timed out", "HTTP 500"]
        assert all(n.startswith("LLM structurer: retrying 1 request (") for n in notes)
        llm = _llm(fake, max_retries=5)
        fake.faults = ["500"]
        llm.structure_many(_items(["Trace effusion."]))  # no on_note: silent
        assert llm.stats["retries"] == 1


# -- a real API's conditions: a daily quota, a rate limit, a redirect, content as parts (as percept eval) ----------


def test_a_daily_quota_stops_the_structurer_as_it_stops_percept_eval(tmp_path: Path) -> None:
    with FakeLLM() as fake:
        fake.faults = ["ok", "ok", "429:86400"]
        llm = _llm(fake, concurrency=1, cache=tmp_path / "c.sqlite", max_retry_after=2.0)
        with pytest.raises(BatchStopped) as got:
            llm.structure_many(_items(CLEAR[:4]))
        assert fake.requests == 3  # not retried
        message = str(got.value)
        assert message.startswith("the LLM structurer stops: the server asks to wait 86400 s (24 h) before the next "
                                  "request (Retry-After of an HTTP 429: a quota used up?), longer than "
                                  "--structurer-opt max_retry_after (2 s) allows. 2 of 4 reports were answered")
        assert "a rerun with it resumes" in message
        sent = fake.requests
        done, failed = _llm(fake, concurrency=1, cache=tmp_path / "c.sqlite").structure_many(_items(CLEAR[:4]))
        assert len(done) == 4 and not failed and fake.requests == sent + 2  # the rerun asks only the rest


def test_a_rate_limited_structurer_keeps_fewer_requests_in_flight_and_says_so() -> None:
    with FakeLLM(max_requests=200, rate_limit=(200.0, 2.0), latency=0.02) as fake:
        llm = _llm(fake, concurrency=8, max_retries=20)
        notes: list[str] = []
        llm.on_note = notes.append
        done, failed = llm.structure_many(_items(CLEAR))
        assert len(done) == 12 and not failed and fake.statuses[429] >= 1
        assert notes and notes[0].endswith("; rate limited: 4 requests in flight"), notes


def test_a_redirect_stops_the_structurer_naming_the_location() -> None:
    with FakeLLM() as fake:
        fake.faults = ["301"]
        with pytest.raises(BatchStopped, match=r"the LLM structurer stops: .* answered HTTP 301, a redirect to "
                           r"https://api\.example\.com/v1/chat/completions; a POST is not followed.* use --base-url "
                           r"https://api\.example\.com/v1 if that is the server you mean"):
            _llm(fake, concurrency=1).structure_many(_items(CLEAR[:2]))
        assert fake.requests == 1  # not followed, and the batch stops


def test_content_sent_as_a_list_of_parts_is_read_as_its_text() -> None:
    with FakeLLM() as fake:
        plain = fake.policy

        def parts(body: dict[str, Any]) -> dict[str, Any]:
            text = plain(body)
            return {"content": [{"type": "text", "text": text[:5]}, {"type": "image_url", "image_url": {"url": "x"}},
                                {"type": "text", "text": text[5:]}]}

        fake.policy = parts
        done, failed = _llm(fake).structure_many(_items(SECTIONS[:2]))
        assert not failed and any(f.lesion == "pneumonia" for f in done[0].findings)
        fake.policy = lambda body: {"content": [{"type": "image_url", "image_url": {"url": "x"}}]}
        done, failed = _llm(fake, max_retries=0).structure_many(_items(["Odd effusion."]))
        assert not done and "no text content" in failed[0].reason  # no text part: refused as an empty answer
