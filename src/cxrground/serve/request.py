"""Serving a checkpoint as a request (:class:`ServeRequest`) and :func:`serve_request`.

Each field documents itself (:func:`cxrground.fields.option`); ``cxrground serve`` offers one option per field.
This module needs no extra; the server itself (FastAPI, uvicorn: the ``serve`` extra) is imported when it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cxrground.errors import ConfigError
from cxrground.fields import option
from cxrground.net.limits import (
    BODY_TIMEOUT_HELP,
    IDLE_TIMEOUT_HELP,
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_HELP,
    SEND_TIMEOUT_HELP,
    SEND_TIMEOUT_S,
    check_seconds,
)
from cxrground.serve.limits import Limits

__all__ = ["ServeRequest", "serve_request"]


@dataclass(frozen=True, kw_only=True)
class ServeRequest:
    """Which checkpoint to serve, where, on which device, with which limits and access rules."""

    checkpoint: Path = option(path="existing", help="Checkpoint folder (checkpoint.json names the backend).")
    host: str = option("127.0.0.1", help="Address to bind; anything but loopback exposes the server to the network.")
    port: int = option(8000, low=0, high=65535, help="TCP port to listen on.")
    device: str = option("cpu", help="Device for the model (cpu, cuda, cuda:1 ...).")
    max_upload_mb: float = option(32.0, low=0, low_open=True, help="Largest image accepted, in MiB (413 beyond).")
    max_pixels: int = option(40_000_000, low=1, help="Largest image accepted, in pixels (413 beyond).")
    workers: int = option(1, low=1, help="Server processes, each with its own copy of the model.")
    max_in_flight: int = option(2, low=1, help="Image requests worked on at once per process (decoding, model, "
                                "encoding); one more waits up to 10 s for a slot, then gets 503 busy.")
    api_key_env: str | None = option(None, metavar="NAME", help="Require the API key held by environment variable "
                                     "NAME on every route but /health ('Authorization: Bearer KEY' or 'api-key: KEY').")
    cors_origins: tuple[str, ...] = option((), flag="--cors-origin", metavar="ORIGIN", help="Allow cross-origin "
                                           "browser calls from ORIGIN (repeatable; CORS is off without it).")
    idle_timeout: float = option(IDLE_TIMEOUT_S, low=0, low_open=True, metavar="S", help=IDLE_TIMEOUT_HELP)
    body_timeout: float = option(Limits.body_timeout_s, low=0, low_open=True, metavar="S", help=BODY_TIMEOUT_HELP)
    send_timeout: float = option(SEND_TIMEOUT_S, low=0, low_open=True, metavar="S", help=SEND_TIMEOUT_HELP)
    max_connections: int = option(MAX_CONNECTIONS, low=1, metavar="N", help=MAX_CONNECTIONS_HELP)

    def __post_init__(self) -> None:
        """Refuse values outside their range, and a timeout that is not a positive finite number
        (:class:`~cxrground.errors.OptionValueError`, a usage error on the command line)."""
        check_seconds(self, "idle_timeout", "body_timeout", "send_timeout")


def serve_request(request: ServeRequest, warn: Callable[[str], None], note: Callable[[str], None]) -> None:
    """Serve the checkpoint until interrupted; ``warn`` is told when the server is reachable from other machines
    without an API key, ``note`` where it listens. Without the ``serve`` extra this is a :class:`ConfigError`."""
    try:
        from cxrground.models.base import checkpoint_info
        from cxrground.serve.access import AccessPolicy, read_api_key
        from cxrground.serve.run import is_loopback, serve
    except ImportError as exc:
        raise ConfigError(f"serving needs the 'serve' extra (pip install 'cxrground[serve]'): {exc}") from exc
    r = request
    key = read_api_key(r.api_key_env) if r.api_key_env else None
    access = AccessPolicy(api_key=key, api_key_env=r.api_key_env, cors_origins=r.cors_origins)
    if not is_loopback(r.host) and key is None:
        warn(f"warning: binding to {r.host} exposes the server beyond this machine; it has no authentication (see "
             "--api-key-env). Put it behind an authenticating proxy.")
    limits = Limits(max_upload_bytes=int(r.max_upload_mb * 1024 * 1024), max_pixels=r.max_pixels,
                    max_in_flight=r.max_in_flight, body_timeout_s=r.body_timeout)
    checkpoint_info(r.checkpoint)  # a folder that is no checkpoint is refused before the model is loaded

    def ready() -> None:  # announced once the model is loaded: a checkpoint that cannot be is an error, not "serving"
        workers = f" ({r.workers} workers, each with the model loaded)" if r.workers > 1 else ""
        note(f"serving {r.checkpoint} on http://{r.host}:{r.port}/ (web page), /v1/segment, /v1/chat/completions"
             + workers)

    serve(r.checkpoint, host=r.host, port=r.port, device=r.device, limits=limits, access=access, workers=r.workers,
          idle_timeout=r.idle_timeout, send_timeout=r.send_timeout, max_connections=r.max_connections,
          on_ready=ready)
