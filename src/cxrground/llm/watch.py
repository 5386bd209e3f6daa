"""What a batch of chat requests watches while it runs: a server that has stopped answering, and retries in progress.

Shared by the LLM report structurer and ``percept eval`` (one rule, one wording):

- :func:`got_no_answer`: whether a request whose retries are spent got no answer from the server (refused, timed
  out, connection reset: a :class:`~.errors.NoAnswer` last attempt) or only 5xx errors (a server whose engine has
  died behind its front end). An HTTP answer of any other status, or a model's wrong answer, is an answer.
- :class:`NoAnswerRun`: counts items in a row whose request got no answer; :func:`stop_after`
  (``max(8, 2 * concurrency)``) of them say the server has stopped answering, and a server that has never
  answered stops the batch at the first (a wrong URL or port, no server yet). Any answer resets the count.
- :class:`RetryNotes`: a note at most every ``every`` (10) seconds while requests are retried: how many
  requests wait between attempts, the causes since the last note (:func:`retry_cause`), the next wait, and, once
  per cut, the requests a server's 429s left in flight (``rate limited: 4 requests in flight``, the batch's
  :class:`~.limit.AdaptiveLimit`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Final

from cxrground.llm.errors import ClientError, ConnectFailed, NoAnswer, TimedOut, TransientError, Unreachable
from cxrground.llm.limit import AdaptiveLimit

__all__ = ["NOTE_EVERY_S", "NoAnswerRun", "RetryNotes", "got_no_answer", "retry_cause", "stop_after"]

#: Seconds between two retry notes.
NOTE_EVERY_S: Final[float] = 10.0


def stop_after(concurrency: int) -> int:
    """Items in a row whose request got no answer that stop a batch: ``max(8, 2 * concurrency)``."""
    return max(8, 2 * int(concurrency))


def got_no_answer(exc: ClientError) -> bool:
    """Whether ``exc`` (a request's error once its retries are spent) means the server gave no answer: the last
    attempt got no HTTP answer at all, or the request got only 5xx errors."""
    if isinstance(exc, Unreachable):
        return True
    last = exc.last if exc.last is not None else exc
    return isinstance(last, NoAnswer) or (isinstance(last, TransientError) and (last.status or 0) >= 500)


def retry_cause(exc: TransientError) -> str:
    """A retried error in a few words: ``HTTP 500``, ``timed out``, ``no connection``, ``connection lost``,
    ``malformed answer``."""
    if exc.status is not None and not 200 <= exc.status < 300:
        return f"HTTP {exc.status}"
    if isinstance(exc, TimedOut):
        return "timed out"
    if isinstance(exc, ConnectFailed):
        return "no connection"
    if isinstance(exc, NoAnswer):
        return "connection lost"
    return "malformed answer"


class NoAnswerRun:
    """Items in a row whose request got no answer (:func:`got_no_answer`), and the stop they call for.

    ``who`` starts the stop message (``the LLM structurer stops``, ``the run stops``), ``what`` names the items
    (``reports``, ``cases``), ``url`` the endpoint, ``url_hint`` and ``timeout_hint`` the options of the URL and of
    the request deadline.
    """

    def __init__(self, concurrency: int, who: str, what: str, url: str, *, url_hint: str = "the base URL",
                 timeout_hint: str = "--timeout") -> None:
        self.limit = stop_after(concurrency)
        self.who, self.what, self.url = who, what, url
        self.url_hint, self.timeout_hint = url_hint, timeout_hint
        self.count = 0

    def answered(self) -> None:
        """An item got an answer: the server is there."""
        self.count = 0

    def failed(self, exc: ClientError, ever_answered: bool) -> str | None:
        """Record an item whose request failed with ``exc`` (retries spent); returns the stop message when the batch
        should stop (``ever_answered``: whether the server answered any request yet), else None."""
        if not got_no_answer(exc):
            self.count = 0  # the server answered (an HTTP error): it is there
            return None
        last = exc if isinstance(exc, Unreachable) else exc.last
        if not ever_answered:  # never reached or never answered: every item would fail alike
            refused = isinstance(last, ConnectFailed) or isinstance(exc, Unreachable)
            what = "cannot reach" if refused else "got no answer from"
            return (f"{self.who}: {what} {self.url} ({exc.reason}); check {self.url_hint}, that the server is running"
                    + ("" if refused else f" and {self.timeout_hint}"))
        self.count += 1
        if self.count >= self.limit:
            return (f"{self.who}: {self.count} {self.what} in a row got no answer from {self.url} after their retries "
                    f"(last: {exc.reason}); the server has stopped answering")
        return None


class RetryNotes:
    """Retries of a batch's requests, noted to ``on_note`` (when set) at most every ``every`` seconds.

    Call :meth:`retried` from ``call_with_retries``' ``on_retry`` with a per-request list (empty at first) and
    :meth:`done` with the same list once the request is over. ``limit``: the batch's places in flight; a note says
    once how many a server's 429s left (``rate limited: N requests in flight``), and again only when they fall
    lower (or once they grew back to the full concurrency and fell again).
    """

    def __init__(self, prefix: str, every: float = NOTE_EVERY_S, limit: AdaptiveLimit | None = None) -> None:
        self.prefix, self.every, self.limit = prefix, every, limit
        self.on_note: Callable[[str], None] | None = None
        self.retrying = 0  # requests between attempts now
        self.causes: Counter[str] = Counter()  # causes of the retries since the last note
        self.last_note: float | None = None
        self.noted_limit: int | None = None  # the places in flight the last rate-limit note gave

    def retried(self, exc: TransientError, wait: float, request: list[bool]) -> None:
        """Count a retry of one request (``request``: whether it retried before) and note it when it is time."""
        if not request:
            request.append(True)
            self.retrying += 1
        self.causes[retry_cause(exc)] += 1
        now = time.monotonic()
        if self.on_note is None or (self.last_note is not None and now - self.last_note < self.every):
            return
        self.last_note = now
        causes = " / ".join(cause for cause, _ in self.causes.most_common())
        self.causes.clear()
        n = self.retrying
        after = f"{wait:.0f}" if wait >= 10 else f"{wait:.1f}"
        self.on_note(f"{self.prefix}: retrying {n} request{'' if n == 1 else 's'} ({causes}), next in {after} s"
                     + self._limited())

    def _limited(self) -> str:
        """``; rate limited: N requests in flight`` when the 429s cut the places in flight below the last note's."""
        limit = self.limit
        if limit is None:
            return ""
        if limit.limit >= limit.most:
            self.noted_limit = None  # grown back: a later cut is noted again
            return ""
        if self.noted_limit is not None and limit.limit >= self.noted_limit:
            return ""
        self.noted_limit = limit.limit
        return f"; rate limited: {limit.limit} request{'' if limit.limit == 1 else 's'} in flight"

    def done(self, request: list[bool]) -> None:
        """A request is over (answered or failed)."""
        if request:
            self.retrying -= 1
            request.clear()
