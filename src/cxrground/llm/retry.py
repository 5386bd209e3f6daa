"""The one retry policy of the code base: exponential backoff with jitter, at least as long as the server's
``Retry-After``.

:func:`call_with_retries` awaits a request until it succeeds, retrying :class:`~.errors.TransientError` up to
``max_attempts`` attempts in all. Retry ``k`` (0-based) waits the backoff step, a uniform draw between half and all
of ``min(max_backoff, backoff * 2**k)`` seconds, or the server's ``Retry-After`` when that is longer: a ``Retry-
After`` never shortens the backoff. A ``Retry-After`` above ``max_retry_after`` (a daily quota: 86400 s) is not waited
for: the request ends at once with a :class:`~.errors.WaitTooLong` (an :class:`~.errors.EndpointRefused`: every other
request would wait alike, so a batch stops); one that is 0, negative, not a number or an HTTP date in the past counts
as absent. :class:`~.errors.PermanentError` and every other exception pass through at once. With a ``limit``
(:class:`~.limit.AdaptiveLimit`) each attempt waits for a place in flight first and reports how it went (a 429 halves
the places). ``timeout`` is the deadline of one attempt: connecting, sending and reading the whole answer together
(applied by the chat client).
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from cxrground.errors import ConfigError
from cxrground.llm.errors import ClientError, ConnectFailed, TransientError, Unreachable, WaitTooLong
from cxrground.llm.limit import AdaptiveLimit

__all__ = ["RETRY_STATUS", "RetryPolicy", "call_with_retries", "is_retry_status", "parse_retry_after"]

T = TypeVar("T")

#: HTTP statuses that are retried (every other 5xx too, see :func:`is_retry_status`).
RETRY_STATUS: Final[frozenset[int]] = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


def is_retry_status(status: int) -> bool:
    """True for the statuses worth retrying: :data:`RETRY_STATUS` and any 5xx."""
    return status in RETRY_STATUS or status >= 500


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds or an HTTP date; 0 for a negative number or a date in
    the past); None when absent, unreadable or not a finite number."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts, backoff and per-attempt timeout of every request to a chat server (one set of defaults)."""

    max_attempts: int = 6
    backoff: float = 1.0
    max_backoff: float = 60.0
    max_retry_after: float = 300.0
    timeout: float = 600.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")
        for name in ("backoff", "max_backoff", "max_retry_after"):
            value = getattr(self, name)
            if not value >= 0:  # NaN too
                raise ConfigError(f"{name} must be >= 0 seconds, got {value}")
        if not self.timeout > 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {self.timeout}")

    def delay(self, retry: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry ``retry`` (0-based): the backoff step with jitter, or the server's
        ``Retry-After`` when that is longer (never more than ``max_retry_after``: :func:`call_with_retries` stops a
        request whose ``Retry-After`` is longer); a ``Retry-After`` that is not a positive number is ignored."""
        full = min(self.max_backoff, self.backoff * 2.0**retry)
        step = rng.uniform(full / 2, full)
        if retry_after is None or not retry_after > 0:  # 0, negative, NaN: no lower bound
            return step
        return max(step, min(retry_after, self.max_retry_after))


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    rng: random.Random | None = None,
    on_retry: Callable[[TransientError, float], None] | None = None,
    limit: AdaptiveLimit | None = None,
) -> tuple[T, int]:
    """``(result, attempts)`` of ``call()``; after ``max_attempts`` transient failures a :class:`ClientError`
    (:class:`Unreachable` when the last one was a :class:`ConnectFailed`: the server was not reached).

    The final error's reason ends with ``(after N attempts)`` (``1 attempt``), and its ``last`` is the last attempt's
    error. Every :class:`ClientError` raised carries the attempts made in ``attempts``. ``on_retry(error, delay)``
    runs before each wait. A transient error whose ``Retry-After`` is above ``max_retry_after`` raises a
    :class:`WaitTooLong` at once. ``limit``: each attempt waits for a place in flight (module docstring).
    """
    rng = rng or random.Random()
    attempt = 0
    while True:
        attempt += 1
        round_sent = await limit.acquire() if limit is not None else 0
        outcome = "other"
        try:
            result = await call()
            outcome = "ok"
            return result, attempt
        except TransientError as exc:
            outcome = "limited" if exc.status == 429 else "other"
            if exc.retry_after is not None and exc.retry_after > policy.max_retry_after:
                stop = WaitTooLong(exc.reason, exc.retry_after, policy.max_retry_after, status=exc.status)
                stop.attempts = attempt
                raise stop from None
            if attempt >= policy.max_attempts:
                final = Unreachable if isinstance(exc, ConnectFailed) else ClientError
                tries = f"{attempt} attempt" + ("" if attempt == 1 else "s")
                spent = final(f"{exc.reason} (after {tries})", status=exc.status, last=exc)
                spent.attempts = attempt
                raise spent from None
            wait = policy.delay(attempt - 1, exc.retry_after, rng)
            retried = exc  # ``exc`` is unbound after the except clause
        except ClientError as exc:  # not retried: a PermanentError
            exc.attempts = attempt
            raise
        finally:
            if limit is not None:
                limit.release(round_sent, outcome)
        if on_retry is not None:
            on_retry(retried, wait)
        await asyncio.sleep(wait)
