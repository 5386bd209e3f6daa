"""Errors of a chat-completions request: worth retrying (:class:`TransientError`) or not (:class:`PermanentError`)."""

from __future__ import annotations

from cxrground.errors import CXRGroundError

__all__ = ["REDIRECT_STATUSES", "REFUSING_STATUSES", "ClientError", "ConnectFailed", "EndpointRefused", "NoAnswer",
           "PermanentError", "Redirected", "TimedOut", "TransientError", "Unreachable", "WaitTooLong", "wait_words"]


class ClientError(CXRGroundError):
    """A request failed; ``reason`` says why, ``status`` is the HTTP status when there was one.

    ``retry_after`` is the server's ``Retry-After`` in seconds (None when it sent none). ``last`` is, on the error
    raised once a request's retries are spent, the transient error of its last attempt. ``attempts`` is, on an error
    that :func:`~.retry.call_with_retries` lets through, how many attempts the request made (None elsewhere).
    """

    def __init__(self, reason: str, retry_after: float | None = None, status: int | None = None, *,
                 last: TransientError | None = None) -> None:
        self.reason = reason
        self.retry_after = retry_after
        self.status = status
        self.last = last
        self.attempts: int | None = None
        super().__init__(reason)


class TransientError(ClientError):
    """408 / 409 / 425 / 429 / 5xx, a timeout or a connection error: worth retrying."""


class NoAnswer(TransientError):
    """The request got no HTTP answer: a timeout, or a connection that could not be opened or broke before the answer
    (retried like the other transient errors; a server that keeps giving no answer has stopped, or never started)."""


class TimedOut(NoAnswer):
    """The request was not done within its deadline (connect, send and the whole answer together)."""


class ConnectFailed(NoAnswer):
    """No connection to the server at all (connection refused, unknown host, no route, connect timeout): retried like
    the other transient errors, but it says nothing of the server's health, only that it was not reached."""


class Unreachable(ClientError):
    """A request's retries are spent and its last attempt reached no server (:class:`ConnectFailed`): raised by
    :func:`~.retry.call_with_retries` in place of a plain :class:`ClientError`."""


class PermanentError(ClientError):
    """Any other failure (other 4xx, content that is not text): not retried."""


#: HTTP statuses with which an endpoint refuses every request alike: a wrong or missing key (401, 403), a wrong
#: URL path or model name (404).
REFUSING_STATUSES: frozenset[int] = frozenset({401, 403, 404})


class EndpointRefused(PermanentError):
    """The endpoint refuses the request for a reason every other request shares: 401 / 403 / 404 (the key, the URL,
    the model name), a redirect (:class:`Redirected`), a wait longer than the policy allows (:class:`WaitTooLong`);
    a batch stops instead of failing each item alike."""


#: HTTP statuses of a redirect: a POST is not followed (:class:`Redirected`).
REDIRECT_STATUSES: frozenset[int] = frozenset({301, 302, 303, 307, 308})


class Redirected(EndpointRefused):
    """The endpoint answered with a redirect (301 / 302 / 303 / 307 / 308); ``location`` is where it points (the
    ``Location`` header resolved against the request URL; None when the answer had none)."""

    def __init__(self, reason: str, location: str | None, status: int) -> None:
        super().__init__(reason, status=status)
        self.location = location


def wait_words(seconds: float) -> str:
    """``86400 s (24 h)``: seconds, with hours or minutes when there are many."""
    if seconds >= 3600:
        return f"{seconds:g} s ({seconds / 3600:.3g} h)"
    if seconds >= 120:
        return f"{seconds:g} s ({seconds / 60:.3g} min)"
    return f"{seconds:g} s"


class WaitTooLong(EndpointRefused):
    """The server asked to wait longer (``retry_after`` seconds, its ``Retry-After``) than the retry policy allows
    (``cap``, ``max_retry_after``), as with a daily quota: the request is not retried, and every other request would
    wait alike. :meth:`stop_line` words it for a batch, naming the option of the cap."""

    def __init__(self, reason: str, retry_after: float, cap: float, status: int | None = None) -> None:
        super().__init__(reason, retry_after=retry_after, status=status)
        self.cap = cap

    def stop_line(self, option: str) -> str:
        """``the server asks to wait 86400 s (24 h) before the next request (Retry-After of an HTTP 429: a quota used
        up?), longer than OPTION (300 s) allows``."""
        wait = float(self.retry_after or 0.0)
        of = f" of an HTTP {self.status}" if self.status is not None else ""
        return (f"the server asks to wait {wait_words(wait)} before the next request (Retry-After{of}: a quota "
                f"used up?), longer than {option} ({self.cap:g} s) allows")
