"""Connection-level defences shared by both HTTP servers (``cxrground serve`` and ``cxrground review serve``).

* :class:`GuardedH11Protocol` (uvicorn's h11 protocol, for ``uvicorn.Config(http=...)``): a connection that has
  not sent a complete request head within :data:`IDLE_TIMEOUT_S` seconds of opening (or of its last response) is
  closed, and past :data:`MAX_CONNECTIONS` open connections (fewer when the open-file limit is low) the connection
  waiting longest for a request is closed to make room. Idle or half-sent sockets therefore never lock clients
  out nor use up file descriptors; connections with a request in progress are never closed by either rule. A
  connection whose client takes none of its response for :data:`SEND_TIMEOUT_S` seconds (the bytes waiting in
  the transport's write buffer do not shrink) is dropped (aborted: the unsent bytes are freed, and a handler
  waiting to send is released), so clients that never read their responses hold neither memory nor a slot;
  a client that reads slowly but steadily is never cut. Each drop is logged, one line per
  :data:`SEND_LOG_INTERVAL_S` seconds at most. Bytes that are no HTTP/1.1 request get a 400 in the servers' JSON
  error shape with the parser's reason (uvicorn answers plain text), and the connection is closed. When the server
  stops, a request whose body is still arriving is answered 503 and its connection closed (uvicorn would wait for
  the body up to the body timeout); requests whose bodies are in are finished and answered.
* :class:`BodyDeadline` (ASGI middleware): a request whose body has not fully arrived within its deadline raises
  :class:`BodyTimeout` in the handler that waits for it (the apps answer it with 408 and close the connection).
* :func:`prepare_process`: raise the soft open-file limit to the hard one and keep asyncio's "accept failed" log
  from flooding (:class:`AcceptErrorFilter`: one short line per interval).

The limits above are defaults (kept in :mod:`cxrground.net.limits`, which needs no extra, and re-exported here);
each server sets its own with the command-line options ``--idle-timeout``, ``--body-timeout``, ``--send-timeout``
and ``--max-connections``. :func:`guarded_protocol` gives each configuration a class of its own, so servers with
different limits in one process never affect each other; the attributes of :class:`GuardedH11Protocol` itself are
never changed.

It needs uvicorn and starlette (the ``serve`` extra).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import math
import socket
import sys
import time
from typing import ClassVar, Final

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from cxrground.errors import ConfigError
from cxrground.net.limits import (
    BODY_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS,
    SEND_LOG_INTERVAL_S,
    SEND_TIMEOUT_S,
)

__all__ = ["BODY_TIMEOUT_S", "IDLE_TIMEOUT_S", "MAX_CONNECTIONS", "SEND_LOG_INTERVAL_S", "SEND_TIMEOUT_S",
           "AcceptErrorFilter", "BodyDeadline", "BodyTimeout", "GuardedH11Protocol", "LogThrottle", "check_port",
           "guarded_protocol", "prepare_process", "raise_open_file_limit"]

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


class LogThrottle:
    """Logs one warning per ``interval`` seconds at most; a line says how many were left out since the last one."""

    def __init__(self, interval: float = SEND_LOG_INTERVAL_S) -> None:
        self.interval = interval
        self._last = -float("inf")
        self._dropped = 0

    def warning(self, log: logging.Logger, message: str) -> bool:
        """Log ``message`` on ``log`` unless a line went out less than ``interval`` seconds ago; True if logged."""
        now = time.monotonic()
        if now - self._last < self.interval:
            self._dropped += 1
            return False
        more = f" ({self._dropped} more since the last such line not logged)" if self._dropped else ""
        log.warning("%s%s", message, more)
        self._last, self._dropped = now, 0
        return True


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol that closes connections idle for :attr:`idle_timeout` seconds without a request,
    keeps at most :attr:`max_connections` open by closing the one waiting longest for a request, and drops a
    connection whose client has taken none of its unsent response bytes for :attr:`send_timeout` seconds.

    The send deadline is watched while the transport holds unsent bytes: from the moment uvicorn's flow control
    pauses writing (the write buffer went over its high-water mark) or a response is complete with bytes still
    unsent, the buffer's size is checked every quarter of :attr:`send_timeout`; whenever it has shrunk (or writing
    resumed) the deadline starts again. Dropping is :meth:`asyncio.Transport.abort`: the buffer is freed at once,
    and uvicorn's ``connection_lost`` marks the request disconnected and releases a handler waiting in
    ``await send(...)`` (its sends then return at once), so the handler ends and gives back what it holds.

    The limits are class attributes, read by every connection of the class: a server with other limits uses a
    subclass of its own (:func:`guarded_protocol`); nothing sets them on this class.
    """

    idle_timeout: ClassVar[float] = IDLE_TIMEOUT_S
    max_connections: ClassVar[int] = MAX_CONNECTIONS
    send_timeout: ClassVar[float] = SEND_TIMEOUT_S
    #: One per protocol class, so one per server configuration (:func:`guarded_protocol`).
    send_log: ClassVar[LogThrottle] = LogThrottle()

    _idle_timer: asyncio.TimerHandle | None = None
    _idle_since: float = 0.0
    _send_timer: asyncio.TimerHandle | None = None
    _send_unsent: int = 0
    _send_progress_at: float = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_idle_timer()
        self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_idle_timer()
        self._cancel_send_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._unsent() > 0:
            self._watch_sending()
        if not self.transport.is_closing():
            self._arm_idle_timer()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_sending()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:  # the client took bytes: the deadline starts again
            self._send_progress_at = self.loop.time()
            self._send_unsent = self._unsent()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown (idle connections closed, requests in progress finished and answered), except
        that a request whose body is still arriving is answered 503 ``shutting_down`` and its connection closed: the
        server would otherwise wait up to the body timeout for a client that may never send the rest."""
        if self.cycle is None or self.cycle.response_complete or self.conn.their_state is not h11.SEND_BODY:
            super().shutdown()
            return
        body = json.dumps({"error": {"type": "shutting_down", "message": "the server is shutting down; retry later",
                                     "code": "503", "param": None}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close"), (b"retry-after", b"5")]
        try:
            for event in (h11.Response(status_code=503, headers=headers, reason=b"Service Unavailable"),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # a response had begun: nothing more can be said on this connection
            pass
        self.transport.close()  # the handler waiting for the body is told the client has gone

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are no HTTP/1.1 request (a bad request line, no ``Host``, a head too long),
        as JSON in the servers' error shape with h11's reason, instead of uvicorn's plain text; the connection is
        closed."""
        exc = sys.exc_info()[1]  # called while uvicorn handles h11's RemoteProtocolError
        reason = f"invalid HTTP request ({exc})" if exc is not None and str(exc) else "invalid HTTP request"
        body = json.dumps({"error": {"type": "invalid_request", "message": reason, "code": "400",
                                     "param": None}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

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

    def _unsent(self) -> int:
        try:
            return int(self.transport.get_write_buffer_size())
        except (AttributeError, RuntimeError):  # pragma: no cover - a transport without a write buffer
            return 0

    def _send_check_interval(self) -> float:
        return max(0.01, self.send_timeout / 4)

    def _watch_sending(self) -> None:
        """Start watching the unsent bytes (no-op while already watching)."""
        if self._send_timer is None:
            self._send_unsent = self._unsent()
            self._send_progress_at = self.loop.time()
            self._send_timer = self.loop.call_later(self._send_check_interval(), self._check_sending)

    def _cancel_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _check_sending(self) -> None:
        self._send_timer = None
        if self not in self.connections:  # upgraded to another protocol, or already gone
            return
        unsent = self._unsent()
        if unsent == 0 and not self.flow.write_paused:
            return  # everything is with the kernel
        now = self.loop.time()
        if unsent < self._send_unsent:
            self._send_progress_at = now
        self._send_unsent = unsent
        stalled = now - self._send_progress_at
        if stalled >= self.send_timeout:
            self._drop_stalled(unsent, stalled)
            return
        self._send_timer = self.loop.call_later(min(self._send_check_interval(), self.send_timeout - stalled),
                                                self._check_sending)

    def _drop_stalled(self, unsent: int, stalled: float) -> None:
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        self.send_log.warning(self.logger, f"dropped the connection of {client}: it took none of its response for "
                                           f"{stalled:.0f} s ({unsent} bytes unsent; send timeout "
                                           f"{self.send_timeout:g} s)")
        self.transport.abort()

    def _make_room(self) -> None:
        fds = _open_file_limit()
        cap = self.max_connections if fds is None else max(8, min(self.max_connections, fds - _FD_RESERVE))
        if len(self.connections) <= cap:
            return
        waiting = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol)
                   and c.awaiting_request() and not c.transport.is_closing()]
        if waiting:
            min(waiting, key=lambda c: c._idle_since).transport.close()


