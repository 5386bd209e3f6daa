"""``openai:MODEL``: any OpenAI-compatible chat-completions server (vLLM, SGLang, OpenAI, Azure, Gemini, serve).

A thin adapter over :class:`cxrground.llm.ChatClient` (async httpx; the API key from the environment variable
named by ``api_key_env``, never from a file or the command line; no ``Authorization`` header without it).
HTTP 429 / 5xx / 408 / 409 / 425, timeouts, connection errors and a malformed 200 body raise
:class:`TransientError` (with the server's ``Retry-After``); other statuses raise :class:`PermanentError`.

The answer returned is the **raw** response (CHEXPERCEPT.md §13.2): when the server split a thinking model's
reasoning off the answer (``vllm serve --reasoning-parser``: ``reasoning_content`` / ``reasoning``), it is put
back as ``<think>{reasoning}</think>{content}``, so the history, the results and the cache hold the thinking, and
the parser (§14) removes the ``<think>`` block before it reads the answer: :meth:`OpenAIClient.complete` returns the
chat client's :class:`~cxrground.llm.Completion` (answer, reasoning, ``finish_reason``, tool calls) and the runner
reads :attr:`~cxrground.llm.Completion.raw`. A ``null`` content without reasoning is a raw answer of None (the runner
records it as an empty reply, unparseable). :attr:`OpenAIClient.answered` tells whether the server has answered any
request (the runner's stop rule for a server that never answers).

Decoding settings (``sampling_params``):

- ``explicit`` (default): ``temperature``, ``max_tokens`` and every sampling parameter a vLLM server would
  otherwise take from the model's ``generation_config.json`` (``--generation-config auto``, vLLM's default):
  :data:`EXPLICIT_SAMPLING`, the values of the reference's offline vLLM runs
  (``SamplingParams(temperature=0, top_p=1, max_tokens=8192)`` and ``SamplingParams``' own defaults: no top-k or
  min-p cut, no repetition, presence or frequency penalty). ``top_p`` is ``--top-p`` when given. vLLM and SGLang
  accept these keys; hosted APIs (OpenAI, Azure) refuse ``top_k``, ``min_p`` and ``repetition_penalty``.
- ``minimal``: ``temperature`` and ``max_tokens`` only (+ ``top_p`` when given): the server's or the model's own
  defaults fill the rest. For hosted APIs; also what every run sent before the option existed (same cache keys).

The sample's ``seed`` is added when sampling (temperature > 0); ``max_images`` (default 7) is what the server is
configured to accept. ``extra_body`` (``--extra-body``) is merged into every request, e.g. ``reasoning_effort``,
``max_completion_tokens`` or ``chat_template_kwargs: {enable_thinking: false}``, and overrides a value of
:data:`EXPLICIT_SAMPLING` (``"repetition_penalty": 1.05``); it is part of ``decoding``, hence of the cache key and of
``config.json``. It may not set ``model``, ``messages`` or ``stream``, nor the keys that have their own option
(``temperature``, ``top_p``, ``seed``, ``max_tokens``). A ``null`` value leaves a key the client would send out of
the request: ``"max_tokens": null`` (OpenAI reasoning models accept only ``max_completion_tokens``) or a key of
:data:`EXPLICIT_SAMPLING` (``"top_k": null``). Cache identity: kind, model name and base URL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import httpx

from cxrground.errors import ConfigError
from cxrground.evaluation.percept.clients.decoding import resolve_sampling_params
from cxrground.llm import ChatClient, Completion, RetryPolicy, check_extra_body

__all__ = ["EXPLICIT_SAMPLING", "OWN_OPTIONS", "OpenAIClient", "merge_extra_body"]

#: Request keys set from the harness's own options (``--temperature``, ...) and its per-sample seed.
OWN_OPTIONS: Final[dict[str, str]] = {"temperature": "--temperature", "top_p": "--top-p", "max_tokens": "--max-tokens",
                                      "seed": "--seed (the sample's seed is sent when sampling)"}

#: The sampling parameters sent with ``sampling_params="explicit"``: the reference's vLLM ``SamplingParams``
#: (top_p 1, and its defaults for the rest; ``top_k`` -1 = off, accepted by every vLLM version and by SGLang).
EXPLICIT_SAMPLING: Final[dict[str, float | int]] = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                                                    "presence_penalty": 0.0, "frequency_penalty": 0.0}
#: Keys an extra body may leave out of the request with ``null``.
_DROPPABLE: Final[frozenset[str]] = frozenset({"max_tokens", *EXPLICIT_SAMPLING} - {"top_p"})


def merge_extra_body(decoding: Mapping[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """``decoding`` with the extra body merged in (see the module docstring); raises :class:`ConfigError`."""
    out = dict(decoding)
    if not extra:
        return out
    body = check_extra_body(extra, "--extra-body")
    for key, value in body.items():
        if key in _DROPPABLE and value is None:
            out.pop(key, None)
        elif key in OWN_OPTIONS:
            raise ConfigError(f"--extra-body may not set {key!r}: use {OWN_OPTIONS[key]}"
                              + (' (or "max_tokens": null to leave it out)' if key == "max_tokens" else ""))
        else:
            out[key] = value
    return out


class OpenAIClient:
    """Chat completions at ``{base_url}/chat/completions``."""

    kind = "openai"

    def __init__(self, model: str, *, base_url: str | None = None, api_key_env: str | None = None,
                 temperature: float = 0.0, max_tokens: int = 8192, top_p: float | None = None,
                 timeout: float = RetryPolicy.timeout, max_images: int = 7, concurrency: int = 8,
                 extra_body: Mapping[str, Any] | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 sampling_params: str = "auto", **_: Any) -> None:
        if not base_url:
            raise ConfigError("openai:MODEL needs --base-url (the API root, e.g. http://host:8000/v1)")
        sampling_params = resolve_sampling_params(sampling_params, base_url)
        self._chat = ChatClient(base_url, model, api_key_env=api_key_env, timeout=timeout,
                                concurrency=max(1, concurrency), transport=transport)
        self.model = model
        self.base_url = self._chat.base_url
        self.max_images = int(max_images)
        self.decoding: dict[str, Any] = {"temperature": float(temperature), "max_tokens": int(max_tokens)}
        if sampling_params == "explicit":
            self.decoding.update(EXPLICIT_SAMPLING)
        if top_p is not None:
            self.decoding["top_p"] = float(top_p)
        self.decoding = merge_extra_body(self.decoding, extra_body)
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
        """POST one request; the completion's :attr:`~cxrground.llm.Completion.raw` is the raw response (a reasoning
        the server split off put back as a ``<think>`` block). Raises :class:`TransientError` /
        :class:`PermanentError`."""
        params = dict(self.decoding)
        if seed is not None and self.decoding["temperature"] > 0:
            params["seed"] = int(seed)
        return await self._chat.complete(messages, params)

    @property
    def answered(self) -> bool:
        """Whether the server has answered a request (any HTTP status) since this client was made."""
        return self._chat.answered

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._chat.aclose()
