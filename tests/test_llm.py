"""The client layer for OpenAI-compatible servers: retry policy, chat client, bounded map, cache key, fingerprint."""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cxrground.errors import ConfigError
from cxrground.evaluation.percept.clients.hf import HFClient
from cxrground.llm import (
    ChatClient,
    ClientError,
    ConnectFailed,
    EndpointRefused,
    PermanentError,
    ResponseCache,
    RetryPolicy,
    TransientError,
    Unreachable,
    bounded_map,
    cache_key,
    call_with_retries,
    model_fingerprint,
    parse_retry_after,
    run_sync,
)
from cxrground.llm.fingerprint import EDGE, PROBE_SIZE, PROBES, WHOLE_LIMIT

NO_WAIT = RetryPolicy(max_attempts=4, backoff=0.0, max_backoff=0.0)


# -- retry ------------------------------------------------------------------------------------------------------


def test_retry_policy_delays_and_validation():
    policy = RetryPolicy(backoff=1.0, max_backoff=6.0, max_retry_after=30.0)
    rng = random.Random(0)
    for retry, full in ((0, 1.0), (1, 2.0), (2, 4.0), (3, 6.0), (9, 6.0)):
        waits = [policy.delay(retry, None, rng) for _ in range(200)]
        assert full / 2 <= min(waits) and max(waits) <= full and max(waits) - min(waits) > full / 4  # jitter
    assert policy.delay(0, 12.0, rng) == 12.0 and policy.delay(5, 999.0, rng) == 30.0  # Retry-After, capped
    assert RetryPolicy() == RetryPolicy(max_attempts=6, backoff=1.0, max_backoff=60.0, max_retry_after=300.0,
                                        timeout=600.0)
    for bad in ({"max_attempts": 0}, {"backoff": -1.0}, {"timeout": 0.0}):
        with pytest.raises(ConfigError):
            RetryPolicy(**bad)


def test_a_retry_after_never_shortens_the_backoff():
    """Retry-After is a lower bound on the wait, never the whole wait: a short one keeps the growing backoff, one
    that is 0, negative, NaN or in the past is ignored, one above max_retry_after is cut to it."""
    policy = RetryPolicy(backoff=4.0, max_backoff=64.0, max_retry_after=100.0)
    rng = random.Random(0)
    for retry in range(5):
        full = 4.0 * 2**retry
        for ra in (0.0, -5.0, float("nan"), 1.0, None):
            assert full / 2 <= policy.delay(retry, ra, rng) <= full  # the backoff step
        assert policy.delay(retry, 90.0, rng) == 90.0  # a longer Retry-After is waited out
        assert policy.delay(retry, 86400.0, rng) == 100.0  # capped
    date = email.utils.formatdate(time.time() - 60, usegmt=True)
    assert parse_retry_after("nan") is None and parse_retry_after("inf") is None
    assert parse_retry_after("-5") == 0.0 and parse_retry_after(date) == 0.0


def test_parse_retry_after():
    now = time.time()
    assert parse_retry_after("7") == 7.0 and parse_retry_after("0.5") == 0.5 and parse_retry_after("-3") == 0.0
    date = email.utils.formatdate(now + 20, usegmt=True)
    assert 18.0 <= parse_retry_after(date, now=now) <= 21.0
    assert parse_retry_after(None) is None and parse_retry_after("") is None and parse_retry_after("soon") is None


def test_call_with_retries_counts_attempts_and_stops():
    calls: list[int] = []
    retried: list[float] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TransientError("HTTP 503: busy", retry_after=0.0, status=503)
        return "ok"

    assert run_sync(call_with_retries(flaky, NO_WAIT, on_retry=lambda e, w: retried.append(w))) == ("ok", 3)
    assert retried == [0.0, 0.0]

    async def down() -> str:
        raise TransientError("HTTP 500: boom", status=500)

    with pytest.raises(ClientError, match=r"HTTP 500: boom \(after 4 attempts\)") as info:
        run_sync(call_with_retries(down, NO_WAIT))
    assert not isinstance(info.value, TransientError) and info.value.status == 500

    permanent: list[int] = []

    async def refused() -> str:
        permanent.append(1)
        raise PermanentError("HTTP 401: no", status=401)

    with pytest.raises(PermanentError):
        run_sync(call_with_retries(refused, NO_WAIT))
    assert len(permanent) == 1  # never retried


# -- bounded map ------------------------------------------------------------------------------------------------


def test_bounded_map_keeps_order_and_bounds_concurrency():
    inflight = peak = 0
    done: list[int] = []

    async def work(x: int) -> int:
        nonlocal inflight, peak
        inflight += 1
        peak = max(peak, inflight)
        await asyncio.sleep(0.001 * (7 - x % 7))  # later items finish first
        inflight -= 1
        return x * x

    out = run_sync(bounded_map(work, range(20), 3, done.append))
    assert out == [x * x for x in range(20)] and peak == 3 and sorted(done) == out
    assert run_sync(bounded_map(work, [], 4)) == []


