"""The client layer for OpenAI-compatible chat servers, shared by report structuring and the benchmark harness.

- :mod:`.chat`: :class:`ChatClient`, one async chat-completions request over httpx -> :class:`Completion`,
  errors split into :class:`TransientError` (retried) and :class:`PermanentError`, a server's separate reasoning
  kept (:attr:`Completion.raw` re-joins it as a ``<think>`` block), content sent as a list of parts read as its
  text (:func:`content_text`), a redirect not followed (:class:`Redirected`); :func:`parse_extra_body`
  validates user-given request options.
- :mod:`.retry`: :class:`RetryPolicy` (the one set of defaults) and :func:`call_with_retries` (backoff with
  jitter, Retry-After; a ``Retry-After`` above the cap stops the request: :class:`WaitTooLong`), the only retry loop
  of the code base; :mod:`.limit`: :class:`AdaptiveLimit`, the requests a batch keeps in flight, halved by a 429.
- :mod:`.aio`: :func:`run_sync`, :func:`bounded_map` (N workers, input order kept) and :func:`bounded_each`
  (N workers over a lazy stream, nothing kept).
- :mod:`.cache`: :class:`ResponseCache` (SQLite; a file that is not one, :class:`CacheError`) and
  :func:`cache_key` (model identity, decoding settings, sample index, exact messages); :mod:`.fingerprint`:
  :func:`model_fingerprint` of local model folders.

Stage: after ``io``; imports only ``errors`` (and the standard library, httpx).
"""

from __future__ import annotations

from cxrground.llm.aio import bounded_each, bounded_map, run_sync
from cxrground.llm.cache import CacheError, ResponseCache, cache_key
from cxrground.llm.chat import (
    MAX_RESPONSE_BYTES,
    REASONING_FIELDS,
    RESERVED_KEYS,
    ChatClient,
    Completion,
    check_extra_body,
    content_text,
    parse_extra_body,
    parse_usage,
    with_thinking,
)
from cxrground.llm.errors import (
    REDIRECT_STATUSES,
    REFUSING_STATUSES,
    ClientError,
    ConnectFailed,
    EndpointRefused,
    NoAnswer,
    PermanentError,
    Redirected,
    TimedOut,
    TransientError,
    Unreachable,
    WaitTooLong,
)
from cxrground.llm.fingerprint import model_fingerprint
from cxrground.llm.limit import AdaptiveLimit
from cxrground.llm.retry import RETRY_STATUS, RetryPolicy, call_with_retries, is_retry_status, parse_retry_after

__all__ = [
    "MAX_RESPONSE_BYTES",
    "REASONING_FIELDS",
    "REDIRECT_STATUSES",
    "REFUSING_STATUSES",
    "RESERVED_KEYS",
    "RETRY_STATUS",
    "AdaptiveLimit",
    "CacheError",
    "ChatClient",
    "ClientError",
    "Completion",
    "ConnectFailed",
    "EndpointRefused",
    "NoAnswer",
    "PermanentError",
    "Redirected",
    "ResponseCache",
    "RetryPolicy",
    "TimedOut",
    "TransientError",
    "Unreachable",
    "WaitTooLong",
    "bounded_each",
    "bounded_map",
    "cache_key",
    "call_with_retries",
    "check_extra_body",
    "content_text",
    "is_retry_status",
    "model_fingerprint",
    "parse_extra_body",
    "parse_retry_after",
    "parse_usage",
    "run_sync",
    "with_thinking",
]
