"""The client layer under a real API's conditions: a rate limit (429s, adaptive requests in flight), a daily quota
(a Retry-After longer than the policy allows), a redirect, and content sent as a list of parts."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from cxrground.llm import (
    AdaptiveLimit,
    ChatClient,
    EndpointRefused,
    PermanentError,
    Redirected,
    RetryPolicy,
    TransientError,
    WaitTooLong,
    call_with_retries,
    content_text,
    run_sync,
)
from cxrground.llm.limit import GROW_AFTER
from cxrground.llm.watch import RetryNotes

NO_WAIT = RetryPolicy(max_attempts=8, backoff=0.0, max_backoff=0.0, timeout=10.0)


def _client(handler) -> ChatClient:
    return ChatClient("http://llm.test/v1", "m-1", transport=httpx.MockTransport(handler), timeout=10.0)


def _ask(chat: ChatClient):
    return run_sync(chat.complete([{"role": "user", "content": "x"}]))


# -- the places in flight -----------------------------------------------------------------------------------------


def test_a_429_halves_the_places_in_flight_once_per_round_down_to_one_and_successes_grow_them_back():
    async def go() -> AdaptiveLimit:
        limit = AdaptiveLimit(32)
        rounds = [await limit.acquire() for _ in range(32)]
        assert limit.in_flight == 32
        for r in rounds[:5]:  # five requests of one round answered 429: one overload, one cut
            limit.release(r, "limited")
        assert limit.limit == 16 and limit.cuts == 1
        for r in rounds[5:]:
            limit.release(r, "other")  # other errors neither cut nor grow
        assert limit.limit == 16 and limit.in_flight == 0
        later = await limit.acquire()  # sent after the cut: its 429 cuts again
        limit.release(later, "limited")
        assert limit.limit == 8
        for _ in range(5):
            limit.release(await limit.acquire(), "limited")
        assert limit.limit == 1 and limit.cuts == 5 and limit.in_flight == 0  # never below one
        for _ in range(GROW_AFTER - 1):
            limit.release(await limit.acquire(), "ok")
        assert limit.limit == 1
        limit.release(await limit.acquire(), "ok")
        assert limit.limit == 2  # a run of successes: one more
        for _ in range(2000):
            limit.release(await limit.acquire(), "ok")
        assert limit.limit == 32  # back to the concurrency, never above
        return limit

    run_sync(asyncio.wait_for(go(), 10))


def test_requests_wait_for_a_free_place_and_a_rate_limited_batch_keeps_fewer_in_flight():
    """A server that answers 429 whenever more than 3 requests are in flight: with the adaptive limit no request
    spends its attempts, and the 429s stay few; each attempt holds a place only while it is sent."""

    async def batch(limit: AdaptiveLimit | None) -> tuple[int, int, int]:
        in_flight = peak = limited = 0

        async def call() -> str:
            nonlocal in_flight, peak, limited
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                await asyncio.sleep(0)
                if in_flight > 3:
                    limited += 1
                    raise TransientError("HTTP 429: slow down", status=429)
                await asyncio.sleep(0.002)
                return "ok"
            finally:
                in_flight -= 1

        got = await asyncio.gather(*[call_with_retries(call, NO_WAIT, rng=random.Random(k), limit=limit)
                                     for k in range(120)], return_exceptions=True)
        failed = sum(isinstance(g, Exception) for g in got)
        return failed, limited, peak

    limit = AdaptiveLimit(32)
    failed, limited, peak = run_sync(asyncio.wait_for(batch(limit), 20))
    assert failed == 0 and limit.in_flight == 0 and peak == 32
    assert limited < 100 and limit.limit <= 8  # the first rounds' 429s (32 sent at once), then a few per round
    # without it every request keeps sending: most spend their attempts
    failed_without, limited_without, _ = run_sync(asyncio.wait_for(batch(None), 20))
    assert limited_without > 5 * limited and failed_without > 60


def test_a_rate_limit_is_noted_once_per_cut():
    limit = AdaptiveLimit(8)
    notes: list[str] = []
    watch = RetryNotes("percept eval", every=0.0, limit=limit)
    watch.on_note = notes.append
    error = TransientError("HTTP 429", status=429)

    async def cut() -> None:
        limit.release(await limit.acquire(), "limited")

    run_sync(cut())
    watch.retried(error, 1.0, [])
    watch.retried(error, 1.0, [])  # the same limit: not said again
    run_sync(cut())
    watch.retried(error, 1.0, [])
    assert notes == ["percept eval: retrying 1 request (HTTP 429), next in 1.0 s; rate limited: 4 requests in flight",
                     "percept eval: retrying 2 requests (HTTP 429), next in 1.0 s",
                     "percept eval: retrying 3 requests (HTTP 429), next in 1.0 s; rate limited: 2 requests in "
                     "flight"]


# -- a daily quota ----------------------------------------------------------------------------------------------


def test_a_retry_after_above_the_cap_ends_the_request_at_once():
    waits = [86400.0]
    calls = 0

    async def call() -> str:
        nonlocal calls
        calls += 1
        raise TransientError("HTTP 429: quota", retry_after=waits[0], status=429)

    policy = RetryPolicy(max_attempts=6, backoff=0.0, max_backoff=0.0, max_retry_after=300.0)
    with pytest.raises(WaitTooLong) as got:
        run_sync(call_with_retries(call, policy))
    assert calls == 1 and got.value.attempts == 1 and isinstance(got.value, EndpointRefused)
    assert got.value.retry_after == 86400.0 and got.value.cap == 300.0 and got.value.status == 429
    assert got.value.stop_line("--max-retry-after") == (
        "the server asks to wait 86400 s (24 h) before the next request (Retry-After of an HTTP 429: a quota used "
        "up?), longer than --max-retry-after (300 s) allows")


# -- redirects --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "location", "target", "base"), [
    (301, "https://api.example.com/v1/chat/completions", "https://api.example.com/v1/chat/completions",
     "https://api.example.com/v1"),
    (302, "/v2/chat/completions", "http://llm.test/v2/chat/completions", "http://llm.test/v2"),
    (307, "https://llm.test/v1/chat/completions", "https://llm.test/v1/chat/completions", "https://llm.test/v1"),
    (308, "https://gw.example.org/openai/", "https://gw.example.org/openai/", "https://gw.example.org/openai"),
])
def test_a_redirect_is_not_followed_and_names_its_location(status, location, target, base):
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, headers={"Location": location}, json={"error": "moved"})

    with pytest.raises(Redirected) as got:
        _ask(_client(handler))
    assert len(seen) == 1  # not followed
    assert isinstance(got.value, EndpointRefused) and got.value.status == status and got.value.location == target
    reason = got.value.reason
    assert f"answered HTTP {status}, a redirect to {target}" in reason
    assert "a POST is not followed" in reason and f"use --base-url {base} " in reason


def test_a_redirect_without_location_says_so():
    with pytest.raises(Redirected, match=r"HTTP 301 \(a redirect\) without a Location header.*check --base-url"):
        _ask(_client(lambda request: httpx.Response(301, json={})))


# -- content as a list of parts ---------------------------------------------------------------------------------


def test_content_sent_as_a_list_of_parts_is_its_text():
    parts = [{"type": "text", "text": "Answer: "}, {"type": "image_url", "image_url": {"url": "data:,"}},
             {"type": "text", "text": "2"}]
    chat = _client(lambda request: httpx.Response(200, json={"choices": [{"message": {"content": parts}}]}))
    assert _ask(chat).content == "Answer: 2"
    assert content_text([{"type": "image_url", "image_url": {"url": "x"}}]) is None  # no text: an empty reply
    assert content_text([]) is None and content_text(None) is None and content_text("x") == "x"
    assert content_text([{"type": "text", "text": ""}]) == ""
    with pytest.raises(PermanentError, match="part 0 is a text part without a string 'text'"):
        content_text([{"type": "text", "text": 3}])
    with pytest.raises(PermanentError, match="content is not text but int"):
        content_text(7)
