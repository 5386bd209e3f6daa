"""The connection limits of both HTTP servers: their defaults, their help texts and their checks.

:mod:`.connections` enforces these limits and needs the ``serve`` extra; this module needs nothing beyond the
standard library, so the command line reads its defaults and checks its values from here. ``cxrground review serve``
takes its options from :class:`ConnectionLimits`; ``cxrground serve`` declares the same options in
:class:`cxrground.serve.request.ServeRequest` (its body timeout has its own default, that of
:class:`cxrground.serve.limits.Limits`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from cxrground.errors import OptionValueError
from cxrground.fields import check_bounds, option

__all__ = ["BODY_TIMEOUT_HELP", "BODY_TIMEOUT_S", "IDLE_TIMEOUT_HELP", "IDLE_TIMEOUT_S", "MAX_CONNECTIONS",
           "MAX_CONNECTIONS_HELP", "SEND_LOG_INTERVAL_S", "SEND_TIMEOUT_HELP", "SEND_TIMEOUT_S", "ConnectionLimits",
           "check_seconds"]

#: Seconds a connection may stay open without sending a complete request head.
IDLE_TIMEOUT_S: Final[float] = 10.0
#: Seconds a request's body may take to arrive, from its head (the review app's; ``serve`` has its own limit).
BODY_TIMEOUT_S: Final[float] = 20.0
#: Open connections kept before the one waiting longest for a request is closed to make room.
MAX_CONNECTIONS: Final[int] = 1000
#: Seconds a connection may keep unsent response bytes without its client taking any of them.
SEND_TIMEOUT_S: Final[float] = 30.0
#: At most one log line per this many seconds about connections dropped for not reading their responses.
SEND_LOG_INTERVAL_S: Final[float] = 10.0

#: Help of ``--idle-timeout`` (both servers).
IDLE_TIMEOUT_HELP: Final[str] = ("Seconds a connection may stay open without sending a complete request head (after it "
                                 "opens or after its last response); then it is closed.")
#: Help of ``--body-timeout`` (both servers).
BODY_TIMEOUT_HELP: Final[str] = ("Seconds a request body may take to arrive after its head; then the answer is 408 and "
                                 "the connection is closed.")
#: Help of ``--send-timeout`` (both servers).
SEND_TIMEOUT_HELP: Final[str] = ("Seconds a connection may keep unsent response bytes without its client taking any of "
                                 "them; then it is dropped (a slow but steady reader is never cut).")
#: Help of ``--max-connections`` (both servers).
MAX_CONNECTIONS_HELP: Final[str] = ("Open connections kept (fewer when the open-file limit is low); one more closes "
                                    "the connection waiting longest for a request.")


def _flag(request: Any, name: str) -> str:
    meta = request.__dataclass_fields__[name].metadata
    return str(meta.get("flag", f"--{name.replace('_', '-')}"))


def check_seconds(request: Any, *names: str) -> None:
    """:func:`~cxrground.fields.check_bounds` of the dataclass ``request``, and each field in ``names`` a positive
    finite number: else :class:`OptionValueError` naming the option (``--send-timeout must be ...``)."""
    for name in names:
        value = getattr(request, name)
        if not (math.isfinite(value) and value > 0):
            raise OptionValueError(f"{_flag(request, name)} must be a positive finite number of seconds, got {value}")
    check_bounds(request)


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """How long a connection may stay idle, take to send a request body and leave its response untaken, and how
    many are kept open (the options of ``cxrground review serve``)."""

    idle_timeout: float = option(IDLE_TIMEOUT_S, low=0, low_open=True, metavar="S", help=IDLE_TIMEOUT_HELP)
    body_timeout: float = option(BODY_TIMEOUT_S, low=0, low_open=True, metavar="S", help=BODY_TIMEOUT_HELP)
    send_timeout: float = option(SEND_TIMEOUT_S, low=0, low_open=True, metavar="S", help=SEND_TIMEOUT_HELP)
    max_connections: int = option(MAX_CONNECTIONS, low=1, metavar="N", help=MAX_CONNECTIONS_HELP)

    def __post_init__(self) -> None:
        """Refuse a timeout that is not a positive finite number, or fewer than one connection
        (:class:`OptionValueError`, a usage error on the command line)."""
        check_seconds(self, "idle_timeout", "body_timeout", "send_timeout")