def guarded_protocol(idle_timeout: float = IDLE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
                     send_timeout: float = SEND_TIMEOUT_S) -> type[GuardedH11Protocol]:
    """The protocol class with these limits (:class:`GuardedH11Protocol` itself for the defaults: it can be
    pickled for uvicorn's worker processes; any other is a new subclass, made for this call, with its own
    :attr:`~GuardedH11Protocol.send_log` throttle: no other server's protocol changes). The timeouts must be
    positive finite numbers and ``max_connections`` at least 1 (:class:`ValueError`)."""
    timeouts_ok = all(math.isfinite(t) and t > 0 for t in (idle_timeout, send_timeout))
    if not timeouts_ok or max_connections < 1:
        raise ValueError("idle_timeout and send_timeout must be positive finite numbers and max_connections at least "
                         f"1, got {idle_timeout}, {send_timeout}, {max_connections}")
    if (idle_timeout, max_connections, send_timeout) == (IDLE_TIMEOUT_S, MAX_CONNECTIONS, SEND_TIMEOUT_S):
        return GuardedH11Protocol
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"idle_timeout": float(idle_timeout), "max_connections": int(max_connections),
                 "send_timeout": float(send_timeout), "send_log": LogThrottle()})


class BodyTimeout(Exception):
    """The request body did not arrive in time."""


