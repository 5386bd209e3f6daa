"""An async client for the chat-completions endpoint of any OpenAI-compatible server (vLLM, SGLang, OpenAI, ...).

One request per :meth:`ChatClient.complete` (no retries here: see :mod:`.retry`). The API key is read from the
environment variable named by ``api_key_env`` (never passed as a literal); without it no ``Authorization``
header is sent (local servers). Connections are pooled per event loop (at most ``concurrency``) and closed
by :meth:`ChatClient.aclose`; ``transport`` replaces the network (tests).

Outcomes: HTTP 200 -> :class:`Completion` (the message text, None when the server sent ``null``; content sent as a
list of parts, ``[{"type": "text", "text": ...}]``, is the text of its text parts, other parts left out, None when it
has none: :func:`content_text`; the reasoning
text a server split off the answer, see below; token usage; the server's model version; the ``finish_reason``).
Timeouts, connection errors, the statuses of :func:`~.retry.is_retry_status` and a 200 whose body is not a chat
completion (truncated, not JSON, no choices; the reason says which) raise :class:`~.errors.TransientError` (with the
parsed ``Retry-After``; no HTTP answer at all, a :class:`~.errors.NoAnswer`: :class:`~.errors.TimedOut` past the
deadline, :class:`~.errors.ConnectFailed` when no connection could be opened); other statuses, content that is not
text and an answer longer than ``max_response_bytes`` (8 MiB by default; the body is read in chunks and the read
stops there) raise :class:`~.errors.PermanentError`. A redirect (301 / 302 / 303 / 307 / 308) is not followed: a
:class:`~.errors.Redirected` names the ``Location`` and the base URL to give instead (:func:`redirect_error`).
Both carry the HTTP status. ``timeout`` is the deadline of the
whole request: connecting, sending and reading the whole answer (a server that sends a byte now and then cannot hold
a request longer). :attr:`ChatClient.answered` tells whether the server has answered any request yet.

Reasoning: servers that separate a thinking model's reasoning from its answer (``vllm serve --reasoning-parser``,
DeepSeek-style APIs) return it next to ``content`` as ``reasoning_content`` (older vLLM, DeepSeek) or ``reasoning``
(newer vLLM, OpenRouter). :class:`Completion` keeps it in ``reasoning``; :attr:`Completion.raw` puts it back as
the model emitted it, ``<think>{reasoning}</think>{content}`` (the raw response of CHEXPERCEPT.md §13.2).
``content`` stays the answer alone, for callers that parse it (report structuring).

Request options beyond the decoding settings (``reasoning_effort``, ``max_completion_tokens``,
``chat_template_kwargs``, ...) travel in ``params`` too; :func:`parse_extra_body` / :func:`check_extra_body`
validate a user-given extra body: a JSON object that does not set :data:`RESERVED_KEYS` (``model`` and
``messages`` belong to the client, and ``stream`` would break response parsing).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urljoin, urlsplit

import httpx

from cxrground.errors import ConfigError
from cxrground.llm.errors import (
    REDIRECT_STATUSES,
    REFUSING_STATUSES,
    ConnectFailed,
    EndpointRefused,
    NoAnswer,
    PermanentError,
    Redirected,
    TimedOut,
    TransientError,
)
from cxrground.llm.retry import RetryPolicy, is_retry_status, parse_retry_after

__all__ = ["MAX_RESPONSE_BYTES", "REASONING_FIELDS", "RESERVED_KEYS", "ChatClient", "Completion", "check_extra_body",
           "content_text", "parse_extra_body", "parse_usage", "redirect_error", "with_thinking"]

#: Request keys an extra body may not set.
RESERVED_KEYS: Final[tuple[str, ...]] = ("model", "messages", "stream")
#: The default cap of one response's size (8 MiB; a structured answer is a few KiB).
MAX_RESPONSE_BYTES: Final[int] = 8 << 20
#: Message fields that hold the reasoning a server split off the answer, in the order they are read.
REASONING_FIELDS: Final[tuple[str, ...]] = ("reasoning_content", "reasoning")


def with_thinking(content: str | None, reasoning: str | None) -> str | None:
    """The raw response of a thinking model whose reasoning a server split off: ``<think>{reasoning}</think>``
    followed by ``content`` (``content`` alone when there is no reasoning; None when there is neither)."""
    if not reasoning:
        return content
    return f"<think>{reasoning}</think>{content or ''}"


@dataclass(frozen=True)
class Completion:
    """One response: the assistant text (None when the server sent none), token usage, model version, the
    reasoning the server returned apart from the text (None when it sent none) and the choice's ``finish_reason``."""

    content: str | None
    usage: dict[str, int] = field(default_factory=dict)
    model_version: str | None = None
    reasoning: str | None = None
    #: Why the model stopped (``stop``; ``length``: cut at ``max_tokens``), None when the server did not say.
    finish_reason: str | None = None
    #: How many tool calls the message held (a server's tool parser turned the answer into calls: no text).
    tool_calls: int = 0

    @property
    def raw(self) -> str | None:
        """The response as the model emitted it: the reasoning as a ``<think>`` block, then the text."""
        return with_thinking(self.content, self.reasoning)


