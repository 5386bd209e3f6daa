"""``percept eval`` request options of OpenAI-compatible servers (``--extra-body``) and price tables (``--prices``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ConfigError, InputError
from cxrground.evaluation.percept.clients import make_client
from cxrground.evaluation.percept.clients.openai import EXPLICIT_SAMPLING
from cxrground.evaluation.percept.prices import PRICES, Price, cost_usd, load_prices, price_of, price_table
from cxrground.evaluation.percept.runner import EvalSettings, run_eval
from cxrground.llm import ChatClient, parse_extra_body
from cxrground.testing.mock_bench import make_benchmark
from cxrground.testing.mock_server import MockServer, hash_policy

THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
REASONING = {"reasoning_effort": "medium", "max_completion_tokens": 8192, "max_tokens": None}


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return make_benchmark(tmp_path_factory.mktemp("bench"), {"LF": 1, "RF": 1, "RR": 1}, lesions=("edema",), seed=2)


def _eval(bench: Path, out: Path, server: MockServer, *extra: str):
    return CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "openai:mock-vlm",
                                     "--base-url", server.base_url, "--out", str(out), "--no-progress", *extra])


def _config(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())["config"]


def test_extra_body_reaches_every_request_and_the_cache_key_and_config(bench, tmp_path):
    with MockServer(hash_policy(0), keep_bodies=True) as server:
        res = _eval(bench, tmp_path / "plain", server)
        assert res.exit_code == 0, res.output
        n_turns = server.requests
        assert all("chat_template_kwargs" not in b for b in server.bodies)
        assert "extra_body" not in _config(tmp_path / "plain")  # runs without it keep their configuration hash

        res = _eval(bench, tmp_path / "nothink", server, "--extra-body", json.dumps(THINKING_OFF))
        assert res.exit_code == 0, res.output
        new = server.bodies[n_turns:]
        assert len(new) == n_turns  # another extra body is another cache key: every request is sent again
        assert all(b["chat_template_kwargs"] == {"enable_thinking": False} and b["max_tokens"] == 8192 for b in new)
        cfg = _config(tmp_path / "nothink")
        assert cfg["extra_body"] == THINKING_OFF and cfg["client"]["decoding"]["chat_template_kwargs"] == \
            {"enable_thinking": False}

        res = _eval(bench, tmp_path / "nothink-again", server, "--extra-body", json.dumps(THINKING_OFF))
        assert res.exit_code == 0 and server.requests == 2 * n_turns  # same extra body: all from the cache
        assert "0 requests sent" in res.output

        res = _eval(bench, tmp_path / "reasoning", server, "--extra-body", json.dumps(REASONING))
        assert res.exit_code == 0, res.output
        new = server.bodies[2 * n_turns:]
        assert len(new) == n_turns
        assert all(b["reasoning_effort"] == "medium" and b["max_completion_tokens"] == 8192 and "max_tokens" not in b
                   and b["model"] == "mock-vlm" and b["messages"] for b in new)
        assert "max_tokens" not in _config(tmp_path / "reasoning")["client"]["decoding"]

        # resuming a run with another extra body is refused like any other configuration change
        res = _eval(bench, tmp_path / "nothink", server, "--extra-body", '{"chat_template_kwargs": {}}')
        assert res.exit_code == 1 and "different configuration" in res.output and "extra_body" in res.output


@pytest.mark.parametrize(("text", "needle"), [
    ("{not json", "--extra-body is not valid JSON"),
    ('["reasoning_effort"]', "must be a JSON object"),
    ('"medium"', "must be a JSON object"),
    ('{"max_completion_tokens": NaN}', "NaN is not a JSON number"),
    ('{"model": "other"}', "may not set 'model'"),
    ('{"messages": []}', "may not set 'messages'"),
    ('{"stream": true}', "may not set 'stream'"),
    ('{"temperature": 1.0}', "use --temperature"),
    ('{"top_p": 0.9}', "use --top-p"),
    ('{"seed": 3}', "use --seed"),
    ('{"max_tokens": 100}', "use --max-tokens"),
])
def test_bad_extra_body_is_refused_before_any_request(bench, tmp_path, text, needle):
    with MockServer(hash_policy(0)) as server:
        res = _eval(bench, tmp_path / "run", server, "--extra-body", text)
        assert server.requests == 0
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert needle in res.output


def test_extra_body_only_for_openai_clients(bench, tmp_path):
    res = CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "random", "--out",
                                    str(tmp_path / "run"), "--no-progress", "--extra-body", "{}"])
    assert res.exit_code == 0, res.output  # an empty object changes nothing
    res = CliRunner().invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "random", "--out",
                                    str(tmp_path / "run2"), "--no-progress", "--extra-body", json.dumps(THINKING_OFF)])
    assert res.exit_code == 1 and "OpenAI-compatible servers only" in res.output
    with pytest.raises(ConfigError, match="OpenAI-compatible servers only"):
        run_eval(EvalSettings(bench, "first-option", extra_body=THINKING_OFF), tmp_path / "run3", progress=False)
    ready = make_client("openai:m", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match="give the extra body to the client"):
        run_eval(EvalSettings(bench, "openai:m", extra_body=THINKING_OFF), tmp_path / "run4", progress=False,
                 client=ready)


def test_sampling_seed_is_sent_next_to_the_extra_body():
    client = make_client("openai:m", base_url="http://llm.test/v1", temperature=0.7,
                         extra_body={"reasoning_effort": "low"}, transport=httpx.MockTransport(_echo))
    # the explicit sampling parameters are sent by default (--sampling-params explicit)
    assert client.decoding == {"temperature": 0.7, "max_tokens": 8192, **EXPLICIT_SAMPLING, "reasoning_effort": "low"}
    completion = asyncio.run(client.complete([{"role": "user", "content": "hi"}], seed=11))
    body = json.loads(completion.content)
    assert body["seed"] == 11 and body["reasoning_effort"] == "low" and body["temperature"] == 0.7


def _echo(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"choices": [{"message": {"content": request.content.decode()}}], "model": "m"})


def test_chat_client_refuses_reserved_keys_in_params():
    chat = ChatClient("http://llm.test/v1", "m", transport=httpx.MockTransport(_echo))
    with pytest.raises(ConfigError, match="may not set 'model'"):
        asyncio.run(chat.complete([{"role": "user", "content": "x"}], {"model": "other"}))
    body = json.loads(asyncio.run(chat.complete([{"role": "user", "content": "x"}], {"top_k": 5})).content)
    assert body["model"] == "m" and body["top_k"] == 5
    assert parse_extra_body('{"a": {"b": [1, null]}}') == {"a": {"b": [1, None]}}


# -- prices -----------------------------------------------------------------------------------------------------


def test_load_prices_csv_and_json(tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text("model,input,cached_input,output\nMock-VLM,1.5,0.5,6\ngpt-5.4,3,,20\n")
    table = load_prices(csv)
    assert table == {"mock-vlm": Price(1.5, 0.5, 6.0), "gpt-5.4": Price(3.0, 3.0, 20.0)}  # empty cached -> input
    as_object = tmp_path / "p.json"
    as_object.write_text(json.dumps({"Mock-VLM": {"input": 1.5, "cached_input": 0.5, "output": 6},
                                     "gpt-5.4": {"input": 3, "output": 20}}))
    as_list = tmp_path / "l.json"
    as_list.write_text(json.dumps([{"model": "mock-vlm", "input": 1.5, "cached_input": 0.5, "output": 6},
                                   {"model": "gpt-5.4", "input": "3", "output": 20}]))
    assert load_prices(as_object) == load_prices(as_list) == table
    merged = price_table(csv)
    assert merged["gpt-5.4"] == Price(3.0, 3.0, 20.0) and merged["gpt-5.4-nano"] == PRICES["gpt-5.4-nano"]
    assert price_table() == PRICES
    usage = {"prompt_tokens": 1_000_000, "cached_tokens": 400_000, "completion_tokens": 100_000}
    assert cost_usd(Price(2, 0.5, 10), usage) == pytest.approx(0.6 * 2 + 0.4 * 0.5 + 0.1 * 10)
    assert price_of("org/MOCK-vlm", merged) == Price(1.5, 0.5, 6.0) and price_of("mock-vlm") is None


@pytest.mark.parametrize(("name", "text", "needle"), [
    ("a.csv", "name,input,output\nm,1,2\n", "header"),
    ("a.csv", "model,input,output\nm,-1,2\n", "row 2 (m) input must be a finite number >= 0"),
    ("a.csv", "model,input,output\nm,1,2\nx,abc,2\n", "row 3 (x) input must be a number"),
    ("a.csv", "model,input,output\nm,1,\n", "row 2 (m): no output price"),
    ("a.csv", "model,input,output\nm,1,2\nM,1,2\n", "listed twice"),
    ("a.csv", "model,input,output,currency\nm,1,2,EUR\n", "unknown field(s) currency"),
    ("a.csv", "model,input,output\n", "lists no model"),
    ("a.json", "{oops", "not valid JSON"),
    ("a.json", '{"m": 2.0}', "must be an object"),
    ("a.json", '{"m": {"input": 1, "output": Infinity}}', "finite number"),
    ("a.json", '[{"input": 1, "output": 2}]', "item 0: no model name"),
    ("a.json", '{"m": {"input": true, "output": 2}}', "must be a number"),
    ("a.json", '"gpt"', "must be an object"),
])
def test_bad_price_files_name_the_file_and_the_row(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_prices(path)
    assert needle in str(info.value) and str(path) in str(info.value)
    with pytest.raises(InputError, match="not found"):
        load_prices(tmp_path / "missing.csv")


def test_prices_file_gives_the_cost_in_usage_json(bench, tmp_path):
    prices = tmp_path / "prices.csv"
    prices.write_text("model,input,cached_input,output\nmock-vlm,2,0.5,10\n")
    with MockServer(hash_policy(0)) as server:
        res = _eval(bench, tmp_path / "run", server, "--prices", str(prices))
        assert res.exit_code == 0, res.output
        usage = json.loads((tmp_path / "run" / "usage.json").read_text())
        assert usage["prices_file"] == str(prices)
        assert usage["price_usd_per_mtok"] == {"input": 2.0, "cached_input": 0.5, "output": 10.0}
        tokens = usage["tokens"]
        expected = ((tokens["prompt_tokens"] - tokens["cached_tokens"]) * 2 + tokens["cached_tokens"] * 0.5
                    + tokens["completion_tokens"] * 10) / 1e6
        assert tokens["prompt_tokens"] > 0 and expected > 0
        assert usage["cost_usd"] == pytest.approx(expected, abs=1e-6)
        assert usage["cost_usd"] == pytest.approx(cost_usd(Price(2, 0.5, 10), tokens), abs=1e-6)
        # a rerun without the file (all from the cache) falls back to the built-in table, which lacks mock-vlm
        res = _eval(bench, tmp_path / "run", server)
        assert res.exit_code == 0, res.output
        usage = json.loads((tmp_path / "run" / "usage.json").read_text())
        assert usage["cost_usd"] is None and usage["prices_file"] is None
        # a bad file fails before anything runs
        bad = tmp_path / "bad.csv"
        bad.write_text("model,input,output\nmock-vlm,x,1\n")
        before = server.requests
        res = _eval(bench, tmp_path / "run-bad", server, "--prices", str(bad))
        assert res.exit_code == 1 and "row 2 (mock-vlm) input must be a number" in res.output
        assert server.requests == before and not (tmp_path / "run-bad").exists()


def test_a_rerun_prints_what_it_sent_not_the_folder_totals(bench, tmp_path):
    with MockServer(hash_policy(0)) as server:
        first = _eval(bench, tmp_path / "run", server)
        assert first.exit_code == 0, first.output
        sent = server.requests
        assert f"{sent} requests sent, 0 cache hits ->" in first.output
        again = _eval(bench, tmp_path / "run", server)
        assert again.exit_code == 0 and server.requests == sent, again.output
        assert "0 requests sent, 0 cache hits (this folder in all: " in again.output, again.output
        assert f"{sent} sent" in again.output


def test_eval_help_says_what_the_oracle_settings_and_the_limit_do():
    """--oracle explicit keeps the model's answer and prepends the §13.3 text (it does not also replace the answer);
    --limit's hash selection is not balanced across paths."""
    from click.testing import CliRunner

    from cxrground.cli import main

    res = CliRunner().invoke(main, ["percept", "eval", "--help"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "also say so" not in text and "§14" not in text and "every path mixed" not in text
    assert "keep the model's answer and prepend the ground-truth text to the next question (explicit)" in text
    assert "CHEXPERCEPT.md §13.3" in text
    assert "not balanced across paths" in text and "--per-path-limit takes N of each path" in text


def test_no_cache_endpoint_flag_reuses_the_cache_at_another_url(bench, tmp_path):
    cache = str(tmp_path / "c.sqlite")
    with MockServer(hash_policy(0)) as server:
        res = _eval(bench, tmp_path / "a", server, "--cache", cache, "--no-cache-endpoint")
        assert res.exit_code == 0, res.output
    with MockServer(hash_policy(0)) as moved:
        res = _eval(bench, tmp_path / "b", moved, "--cache", cache, "--no-cache-endpoint")
        assert res.exit_code == 0 and moved.requests == 0 and "0 requests sent" in res.output, res.output
        res = _eval(bench, tmp_path / "c", moved, "--cache", cache, "--cache-endpoint")
        assert res.exit_code == 0 and moved.requests > 0, res.output
    assert "--no-cache-endpoint" in CliRunner().invoke(main, ["percept", "eval", "--help"]).output
