"""Starting the review web app (:func:`launch_app`) without importing it before it is needed.

The app itself (:mod:`cxrground.review.app`) needs the ``serve`` extra (FastAPI, uvicorn); this module does not.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cxrground.errors import ConfigError
from cxrground.net.limits import ConnectionLimits
from cxrground.review.db import MAX_SESSION_HOURS, SESSION_SECONDS, ReviewDB

__all__ = ["LOOPBACK_HOSTS", "launch_app"]

#: Host names that keep the app on this machine.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def launch_app(db_path: Path, host: str, port: int, warn: Callable[[str], None], note: Callable[[str], None], *,
               secure_cookies: bool = False, connections: ConnectionLimits | None = None,
               session_hours: float = SESSION_SECONDS / 3600) -> None:
    """Check the database and serve the review app until interrupted; ``warn`` is told when ``host`` reaches
    beyond this machine (without ``secure_cookies``), ``note`` where the app listens; ``connections``: the
    connection timeouts and limit (the defaults of :class:`ConnectionLimits` without); ``session_hours``: how long a
    sign-in lasts (more than 0, at most :data:`~cxrground.review.db.MAX_SESSION_HOURS`). Without the ``serve``
    extra, when ``host:port`` cannot be listened on, or with ``session_hours`` out of range, this is a
    :class:`ConfigError`."""
    if not 0 < session_hours <= MAX_SESSION_HOURS:
        raise ConfigError(f"--session-hours must be more than 0 and at most {MAX_SESSION_HOURS}, got {session_hours}")
    try:
        from cxrground.net.connections import check_port
        from cxrground.review.app import serve
    except ImportError as exc:
        raise ConfigError(f"the review app needs the 'serve' extra (pip install 'cxrground[serve]'): {exc}") from exc
    ReviewDB(db_path)
    check_port(host, port)
    if host not in LOOPBACK_HOSTS and not secure_cookies:
        warn(f"warning: binding to {host} exposes the review app beyond this machine; put HTTPS in front "
             "and pass --secure-cookies.")
    note(f"review app for {db_path} on http://{host}:{port}/" + (" (Secure cookies: reach it over HTTPS)"
                                                                   if secure_cookies else ""))
    serve(db_path, host=host, port=port, secure_cookies=secure_cookies, connections=connections,
          session_hours=session_hours)