class BodyDeadline:
    """ASGI middleware: each HTTP request's body must have arrived ``timeout`` seconds after its head; a handler
    still waiting for it then gets :class:`BodyTimeout`. Once the body is in, the deadline no longer applies (a
    handler that asks whether its client is still there, however late, is told, not timed out)."""

    def __init__(self, app: ASGIApp, timeout: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.timeout
        arrived = False

        async def timed_receive() -> Message:
            nonlocal arrived
            if arrived:  # the body is in: later receives wait for the client to go, untimed
                return await receive()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(f"the request body did not arrive within {self.timeout:g} s") from None
            arrived = message["type"] != "http.request" or not message.get("more_body", False)
            return message

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


def _is_late_restart(message: str, record: logging.LogRecord) -> bool:
    """Whether ``record`` is asyncio's retry of accepting (scheduled after an accept failed for want of files)
    that fired after the server closed its listening socket at shutdown: harmless, nothing to report."""
    exc = record.exc_info[1] if record.exc_info else None
    return ("_start_serving" in message and isinstance(exc, ValueError)
            and "Invalid file descriptor" in str(exc))


class AcceptErrorFilter(logging.Filter):
    """Passes one short line (no traceback) per ``interval`` seconds of asyncio's "accept failed" errors (out of
    file descriptors or memory), with how many were left out, and drops the accept retry that fires after shutdown
    closed the listening socket; other records pass unchanged."""

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self._last = -float("inf")
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _is_late_restart(message, record):
            return False
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


def check_port(host: str, port: int) -> None:
    """A :class:`~cxrground.errors.ConfigError` when ``host:port`` cannot be listened on (in use, not an address of
    this machine, not permitted): a server checks it before it loads anything or says where it listens."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
        try:
            probe.bind(address)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}"
                              + (" (another server holds it; pick another --port)"
                                 if exc.errno == errno.EADDRINUSE else "")) from exc
