"""Connection-level defences shared by both HTTP servers (``cxrground serve`` and ``cxrground review serve``).

* :class:`GuardedH11Protocol` (uvicorn's h11 protocol, for ``uvicorn.Config(http=...)``): a connection that has
  not sent a complete request head within :data:`IDLE_TIMEOUT_S` seconds of opening (or of its last response) is
  closed, and past :data:`MAX_CONNECTIONS` open connections (fewer when the open-file limit is low) the connection
  waiting longest for a request is closed to make room. Idle or half-sent sockets therefore never lock clients
  out nor use up file descriptors; connections with a request in progress are never closed by either rule.
* :class:`BodyDeadline` (ASGI middleware): a request whose body has not fully arrived within its deadline raises
  :class:`BodyTimeout` in the handler that waits for it (the apps answer it with 408 and close the connection).
* :func:`prepare_process`: raise the soft open-file limit to the hard one and keep asyncio's "accept failed" log
  from flooding (:class:`AcceptErrorFilter`: one short line per interval).

It needs uvicorn and starlette (the ``serve`` extra).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import ClassVar, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["BODY_TIMEOUT_S", "IDLE_TIMEOUT_S", "MAX_CONNECTIONS", "AcceptErrorFilter", "BodyDeadline",
           "BodyTimeout", "GuardedH11Protocol", "guarded_protocol", "prepare_process", "raise_open_file_limit"]

#: Seconds a connection may stay open without sending a complete request head.
IDLE_TIMEOUT_S: Final[float] = 10.0
#: Seconds a request's body may take to arrive, from its head (the review app's; ``serve`` has its own limit).
BODY_TIMEOUT_S: Final[float] = 20.0
#: Open connections kept before the one waiting longest for a request is closed to make room.
MAX_CONNECTIONS: Final[int] = 1000
#: File descriptors left for the server itself (database, listening socket, threads) below the open-file limit.
_FD_RESERVE: Final[int] = 64
_ACCEPT_ERROR: Final[str] = "socket.accept() out of system resource"


def _open_file_limit() -> int | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol that closes connections idle for :attr:`idle_timeout` seconds without a request
    and keeps at most :attr:`max_connections` open by closing the one waiting longest for a request."""

    idle_timeout: ClassVar[float] = IDLE_TIMEOUT_S
    max_connections: ClassVar[int] = MAX_CONNECTIONS

    _idle_timer: asyncio.TimerHandle | None = None
    _idle_since: float = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_idle_timer()
        self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_idle_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_idle_timer()

    def awaiting_request(self) -> bool:
        """True while the connection has no request in progress (before its first, or after a response)."""
        return self.cycle is None or self.cycle.response_complete

    def _arm_idle_timer(self) -> None:
        self._cancel_idle_timer()
        self._idle_since = self.loop.time()
        self._idle_timer = self.loop.call_later(self.idle_timeout, self._idle_expired)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_expired(self) -> None:
        self._idle_timer = None
        if self.awaiting_request() and self in self.connections and not self.transport.is_closing():
            self.transport.close()  # (a connection upgraded to another protocol has left ``connections``)

    def _make_room(self) -> None:
        fds = _open_file_limit()
        cap = self.max_connections if fds is None else max(8, min(self.max_connections, fds - _FD_RESERVE))
        if len(self.connections) <= cap:
            return
        waiting = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol)
                   and c.awaiting_request() and not c.transport.is_closing()]
        if waiting:
            min(waiting, key=lambda c: c._idle_since).transport.close()


def guarded_protocol(idle_timeout: float = IDLE_TIMEOUT_S,
                     max_connections: int = MAX_CONNECTIONS) -> type[GuardedH11Protocol]:
    """The protocol class with these limits (:class:`GuardedH11Protocol` itself for the defaults: it can be
    pickled for uvicorn's worker processes)."""
    if idle_timeout <= 0 or max_connections < 1:
        raise ValueError(f"idle_timeout and max_connections must be positive, got {idle_timeout}, {max_connections}")
    if (idle_timeout, max_connections) == (IDLE_TIMEOUT_S, MAX_CONNECTIONS):
        return GuardedH11Protocol
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"idle_timeout": float(idle_timeout), "max_connections": int(max_connections)})


class BodyTimeout(Exception):
    """The request body did not arrive in time."""


class BodyDeadline:
    """ASGI middleware: each HTTP request's body must have arrived ``timeout`` seconds after its head; a handler
    still waiting for it then gets :class:`BodyTimeout`."""

    def __init__(self, app: ASGIApp, timeout: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.timeout

        async def timed_receive() -> Message:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    return await receive()
            except TimeoutError:
                raise BodyTimeout(f"the request body did not arrive within {self.timeout:g} s") from None

        await self.app(scope, timed_receive, send)


def raise_open_file_limit() -> int | None:
    """Raise this process's soft limit on open files to its hard limit; the new soft limit (None: no such limit)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return _open_file_limit()
    return _open_file_limit()


class AcceptErrorFilter(logging.Filter):
    """Passes one short line (no traceback) per ``interval`` seconds of asyncio's "accept failed" errors (out of
    file descriptors or memory), with how many were left out; other records pass unchanged."""

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self._last = -float("inf")
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(_ACCEPT_ERROR):
            return True
        now = time.monotonic()
        if now - self._last < self.interval:
            self._dropped += 1
            return False
        reason = f": {record.exc_info[1]}" if record.exc_info and record.exc_info[1] is not None else ""
        dropped = f" ({self._dropped} more in the last {self.interval:g} s not logged)" if self._dropped else ""
        record.msg, record.args = f"{_ACCEPT_ERROR}{reason}; new connections wait{dropped}", None
        record.exc_info = record.exc_text = None
        self._last, self._dropped = now, 0
        return True


def prepare_process(log: logging.Logger | None = None) -> int | None:
    """Before a server starts: raise the open-file limit (:func:`raise_open_file_limit`, returned) and add an
    :class:`AcceptErrorFilter` to asyncio's logger (once)."""
    log = log or logging.getLogger("asyncio")
    if not any(isinstance(f, AcceptErrorFilter) for f in log.filters):
        log.addFilter(AcceptErrorFilter())
    return raise_open_file_limit()
