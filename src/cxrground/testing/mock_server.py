"""A test server speaking the OpenAI chat-completions wire format over real sockets (127.0.0.1).

Used by the tests and by ``bench/percept_eval.py``. A :class:`ThreadingHTTPServer` on an ephemeral port (or
``port``) serves ``POST /v1/chat/completions``; every request sleeps ``latency`` seconds and is answered by a
*policy* (``body -> content``, None for a ``null`` content; or a dict, the whole message with an optional
``finish_reason``, e.g. ``{"content": "The answer", "finish_reason": "length"}``). Faults are injected from a script
(``faults``: consumed one per request: ``"429"``, ``"429:SECONDS"`` (Retry-After), ``"500"``, ``"401"`` (a
refused key),
``"timeout"`` (sleeps ``timeout_sleep`` before answering), ``"400-schema"`` (400 when the body has a
``response_format``), ``"301"`` / ``"302"`` / ``"303"`` / ``"307"`` / ``"308"`` (a redirect to ``redirect_to``, a
``Location`` header; ``"307-"``: a redirect without one), ``"ok"``) and/or at random with seeded
``fault_rates`` (e.g. ``{"429": 0.05, "500": 0.05, "timeout": 0.02}``). ``rate_limit=(rate, burst)`` answers as a
rate-limited API does: a token bucket of ``burst`` tokens refilled at ``rate`` per second, one token per request,
HTTP 429 (no ``Retry-After``) when it is empty. ``statuses`` counts the statuses answered. The request loop is
bounded: after
``max_requests`` requests every request gets 503. ``requests`` counts every request received,
``completed`` the 200 answers; ``bodies`` keeps the received JSON bodies when ``keep_bodies`` is set;
``fail_if(body)`` true → 500; ``max_inflight`` is the most requests seen sleeping at once.

Policies: :func:`fixed_policy` (a constant text), :func:`hash_policy` (a deterministic pseudo-random valid
option number per request, derived from the request's messages and its ``seed`` when it has one),
:class:`OraclePolicy` (the ground truth of a benchmark, identified by the first image of the conversation and
the current question text).

Test and dry-run helper, not for production (:mod:`cxrground.testing`).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cxrground.evaluation.percept.conversation import format_gt, image_data_url, plan_case
from cxrground.percept.schema import Benchmark
from cxrground.vocab.percept_templates import IMPLICIT_ANSWER

__all__ = ["MockServer", "OraclePolicy", "Policy", "fixed_policy", "hash_policy"]

Policy = Callable[[dict[str, Any]], str | dict[str, Any] | None]
_OPTION_LINE = re.compile(r"^\((\d+)\) ", re.M)


def _last_user(body: dict[str, Any]) -> tuple[str, list[str]]:
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return content, []
    text = "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return text, [p["image_url"]["url"] for p in content if p.get("type") == "image_url"]


def _first_image(body: dict[str, Any]) -> str:
    for m in body["messages"]:
        if isinstance(m.get("content"), list):
            for p in m["content"]:
                if p.get("type") == "image_url":
                    return str(p["image_url"]["url"])
    return ""


def fixed_policy(text: str | None) -> Policy:
    """Always answer ``text``."""
    return lambda body: text


def hash_policy(seed: int = 0) -> Policy:
    """``Answer: k`` with ``k`` a valid option number drawn from the SHA-256 of the messages (deterministic).

    A request that carries a ``seed`` (sampling) mixes it in, like a seeded sampling server.
    """

    def answer(body: dict[str, Any]) -> str:
        text, _ = _last_user(body)
        n = max(1, len(_OPTION_LINE.findall(text)))
        sampled = f"|{body['seed']}" if "seed" in body else ""
        digest = hashlib.sha256(f"{seed}{sampled}|{json.dumps(body['messages'], sort_keys=True)}".encode()).digest()
        return IMPLICIT_ANSWER.format(gt=1 + int.from_bytes(digest[:4], "big") % n)

    return answer


class OraclePolicy:
    """Answers with the ground truth of ``bench`` (keyed by the conversation's first image + question text)."""

    def __init__(self, bench: Benchmark) -> None:
        assert bench.root is not None
        self.answers: dict[tuple[str, str], str] = {}
        for key, case in bench.cases.items():
            plan = plan_case(key, case)
            cxr = hashlib.sha256(image_data_url(bench.root / plan.questions[0].images[0]).encode()).hexdigest()
            for q in plan.questions:
                self.answers[(cxr, q.text)] = IMPLICIT_ANSWER.format(gt=format_gt(q.gt))

    def __call__(self, body: dict[str, Any]) -> str | None:
        text, _ = _last_user(body)
        cxr = hashlib.sha256(_first_image(body).encode()).hexdigest()
        for (c, question), answer in self.answers.items():
            if c == cxr and text.endswith(question):
                return answer
        return None


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # the default backlog of 5 drops connects under load (1 s SYN retries)
    daemon_threads = True


class MockServer:
    """The server; use as a context manager (starts a thread, stops and joins it on exit)."""

    def __init__(self, policy: Policy | None = None, *, latency: float = 0.0, faults: list[str] | None = None,
                 fault_rates: dict[str, float] | None = None, seed: int = 0, timeout_sleep: float = 1.0,
                 max_requests: int = 10_000, keep_bodies: bool = False, model_version: str = "mock-1",
                 port: int = 0, rate_limit: tuple[float, float] | None = None,
                 redirect_to: str = "https://api.example.com/v1/chat/completions") -> None:
        self.policy = policy or fixed_policy("Answer: 1")
        self.latency = float(latency)
        self.faults = list(faults or [])
        self.fault_rates = dict(fault_rates or {})
        self.timeout_sleep = float(timeout_sleep)
        self.max_requests = int(max_requests)
        self.keep_bodies = keep_bodies
        self.model_version = model_version
        self.requests = 0
        self.completed = 0
        self.bodies: list[dict[str, Any]] = []
        self.fail_if: Callable[[dict[str, Any]], bool] | None = None
        self.inflight = 0
        self.max_inflight = 0
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self._rng = random.Random(seed)
        self.rate_limit = rate_limit
        self._tokens = float(rate_limit[1]) if rate_limit else 0.0
        self._refilled = time.monotonic()
        self.redirect_to = redirect_to
        self.statuses: Counter[int] = Counter()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, payload, headers = server.handle(self.path, raw, dict(self.headers))
                with server.lock:
                    server.statuses[status] += 1
                self._send(status, payload, headers)

        self.server = _Server(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def _fault(self) -> str:
        if self.faults:
            return self.faults.pop(0)
        draw = self._rng.random()
        for name, rate in sorted(self.fault_rates.items()):
            if draw < rate:
                return name
            draw -= rate
        return "ok"

    def _take_token(self) -> bool:
        """Whether the token bucket of ``rate_limit`` lets this request through (call under the lock)."""
        if self.rate_limit is None:
            return True
        rate, burst = self.rate_limit
        now = time.monotonic()
        self._tokens = min(float(burst), self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def handle(self, path: str, raw: bytes, headers: dict[str, str]) -> tuple[int, Any, dict[str, str] | None]:
        """Status, JSON payload and headers of one request."""
        with self.lock:
            self.requests += 1
            over = self.requests > self.max_requests
            fault = self._fault()
            self.headers.append(headers)
            allowed = self._take_token()
        if over:
            return 503, {"error": "request budget of the mock server exhausted"}, None
        if fault[:3] in ("301", "302", "303", "307", "308"):
            return int(fault[:3]), {"error": "moved"}, None if fault.endswith("-") else {"Location": self.redirect_to}
        if not allowed:
            return 429, {"error": {"message": "Rate limit reached for requests", "type": "requests"}}, None
        if path != "/v1/chat/completions":
            return 404, {"error": "not found"}, None
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            return 400, {"error": "body is not JSON"}, None
        if self.keep_bodies:
            with self.lock:
                self.bodies.append(body)
        if fault.startswith("429"):
            return 429, {"error": "rate limited"}, {"Retry-After": fault[4:] or "0"}
        if fault == "401":
            return 401, {"error": "invalid API key"}, None
        if fault == "500" or (self.fail_if is not None and self.fail_if(body)):
            return 500, {"error": "boom"}, None
        with self.lock:
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        time.sleep(self.timeout_sleep if fault == "timeout" else self.latency)
        with self.lock:
            self.inflight -= 1
        if fault == "400-schema" and "response_format" in body:
            return 400, {"error": "response_format json_schema is not supported"}, None
        content = self.policy(body)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        finish = "stop"
        if isinstance(content, dict):  # a whole message: {"content", "finish_reason", "tool_calls", ...}
            message = {"role": "assistant", **content}
            finish = message.pop("finish_reason", "stop")
            content = message.get("content")
        with self.lock:
            self.completed += 1
        n_in = len(raw) // 4
        return 200, {
            "id": "chatcmpl-mock", "object": "chat.completion", "model": self.model_version,
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": {"prompt_tokens": n_in, "completion_tokens": len(content or "") // 4 + 1,
                      "total_tokens": n_in + len(content or "") // 4 + 1},
        }, None

    def __enter__(self) -> MockServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
