"""``openai:MODEL``: any OpenAI-compatible chat-completions server (vLLM, SGLang, OpenAI, Azure, Gemini, serve).

Async over ``httpx``. The API key is read from the environment variable named by ``api_key_env`` (never
from a file or the command line); without it no ``Authorization`` header is sent (local servers).
HTTP 429 / 5xx / 408 / 409 / 425, timeouts and connection errors raise :class:`TransientError` (with the
server's ``Retry-After``, seconds or HTTP date, parsed by the structurer's helper); other statuses and
malformed bodies raise :class:`PermanentError`. A ``null`` message content is returned as None (the
runner records it as an unparseable answer). Decoding settings are sent as given (``temperature``,
``max_tokens``, optional ``top_p``); ``max_images`` (default 7) is what the server is configured to accept.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import httpx

from cxrground.errors import ConfigError
from cxrground.evaluation.percept.clients.base import Completion, PermanentError, TransientError
from cxrground.reports.structure.llm import _RETRY_STATUS, _retry_after

__all__ = ["OpenAIClient"]


class OpenAIClient:
    """Chat completions at ``{base_url}/chat/completions``."""

    kind = "openai"
    cacheable = True

    def __init__(self, model: str, *, base_url: str | None = None, api_key_env: str | None = None,
                 temperature: float = 0.0, max_tokens: int = 8192, top_p: float | None = None,
                 timeout: float = 600.0, max_images: int = 7, concurrency: int = 8,
                 transport: httpx.AsyncBaseTransport | None = None, **_: Any) -> None:
        if not base_url:
            raise ConfigError("openai:MODEL needs --base-url (the API root, e.g. http://host:8000/v1)")
        headers = {"Content-Type": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ConfigError(f"environment variable {api_key_env!r} (the API key) is not set")
            headers["Authorization"] = f"Bearer {key}"
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.max_images = int(max_images)
        self.decoding: dict[str, Any] = {"temperature": float(temperature), "max_tokens": int(max_tokens)}
        if top_p is not None:
            self.decoding["top_p"] = float(top_p)
        self.timeout = float(timeout)
        limits = httpx.Limits(max_connections=max(1, concurrency), max_keepalive_connections=max(1, concurrency))
        self._http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(self.timeout), limits=limits,
                                       transport=transport)

    async def complete(self, messages: Sequence[dict[str, Any]], question: Any = None,
                       case_id: str = "") -> Completion:
        """POST one request; raises :class:`TransientError` / :class:`PermanentError`."""
        body = {"model": self.model, "messages": list(messages), **self.decoding}
        try:
            response = await self._http.post(f"{self.base_url}/chat/completions", json=body)
        except httpx.TimeoutException:
            raise TransientError(f"timed out after {self.timeout:g} s") from None
        except httpx.TransportError as exc:
            raise TransientError(f"connection error: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            reason = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code in _RETRY_STATUS or response.status_code >= 500:
                raise TransientError(reason, _retry_after(response.headers.get("retry-after")))
            raise PermanentError(reason)
        try:
            data = response.json()
            message = data["choices"][0]["message"]
            content = message.get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise PermanentError(f"malformed chat-completion response: {response.text[:200]}") from None
        if content is not None and not isinstance(content, str):
            raise PermanentError("chat-completion content is not text")
        return Completion(content, _usage(data.get("usage")), data.get("model"))

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()


def _usage(usage: Any) -> dict[str, int]:
    if not isinstance(usage, dict):
        return {}
    out = {k: int(usage[k]) for k in ("prompt_tokens", "completion_tokens") if isinstance(usage.get(k), int)}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        out["cached_tokens"] = int(details["cached_tokens"])
    return out
