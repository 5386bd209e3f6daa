"""Starting the server: ``serve()`` for the command line, :class:`BackgroundServer` for tests and harnesses.

``serve`` loads the checkpoint through :func:`cxrground.models.base.load_model` (any backend) and runs
uvicorn. With ``workers > 1`` uvicorn starts that many processes, each loading its own copy of the
model through :func:`app_from_env` (the settings travel in ``CXRGROUND_SERVE_*`` environment variables; the
connection limits too, read by :func:`protocol_from_env`). Connections are guarded as in
:mod:`cxrground.net.connections` (idle ones closed after ``idle_timeout`` seconds, at most ``max_connections`` kept
open, one whose client takes none of its response for ``send_timeout`` seconds dropped; by default
:data:`~cxrground.net.limits.IDLE_TIMEOUT_S`, :data:`~cxrground.net.limits.MAX_CONNECTIONS` and
:data:`~cxrground.net.limits.SEND_TIMEOUT_S`), the open-file limit is raised to the hard limit and failed accepts
are logged once per interval, not once each.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError
from cxrground.io.files import sha256_file
from cxrground.models.base import CHECKPOINT_FILE, IlsModel, load_model
from cxrground.net.connections import (
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS,
    SEND_TIMEOUT_S,
    GuardedH11Protocol,
    check_port,
    guarded_protocol,
    prepare_process,
)
from cxrground.serve.access import AccessPolicy, read_api_key
from cxrground.serve.limits import Limits

__all__ = ["BackgroundServer", "app_from_env", "checkpoint_id", "is_loopback", "load_and_create",
           "protocol_class_from_env", "protocol_from_env", "serve"]

_ENV_CHECKPOINT = "CXRGROUND_SERVE_CHECKPOINT"
_ENV_DEVICE = "CXRGROUND_SERVE_DEVICE"
_ENV_LIMITS = "CXRGROUND_SERVE_LIMITS"
_ENV_ACCESS = "CXRGROUND_SERVE_ACCESS"
#: The connection limits (idle_timeout, max_connections, send_timeout) as JSON (multi-worker only).
_ENV_CONNECTIONS = "CXRGROUND_SERVE_CONNECTIONS"
#: Holds a key given to :func:`serve` without the name of the variable it came from (multi-worker only).
_ENV_API_KEY = "CXRGROUND_SERVE_API_KEY"
#: A folder each worker marks once its model is loaded, so the parent can say when all are (multi-worker only).
_ENV_READY = "CXRGROUND_SERVE_READY_DIR"
#: Seconds a worker may take to answer uvicorn's liveness ping before it is killed and restarted: uvicorn's 5 s
#: kills workers still importing torch or loading a model on a busy machine.
WORKER_HEALTHCHECK_S: Final = 60
#: The exit status of a worker that could not start (uvicorn's STARTUP_FAILURE): its parent stops, not restarts it.
_STARTUP_FAILURE: Final = 3


def checkpoint_id(checkpoint: str | Path) -> str:
    """``<folder name>@<first 12 hex digits of sha256(checkpoint.json)>``: names a checkpoint without its path."""
    path = Path(checkpoint)
    meta = path / CHECKPOINT_FILE if path.is_dir() else path
    folder = path if path.is_dir() else path.parent
    digest = sha256_file(meta)[:12] if meta.is_file() else "unknown"
    return f"{folder.resolve().name}@{digest}"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _announce_when_ready(folder: Path, workers: int, on_ready: Callable[[], None],
                         stop: threading.Event) -> threading.Thread:
    """A daemon thread that calls ``on_ready`` once ``workers`` processes have marked ``folder`` (each marks it when
    its model is loaded), unless ``stop`` is set first."""
    def watch() -> None:
        while not stop.wait(0.2):
            if len(list(folder.glob("ready-*"))) >= workers:
                on_ready()
                return

    thread = threading.Thread(target=watch, name="cxrground-serve-ready", daemon=True)
    thread.start()
    return thread


def serve(
    checkpoint: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    device: str = "cpu",
    limits: Limits | None = None,
    access: AccessPolicy | None = None,
    workers: int = 1,
    log_level: str = "info",
    idle_timeout: float = IDLE_TIMEOUT_S,
    send_timeout: float = SEND_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Load ``checkpoint`` and serve it with uvicorn until interrupted (``access``: API key and CORS; the connection
    limits as in :func:`~cxrground.net.connections.guarded_protocol`, a :class:`ValueError` when one is not positive
    and finite). A port that cannot be listened on is a :class:`~cxrground.errors.ConfigError` before the model is
    loaded. ``on_ready`` is called once the model is loaded, before uvicorn starts (with ``workers > 1``, once every
    worker process has loaded its own copy)."""
    import uvicorn

    limits = limits or Limits()
    access = access or AccessPolicy()
    protocol = guarded_protocol(idle_timeout, max_connections, send_timeout)
    check_port(host, port)
    prepare_process()
    if workers > 1:
        os.environ[_ENV_CHECKPOINT] = str(Path(checkpoint).resolve())
        os.environ[_ENV_DEVICE] = device
        os.environ[_ENV_LIMITS] = json.dumps(asdict(limits))
        key_env = access.api_key_env
        if access.api_key is not None and key_env is None:
            key_env = _ENV_API_KEY
            os.environ[key_env] = access.api_key
        # the key itself stays in its own variable; the workers get its name
        os.environ[_ENV_ACCESS] = json.dumps({"api_key_env": key_env if access.api_key is not None else None,
                                              "cors_origins": list(access.cors_origins)})
        # a class made here cannot be pickled into the worker processes: each makes its own from these
        os.environ[_ENV_CONNECTIONS] = json.dumps({"idle_timeout": protocol.idle_timeout,
                                                   "max_connections": protocol.max_connections,
                                                   "send_timeout": protocol.send_timeout})
        ready_dir = Path(tempfile.mkdtemp(prefix="cxrground-serve-ready-"))
        os.environ[_ENV_READY] = str(ready_dir)
        stop = threading.Event()
        if on_ready is not None:
            _announce_when_ready(ready_dir, workers, on_ready, stop)
        try:
            uvicorn.run("cxrground.serve.run:app_from_env", factory=True, host=host, port=port, workers=workers,
                        log_level=log_level, http="cxrground.serve.run:protocol_from_env",
                        timeout_worker_healthcheck=WORKER_HEALTHCHECK_S)
            failed = sorted(ready_dir.glob("failed-*"))
            if failed:
                raise ConfigError(f"the server's workers could not load {checkpoint}: "
                                  f"{failed[0].read_text(encoding='utf-8')}")
        finally:
            stop.set()
            os.environ.pop(_ENV_READY, None)
            shutil.rmtree(ready_dir, ignore_errors=True)
        return
    app, _ = load_and_create(checkpoint, device=device, limits=limits, access=access)
    if on_ready is not None:
        on_ready()
    uvicorn.run(app, host=host, port=port, log_level=log_level, http=protocol)


