"""Errors of a chat-completions request: worth retrying (:class:`TransientError`) or not (:class:`PermanentError`)."""

from __future__ import annotations

from cxrground.errors import CXRGroundError

__all__ = ["REFUSING_STATUSES", "ClientError", "ConnectFailed", "EndpointRefused", "NoAnswer", "PermanentError",
           "TimedOut", "TransientError", "Unreachable"]


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
    """401 / 403 / 404: the endpoint refuses the request for a reason every other request shares (the key, the URL,
    the model name); a batch stops instead of failing each item alike."""