def parse_usage(usage: Any) -> dict[str, int]:
    """``prompt_tokens``, ``completion_tokens`` and ``cached_tokens`` (when reported) of a response's usage."""
    if not isinstance(usage, dict):
        return {}
    out = {k: int(usage[k]) for k in ("prompt_tokens", "completion_tokens") if isinstance(usage.get(k), int)}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        out["cached_tokens"] = int(details["cached_tokens"])
    return out


def check_extra_body(extra: Any, what: str = "extra body") -> dict[str, Any]:
    """A JSON-ready copy of ``extra``; raises :class:`ConfigError` unless it is an object of JSON values that
    does not set :data:`RESERVED_KEYS`."""
    if not isinstance(extra, Mapping):
        raise ConfigError(f"{what} must be a JSON object {{...}}, got {type(extra).__name__}")
    try:
        copy = json.loads(json.dumps(dict(extra), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what} holds a value that is not JSON ({exc})") from None
    bad = [k for k in RESERVED_KEYS if k in copy]
    if bad:
        raise ConfigError(f"{what} may not set {', '.join(map(repr, bad))} (the client sets "
                          f"{', '.join(RESERVED_KEYS[:2])}; streaming is not supported)")
    return copy


def parse_extra_body(text: str, what: str = "--extra-body") -> dict[str, Any]:
    """The extra body given as JSON text (see :func:`check_extra_body`)."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise ConfigError(f"{what} is not valid JSON ({exc})") from None
    return check_extra_body(value, what)


def _too_long(cap: int, seen: str) -> str:
    return (f"response over the cap of {cap} bytes ({cap / (1 << 20):g} MiB; {seen}): not a chat completion this "
            "client reads (max_response_bytes)")


def _parse_completion(raw: bytes) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(the response object, its first choice, None), or what is wrong with ``raw`` as a chat completion."""
    try:
        data = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError: "...: line 1 column 15 (char 14)"; UnicodeDecodeError
        return {}, {}, f"not JSON ({exc})"
    if not isinstance(data, dict):
        return {}, {}, f"a JSON {type(data).__name__}, not an object"
    choices = data.get("choices")
    if not isinstance(choices, list):
        return data, {}, "no 'choices' list"
    if not choices:
        return data, {}, "'choices' is empty (the server returned no answer)"
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        return data, {}, "choices[0] has no 'message' object"
    return data, choice, None


def content_text(content: Any) -> str | None:
    """The text of a message's ``content``: a string as it is; a list of parts (``[{"type": "text", "text": ...},
    ...]``, as some servers answer) as its text parts joined, other parts (images, audio, ...) left out, None when it
    has no text part; None for None. Raises :class:`PermanentError` for anything else, or a text part without a
    string ``text``."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise PermanentError(f"chat-completion content is not text but {type(content).__name__}", status=200)
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            continue  # an image, audio or other part: not the answer text
        text = part.get("text")
        if not isinstance(text, str):
            raise PermanentError(f"chat-completion content part {k} is a text part without a string 'text'",
                                 status=200)
        texts.append(text)
    return "".join(texts) if texts else None


def redirect_error(url: str, status: int, location: str | None) -> Redirected:
    """The error of a POST to ``url`` answered with redirect ``status`` to ``location`` (the ``Location`` header):
    not followed, and the base URL to use instead named."""
    why = ("a POST is not followed to another address: clients resend a 301/302/303 as a GET without its body, and "
           "following would send the request and its API key to an address you did not give")
    if not location:
        return Redirected(f"{url} answered HTTP {status} (a redirect) without a Location header; {why}: check "
                          "--base-url", None, status)
    target = urljoin(url, location)
    base = target.split("?", 1)[0].rstrip("/")
    suffix = "/chat/completions"
    base = base[: -len(suffix)] if base.endswith(suffix) else base
    return Redirected(f"{url} answered HTTP {status}, a redirect to {target}; {why}: use --base-url {base} if that "
                      "is the server you mean", target, status)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


class ChatClient:
    """Chat completions of ``model`` at ``{base_url}/chat/completions``."""

    kind = "openai"

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = None,
                 timeout: float = RetryPolicy.timeout, concurrency: int = 8,
                 transport: httpx.AsyncBaseTransport | None = None,
                 max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        if not base_url:
            raise ConfigError("a chat client needs a base URL (the API root, e.g. http://host:8000/v1)")
        parsed = urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"base URL {base_url!r} is not an http:// or https:// URL with a host (the API root, "
                              "e.g. http://host:8000/v1)")
        if not model:
            raise ConfigError("a chat client needs a model name")
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout}")
        if max_response_bytes < 1:
            raise ConfigError(f"max_response_bytes must be >= 1, got {max_response_bytes}")
        self.headers = {"Content-Type": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ConfigError(f"environment variable {api_key_env!r} (the API key) is not set")
            self.headers["Authorization"] = f"Bearer {key}"
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout = float(timeout)
        self.concurrency = int(concurrency)
        #: The most bytes of one answer read; a longer one is a :class:`PermanentError`.
        self.max_response_bytes = int(max_response_bytes)
        self._transport = transport
        self._http: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Whether the server has answered a request (with any HTTP status) since this client was made.
        self.answered = False

    @property
    def identity(self) -> dict[str, Any]:
        """The model's identity in cache keys: kind, model name and endpoint."""
        return {"kind": self.kind, "model": self.model, "base_url": self.base_url}

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:  # a pool belongs to one event loop
            limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
            self._http = httpx.AsyncClient(headers=self.headers, timeout=httpx.Timeout(self.timeout), limits=limits,
                                           transport=self._transport)
            self._loop = loop
        return self._http

    async def complete(self, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any] | None = None,
                       ) -> Completion:
        """POST ``{"model", "messages", **params}`` once; raises :class:`TransientError` / :class:`PermanentError`
        (and :class:`ConfigError` when ``params`` sets one of :data:`RESERVED_KEYS`).

        :attr:`timeout` is the deadline of the whole request (connect, send, the whole answer): past it, a
        :class:`~.errors.TimedOut`. An answer longer than :attr:`max_response_bytes` is a :class:`PermanentError`.
        """
        params = dict(params or {})
        if any(k in params for k in RESERVED_KEYS):
            check_extra_body(params, "request parameters")
        body = {"model": self.model, "messages": list(messages), **params}
        try:
            status, headers, raw = await asyncio.wait_for(self._post(body), self.timeout)
        except TimeoutError:
            raise TimedOut(f"timed out after {self.timeout:g} s") from None
        text = raw.decode("utf-8", errors="replace")
        if status != 200:
            reason = f"HTTP {status}: {text[:200]}"
            if is_retry_status(status):
                raise TransientError(reason, parse_retry_after(headers.get("retry-after")), status)
            if status in REDIRECT_STATUSES:
                raise redirect_error(f"{self.base_url}/chat/completions", status, headers.get("location"))
            if status in REFUSING_STATUSES:
                raise EndpointRefused(f"{self.base_url}/chat/completions refused the request ({reason}); check the "
                                      "API key, the base URL and the model name", status=status)
            raise PermanentError(reason, status=status)
        data, choice, problem = _parse_completion(raw)
        if problem is not None:  # cut short by a proxy, a glitch: retried
            raise TransientError(f"malformed chat-completion response: {problem}: {text[:200]}", status=status)
        message = choice["message"]
        content = content_text(message.get("content"))
        reasoning = next((r for r in (message.get(k) for k in REASONING_FIELDS) if isinstance(r, str) and r), None)
        finish = choice.get("finish_reason")
        calls = message.get("tool_calls")
        return Completion(content, parse_usage(data.get("usage")), data.get("model"), reasoning,
                          finish if isinstance(finish, str) else None, len(calls) if isinstance(calls, list) else 0)

    async def _post(self, body: dict[str, Any]) -> tuple[int, httpx.Headers, bytes]:
        """Status, headers and body of one POST, read in chunks up to :attr:`max_response_bytes`."""
        cap = self.max_response_bytes
        try:
            async with self._client().stream("POST", f"{self.base_url}/chat/completions", json=body) as response:
                self.answered = True
                size = response.headers.get("content-length", "")
                if size.isdigit() and int(size) > cap:
                    raise PermanentError(_too_long(cap, f"Content-Length {int(size)}"), status=response.status_code)
                chunks: list[bytes] = []
                got = 0
                async for chunk in response.aiter_bytes():
                    got += len(chunk)
                    if got > cap:
                        raise PermanentError(_too_long(cap, "the answer went on"), status=response.status_code)
                    chunks.append(chunk)
                return response.status_code, response.headers, b"".join(chunks)
        except httpx.ConnectTimeout:
            raise ConnectFailed(f"no connection within {self.timeout:g} s") from None
        except httpx.TimeoutException:
            raise TimedOut(f"timed out after {self.timeout:g} s") from None
        except httpx.ConnectError as exc:
            raise ConnectFailed(f"connection error: {type(exc).__name__}: {exc}") from None
        except httpx.TransportError as exc:
            raise NoAnswer(f"connection error: {type(exc).__name__}: {exc}") from None

    async def aclose(self) -> None:
        """Close the connections of the current event loop's pool."""
        http, self._http, self._loop = self._http, None, None
        if http is not None:
            await http.aclose()
