"""``openai:MODEL``: any OpenAI-compatible chat-completions server (vLLM, SGLang, OpenAI, Azure, Gemini, serve).

A thin adapter over :class:`cxrground.llm.ChatClient` (async httpx; the API key from the environment variable
named by ``api_key_env``, never from a file or the command line; no ``Authorization`` header without it).
HTTP 429 / 5xx / 408 / 409 / 425, timeouts and connection errors raise :class:`TransientError` (with the
server's ``Retry-After``); other statuses and malformed bodies raise :class:`PermanentError`. A ``null``
message content is returned as None (the runner records it as an unparseable answer). Decoding settings
are sent as given (``temperature``, ``max_tokens``, optional ``top_p``), plus the sample's ``seed`` when
sampling (temperature > 0); ``max_images`` (default 7) is what the server is configured to accept.
Cache identity: kind, model name and base URL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from cxrground.errors import ConfigError
from cxrground.llm import ChatClient, Completion, RetryPolicy

__all__ = ["OpenAIClient"]


class OpenAIClient:
    """Chat completions at ``{base_url}/chat/completions``."""

    kind = "openai"

    def __init__(self, model: str, *, base_url: str | None = None, api_key_env: str | None = None,
                 temperature: float = 0.0, max_tokens: int = 8192, top_p: float | None = None,
                 timeout: float = RetryPolicy.timeout, max_images: int = 7, concurrency: int = 8,
                 transport: httpx.AsyncBaseTransport | None = None, **_: Any) -> None:
        if not base_url:
            raise ConfigError("openai:MODEL needs --base-url (the API root, e.g. http://host:8000/v1)")
        self._chat = ChatClient(base_url, model, api_key_env=api_key_env, timeout=timeout,
                                concurrency=max(1, concurrency), transport=transport)
        self.model = model
        self.base_url = self._chat.base_url
        self.max_images = int(max_images)
        self.decoding: dict[str, Any] = {"temperature": float(temperature), "max_tokens": int(max_tokens)}
        if top_p is not None:
            self.decoding["top_p"] = float(top_p)
        self.timeout = self._chat.timeout

    @property
    def identity(self) -> dict[str, Any]:
        """Kind, model name and base URL."""
        return self._chat.identity

    def cache_context(self, question: Any, case_id: str) -> None:
        """None: the answer depends on the messages only."""
        return None

    async def complete(self, messages: Sequence[dict[str, Any]], question: Any = None, case_id: str = "",
                       seed: int | None = None) -> Completion:
        """POST one request; raises :class:`TransientError` / :class:`PermanentError`."""
        params = dict(self.decoding)
        if seed is not None and self.decoding["temperature"] > 0:
            params["seed"] = int(seed)
        return await self._chat.complete(messages, params)

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._chat.aclose()