def test_bounded_map_first_error_cancels_the_rest():
    started: list[int] = []

    async def work(x: int) -> int:
        started.append(x)
        if x == 2:
            raise ValueError("bad item")
        await asyncio.sleep(0.05)
        return x

    with pytest.raises(ValueError, match="bad item"):
        run_sync(bounded_map(work, range(50), 3))
    assert len(started) < 10


def test_run_sync_inside_a_running_loop():
    async def inner() -> int:
        return 41 + 1

    async def outer() -> int:
        return run_sync(inner())  # a worker thread runs the nested loop

    # a fresh thread: the main thread may already run a loop (the Playwright fixture of an earlier test module)
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(asyncio.run, outer()).result() == 42


# -- chat client ------------------------------------------------------------------------------------------------


def _client(handler, **kw) -> ChatClient:
    return ChatClient("http://llm.test/v1/", "m-1", transport=httpx.MockTransport(handler), timeout=5.0, **kw)


def test_chat_client_parses_completion_and_sends_key(monkeypatch):
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={
            "model": "m-1-2025", "choices": [{"message": {"role": "assistant", "content": "Answer: 2"}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}})

    monkeypatch.setenv("LLM_TEST_KEY", "sk-abc")
    chat = _client(handler, api_key_env="LLM_TEST_KEY")
    msgs = [{"role": "user", "content": "hi"}]
    got = run_sync(chat.complete(msgs, {"temperature": 0.5, "seed": 3}))
    assert got.content == "Answer: 2" and got.model_version == "m-1-2025"
    assert got.usage == {"prompt_tokens": 11, "completion_tokens": 3, "cached_tokens": 8}
    assert str(seen[0].url) == "http://llm.test/v1/chat/completions"
    assert seen[0].headers["authorization"] == "Bearer sk-abc"
    assert json.loads(seen[0].content) == {"model": "m-1", "messages": msgs, "temperature": 0.5, "seed": 3}
    assert chat.identity == {"kind": "openai", "model": "m-1", "base_url": "http://llm.test/v1"}
    monkeypatch.delenv("LLM_TEST_KEY")
    with pytest.raises(ConfigError, match="LLM_TEST_KEY"):
        _client(handler, api_key_env="LLM_TEST_KEY")
    assert "authorization" not in _client(handler).headers and "Authorization" not in _client(handler).headers


@pytest.mark.parametrize(("status", "headers", "body", "error", "retry_after"), [
    (429, {"Retry-After": "2"}, {"error": "slow down"}, TransientError, 2.0),
    (503, {}, {"error": "busy"}, TransientError, None),
    (599, {}, {"error": "odd"}, TransientError, None),
    (408, {}, {}, TransientError, None),
    (400, {}, {"error": "bad"}, PermanentError, None),
    (401, {}, {"error": "key"}, EndpointRefused, None),
    (403, {}, {"error": "forbidden"}, EndpointRefused, None),
    (404, {}, {"error": "no such model"}, EndpointRefused, None),
    (422, {}, {"error": "schema"}, PermanentError, None),
    (200, {}, {"choices": []}, TransientError, None),
    (200, {}, {"choices": [{"message": {"content": 7}}]}, PermanentError, None),
])
def test_chat_client_errors(status, headers, body, error, retry_after):
    chat = _client(lambda request: httpx.Response(status, json=body, headers=headers))
    with pytest.raises(error) as info:
        run_sync(chat.complete([{"role": "user", "content": "x"}]))
    assert type(info.value) is error and info.value.retry_after == retry_after and info.value.status == status


def test_a_base_url_without_scheme_or_host_is_refused_at_once():
    for url in ("not-a-url", "localhost:8000/v1", "ftp://host/v1", "http:///v1"):
        with pytest.raises(ConfigError, match="not an http:// or https:// URL"):
            ChatClient(url, "m")
    assert ChatClient("https://api.example.org/v1/", "m").base_url == "https://api.example.org/v1"


def test_a_malformed_200_is_asked_again():
    answers = [httpx.Response(200, content=b'{"choices": [{"mess'), httpx.Response(200, text="<html>proxy</html>"),
               httpx.Response(200, json={"choices": [{"message": {"content": "Answer: 1"}}]})]
    chat = _client(lambda request: answers.pop(0))
    got, attempts = run_sync(call_with_retries(lambda: chat.complete([{"role": "user", "content": "x"}]), NO_WAIT))
    assert got.content == "Answer: 1" and attempts == 3


def test_chat_client_null_content_timeouts_and_connection_errors():
    chat = _client(lambda request: httpx.Response(200, json={"choices": [{"message": {"content": None}}]}))
    assert run_sync(chat.complete([{"role": "user", "content": "x"}])).content is None

    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(TransientError, match="timed out after 5 s"):
        run_sync(_client(timeout).complete([{"role": "user", "content": "x"}]))
    with pytest.raises(ConnectFailed, match="connection error: ConnectError"):
        run_sync(_client(refused).complete([{"role": "user", "content": "x"}]))
    with pytest.raises(ConfigError):
        ChatClient("", "m")


