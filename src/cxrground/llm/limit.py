"""How many requests a batch keeps in flight against a rate-limited server: :class:`AdaptiveLimit` (AIMD).

A batch starts with ``most`` requests allowed in flight (its ``concurrency``). An HTTP 429 halves the number allowed,
down to 1; the 429s of requests sent before that cut answer the same overload and do not cut again (at most one
halving per round of requests). After a run of successes as long as the number allowed (one round without a 429), and
at least :data:`GROW_AFTER` (8), it grows back by one, up to ``most``. A request waits for a free place before each
attempt and gives it back when the attempt is over, so a request that waits between two attempts holds none. Shared by
``percept eval`` and the LLM report structurer through :func:`~.retry.call_with_retries`.
"""

from __future__ import annotations

import asyncio
from typing import Final

from cxrground.errors import ConfigError

__all__ = ["GROW_AFTER", "AdaptiveLimit"]

#: The fewest successes in a row that grow the places in flight by one (at a low limit a round is one or two
#: requests: too few to tell that the rate limit has eased).
GROW_AFTER: Final[int] = 8


class AdaptiveLimit:
    """Requests allowed in flight at once: ``most`` at first, halved by a 429, grown back by one per round of
    successes (at least :data:`GROW_AFTER`; module docstring). Usable from one event loop at a time (a later loop
    may use it again)."""

    def __init__(self, most: int) -> None:
        if most < 1:
            raise ConfigError(f"concurrency must be >= 1, got {most}")
        self.most = int(most)
        #: Requests allowed in flight now.
        self.limit = self.most
        #: Requests in flight now.
        self.in_flight = 0
        #: How often a 429 cut the limit.
        self.cuts = 0
        self._round = 0  # bumped by each cut: a 429 of an earlier round does not cut again
        self._successes = 0
        self._waiters: list[asyncio.Future[None]] = []

    async def acquire(self) -> int:
        """Wait for a free place; returns the round the request is sent in (give it back to :meth:`release`)."""
        while self.in_flight >= self.limit:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: pass the place on
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self.in_flight += 1
        return self._round

    def release(self, round_sent: int, outcome: str) -> None:
        """An attempt sent in ``round_sent`` is over: ``outcome`` ``limited`` (HTTP 429), ``ok`` (an answer) or
        ``other`` (any other error: neither cuts nor grows)."""
        self.in_flight = max(0, self.in_flight - 1)
        if outcome == "limited":
            self._successes = 0
            if round_sent == self._round and self.limit > 1:
                self.limit = max(1, self.limit // 2)
                self.cuts += 1
            self._round += round_sent == self._round
        elif outcome == "ok" and self.limit < self.most:
            self._successes += 1
            if self._successes >= max(self.limit, GROW_AFTER):
                self.limit += 1
                self._successes = 0
        self._wake()

    def _wake(self) -> None:
        """Wake as many waiters as there are free places."""
        free = self.limit - self.in_flight
        for waiter in list(self._waiters):
            if free <= 0:
                break
            if not waiter.done():
                try:
                    waiter.set_result(None)
                except RuntimeError:  # its event loop is closed: a stale waiter
                    continue
                free -= 1