def app_from_env() -> Any:
    """App factory for multi-worker uvicorn: loads the checkpoint named in the environment."""
    limits_data = json.loads(os.environ.get(_ENV_LIMITS, "{}"))
    if "allowed_types" in limits_data:
        limits_data["allowed_types"] = tuple(limits_data["allowed_types"])
    access_data = json.loads(os.environ.get(_ENV_ACCESS, "{}"))
    key_env = access_data.get("api_key_env")
    access = AccessPolicy(api_key=read_api_key(key_env) if key_env else None, api_key_env=key_env,
                          cors_origins=tuple(access_data.get("cors_origins", ())))
    marks = Path(os.environ.get(_ENV_READY, "")) if os.environ.get(_ENV_READY) else None
    try:
        app, _ = load_and_create(os.environ[_ENV_CHECKPOINT], device=os.environ.get(_ENV_DEVICE, "cpu"),
                                 limits=Limits(**limits_data), access=access)
    except Exception as exc:
        if marks is None or not marks.is_dir():
            raise
        # said once to the parent, which stops: uvicorn restarts a worker that fails any other way, forever
        (marks / f"failed-{os.getpid()}").write_text(str(exc) or type(exc).__name__, encoding="utf-8")
        sys.exit(_STARTUP_FAILURE)
    if marks is not None and marks.is_dir():
        (marks / f"ready-{os.getpid()}").touch()
    return app


#: The protocol classes :func:`protocol_class_from_env` made in this process, by their settings.
_ENV_PROTOCOLS: dict[str, type[GuardedH11Protocol]] = {}


def protocol_class_from_env() -> type[GuardedH11Protocol]:
    """The guarded protocol class with the connection limits named in the environment (the defaults where none are):
    one class per setting in a process."""
    settings = os.environ.get(_ENV_CONNECTIONS, "{}")
    if settings not in _ENV_PROTOCOLS:
        _ENV_PROTOCOLS[settings] = guarded_protocol(**json.loads(settings))
    return _ENV_PROTOCOLS[settings]


def protocol_from_env(*args: Any, **kwargs: Any) -> GuardedH11Protocol:
    """Protocol factory for multi-worker uvicorn (``http="cxrground.serve.run:protocol_from_env"``): a connection
    of :func:`protocol_class_from_env`'s class."""
    return protocol_class_from_env()(*args, **kwargs)


class BackgroundServer:
    """uvicorn serving ``app`` in a daemon thread on ``host`` and a free port; a context manager.

    ``url`` is known once :meth:`start` returns. :meth:`stop` asks the server to finish its open
    requests and waits at most ``stop_timeout`` seconds. Connections are guarded as by ``serve``, with
    ``idle_timeout``, ``send_timeout`` and ``max_connections`` (:func:`~cxrground.net.connections.guarded_protocol`);
    ``limit_concurrency`` (uvicorn's: open connections before 503; None: no such limit).
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, start_timeout: float = 20.0,
                 stop_timeout: float = 10.0, limit_concurrency: int | None = 16,
                 idle_timeout: float = IDLE_TIMEOUT_S, send_timeout: float = SEND_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                limit_concurrency=limit_concurrency, timeout_keep_alive=2,
                                http=guarded_protocol(idle_timeout, max_connections, send_timeout))
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="cxrground-serve", daemon=True)
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self.host = host
        self.port: int | None = None

    @property
    def url(self) -> str:
        """``http://host:port``."""
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://{self.host}:{self.port}"

    def start(self) -> BackgroundServer:
        """Start the thread and wait until the socket listens."""
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        self.port = int(self._server.servers[0].sockets[0].getsockname()[1])
        return self

    def stop(self) -> None:
        """Ask the server to exit and join the thread."""
        self._server.should_exit = True
        self._thread.join(self._stop_timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(self._stop_timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def load_and_create(checkpoint: str | Path, device: str = "cpu", limits: Limits | None = None,
                    access: AccessPolicy | None = None) -> tuple[Any, IlsModel]:
    """The app for ``checkpoint`` and its model (what ``serve`` runs), for tests and embedding."""
    from cxrground.serve.app import create_app

    model = load_model(checkpoint, device=device)
    return create_app(model, limits, checkpoint=checkpoint_id(checkpoint), access=access), model