def test_a_server_never_reached_is_told_from_one_that_answered():
    """A refused connection is a ConnectFailed, retried; spent, it is Unreachable. A connection broken after the
    request was sent is a plain transient error; any HTTP answer marks the client as answered."""

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("All connection attempts failed", request=request)

    def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("reset", request=request)

    chat = _client(refused)
    with pytest.raises(Unreachable, match=r"connection error: ConnectError: .* \(after 4 attempts\)"):
        run_sync(call_with_retries(lambda: chat.complete([{"role": "user", "content": "x"}]), NO_WAIT))
    assert not chat.answered
    chat = _client(broken)
    with pytest.raises(ClientError) as got:
        run_sync(call_with_retries(lambda: chat.complete([{"role": "user", "content": "x"}]), NO_WAIT))
    assert not isinstance(got.value, Unreachable)
    chat = _client(lambda request: httpx.Response(503, text="loading"))
    with pytest.raises(ClientError):
        run_sync(call_with_retries(lambda: chat.complete([{"role": "user", "content": "x"}]), NO_WAIT))
    assert chat.answered


# -- cache ------------------------------------------------------------------------------------------------------


def test_cache_key_covers_identity_decoding_sample_messages_and_context(tmp_path):
    ident = {"kind": "openai", "model": "m", "base_url": "http://a/v1"}
    msgs = [{"role": "user", "content": "x"}]
    dec = {"temperature": 0.7, "max_tokens": 9, "seed": 1}
    base = cache_key(ident, dec, msgs)
    assert base == cache_key(dict(reversed(ident.items())), dict(reversed(dec.items())), [dict(msgs[0])])
    assert base == cache_key(ident, dec, msgs, sample=0)
    variants = [
        cache_key({**ident, "base_url": "http://b/v1"}, dec, msgs),
        cache_key({**ident, "model": "m2"}, dec, msgs),
        cache_key(ident, {**dec, "seed": 2}, msgs),
        cache_key(ident, {**dec, "temperature": 0.0}, msgs),
        cache_key(ident, dec, msgs, sample=1),
        cache_key(ident, dec, [{"role": "user", "content": "y"}]),
        cache_key(ident, dec, msgs, context={"case_id": "c1"}),
    ]
    assert len({base, *variants}) == 1 + len(variants)
    with ResponseCache(tmp_path / "c.sqlite") as cache:
        cache.put(base, "m", {"model": ident}, "answer")
    with ResponseCache(tmp_path / "c.sqlite") as cache:  # persisted
        assert cache.get(base) == "answer" and cache.get(variants[4]) is None and len(cache) == 1


# -- fingerprint ------------------------------------------------------------------------------------------------


def _model_folder(folder: Path, big: int = 0) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llava", "hidden_size": 32}')
    (folder / "tokenizer.json").write_text('{"vocab": {"a": 0}}')
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    if big:
        rng = random.Random(0)
        (folder / "model-00001-of-00001.safetensors").write_bytes(rng.randbytes(big))
    return folder


def _poke(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_fingerprint_sees_weights_config_and_not_the_path(tmp_path):
    folder = _model_folder(tmp_path / "a")
    fp = model_fingerprint(folder)
    assert len(fp) == 64 and model_fingerprint(folder) == fp
    moved = shutil.copytree(folder, tmp_path / "elsewhere" / "b")
    (moved / "README.md").write_text("a model card")
    (moved / ".cache").mkdir()
    (moved / ".cache" / "lock").write_text("x")
    assert model_fingerprint(moved) == fp  # the path, model cards and hidden files do not count
    _poke(moved / "model.safetensors", 5000)  # one weight byte
    assert model_fingerprint(moved) != fp
    other = shutil.copytree(folder, tmp_path / "c")
    (other / "config.json").write_text('{"model_type": "llava", "hidden_size": 33}')
    assert model_fingerprint(other) != fp
    renamed = shutil.copytree(folder, tmp_path / "d")
    (renamed / "model.safetensors").rename(renamed / "weights.safetensors")
    assert model_fingerprint(renamed) != fp


def test_fingerprint_samples_large_shards(tmp_path):
    size = WHOLE_LIMIT + (5 << 20)
    folder = _model_folder(tmp_path / "big", big=size)
    shard = folder / "model-00001-of-00001.safetensors"
    fp = model_fingerprint(folder)
    probe = EDGE + (size - 2 * EDGE - PROBE_SIZE) * 7 // (PROBES - 1)
    for offset in (10, probe + 100, size - 10):  # the header, a probe block, the tail
        copy = shutil.copytree(folder, tmp_path / f"poke{offset}")
        _poke(copy / shard.name, offset)
        assert model_fingerprint(copy) != fp, offset
    grown = shutil.copytree(folder, tmp_path / "grown")
    with (grown / shard.name).open("ab") as fh:
        fh.write(b"\0")
    assert model_fingerprint(grown) != fp


def test_hf_client_identity_is_the_fingerprint(tmp_path):
    folder = _model_folder(tmp_path / "m")
    client = HFClient(str(folder))
    assert client.identity == {"kind": "hf", "fingerprint": model_fingerprint(folder)}
    assert HFClient(str(shutil.copytree(folder, tmp_path / "copy"))).identity == client.identity
