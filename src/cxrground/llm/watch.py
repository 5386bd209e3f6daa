"""What a batch of chat requests watches while it runs: a server that has stopped answering, and retries in progress.

Shared by the LLM report structurer and ``percept eval`` (one rule, one wording):

- :func:`got_no_answer`: whether a request whose retries are spent got no answer from the server (refused, timed
  out, connection reset: a :class:`~.errors.NoAnswer` last attempt) or only 5xx errors (a server whose engine has
  died behind its front end). An HTTP answer of any other status, or a model's wrong answer, is an answer.
- :class:`NoAnswerRun`: counts items in a row whose request got no answer; :func:`stop_after`
  (``max(8, 2 * concurrency)``) of them say the server has stopped answering, and a server that has never
  answered stops the batch at the first (a wrong URL or port, no server yet). Any answer resets the count.
- :class:`RetryNotes`: a note at most every ``every`` (10) seconds while requests are retried: how many
  requests wait between attempts, the causes since the last note (:func:`retry_cause`), the next wait, and a
  ``Retry-After`` longer than the policy's cap.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Final

from cxrground.llm.errors import ClientError, ConnectFailed, NoAnswer, TimedOut, TransientError, Unreachable

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
    :meth:`done` with the same list once the request is over.
    """

    def __init__(self, prefix: str, max_retry_after: float | None = None, every: float = NOTE_EVERY_S) -> None:
        self.prefix, self.max_retry_after, self.every = prefix, max_retry_after, every
        self.on_note: Callable[[str], None] | None = None
        self.retrying = 0  # requests between attempts now
        self.causes: Counter[str] = Counter()  # causes of the retries since the last note
        self.last_note: float | None = None
        self.capped: float | None = None  # the longest Retry-After above the cap since the last note

    def retried(self, exc: TransientError, wait: float, request: list[bool]) -> None:
        """Count a retry of one request (``request``: whether it retried before) and note it when it is time."""
        if not request:
            request.append(True)
            self.retrying += 1
        self.causes[retry_cause(exc)] += 1
        cap = self.max_retry_after
        if cap is not None and exc.retry_after is not None and exc.retry_after > cap:
            self.capped = max(self.capped or 0.0, exc.retry_after)
        now = time.monotonic()
        if self.on_note is None or (self.last_note is not None and now - self.last_note < self.every):
            return
        self.last_note = now
        causes = " / ".join(cause for cause, _ in self.causes.most_common())
        self.causes.clear()
        n = self.retrying
        after = f"{wait:.0f}" if wait >= 10 else f"{wait:.1f}"
        capped = ""
        if self.capped is not None:
            capped = (f"; the server asked to wait {self.capped:g} s (Retry-After), capped at {cap:g} s "
                      "(max_retry_after)")
            self.capped = None
        self.on_note(f"{self.prefix}: retrying {n} request{'' if n == 1 else 's'} ({causes}), next in {after} s"
                     + capped)

    def done(self, request: list[bool]) -> None:
        """A request is over (answered or failed)."""
        if request:
            self.retrying -= 1
            request.clear()
