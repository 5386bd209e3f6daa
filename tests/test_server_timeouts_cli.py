"""The connection limits of both servers from the command line (``--idle-timeout``, ``--body-timeout``,
``--send-timeout``, ``--max-connections`` of ``cxrground serve`` and ``cxrground review serve``): parsing and
validation, the values reaching the protocol and the app, short timeouts closing idle and non-reading clients on
real sockets (127.0.0.1), and two servers with different limits in one process leaving each other alone.

Each server is started by the command itself; only the final blocking ``uvicorn.run`` / ``uvicorn.Server.run`` is
replaced by one that keeps the configuration, which the test then runs in a thread and stops."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")

import httpx
import uvicorn
from click.testing import CliRunner
from uvicorn.importer import import_from_string

import cxrground.serve.run as run
from cxrground.cli import main
from cxrground.errors import OptionValueError
from cxrground.net.connections import (
    BODY_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS,
    SEND_TIMEOUT_S,
    BodyDeadline,
    GuardedH11Protocol,
    guarded_protocol,
)
from cxrground.review.db import ReviewDB
from cxrground.serve.app import create_app
from cxrground.serve.limits import Limits
from cxrground.serve.request import ServeRequest
from cxrground.testing.servers import (
    closed_by_server,
    read_until_closed,
    response_length,
    server_thread,
    small_window_socket,
    wait_for_bytes,
    wait_for_log,
)
from serve_helpers import ThresholdModel, png_bytes

DROPPED = "dropped the connection of"
_REAL_SERVER = uvicorn.Server


@dataclass
class Started:
    """What one command would have run: its uvicorn configuration, and the arguments that built its app."""

    config: Any
    app_kwargs: dict[str, Any]

    @property
    def protocol(self) -> type[GuardedH11Protocol]:
        return self.config.http

    def body_timeout(self) -> float:
        return next(m.kwargs["timeout"] for m in self.config.app.user_middleware if m.cls is BodyDeadline)


@dataclass
class Commands:
    """``start(command, *options) -> (exit code, output, Started | None)`` for ``serve`` and ``review``: the command
    runs up to the point where uvicorn would take over (on 127.0.0.1, port 0); ``review`` serves ``db`` (its one
    reviewer's token: ``token``)."""

    start: Any
    db: ReviewDB
    token: str


@pytest.fixture()
def commands(monkeypatch, tmp_path) -> Commands:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "checkpoint.json").write_text('{"model": "baseline"}')
    db_path = tmp_path / "r.sqlite"
    db = ReviewDB.create(db_path)
    token = db.add_user("alice")[1]
    started: list[Started] = []
    app_kwargs: dict[str, Any] = {}

    def load_and_create(path, **kw):
        app_kwargs.clear()
        app_kwargs.update(kw)
        return create_app(ThresholdModel(), kw.get("limits")), None

    def uvicorn_run(app, **kw):
        kw["log_level"] = "warning"
        started.append(Started(uvicorn.Config(app, lifespan="off", **kw), dict(app_kwargs)))

    class CapturingServer:
        def __init__(self, config) -> None:
            self.config = config

        def run(self) -> None:
            started.append(Started(self.config, {}))

    monkeypatch.setattr(run, "load_and_create", load_and_create)
    monkeypatch.setattr(uvicorn, "run", uvicorn_run)
    monkeypatch.setattr(uvicorn, "Server", CapturingServer)

    def start(command: str, *options: str) -> tuple[int, str, Started | None]:
        before = len(started)
        if command == "serve":
            args = ["serve", "--checkpoint", str(checkpoint), "--port", "0", *options]
        else:
            args = ["review", "serve", "--db", str(db_path), "--port", "0", *options]
        res = CliRunner().invoke(main, args)
        return res.exit_code, res.output, started[-1] if len(started) > before else None

    return Commands(start, db, token)


@contextlib.contextmanager
def running(started: Started) -> Iterator[tuple[int, list[logging.LogRecord]]]:
    """Run the captured configuration in a thread; yields (port, records of uvicorn's error log)."""
    with server_thread(_REAL_SERVER(started.config), "timeouts-loop") as running_server:
        yield running_server


def _seconds_until_closed(sock: socket.socket) -> float | None:
    """Seconds until the server closed ``sock`` (None: still open after the socket's timeout)."""
    t0 = time.monotonic()
    return time.monotonic() - t0 if closed_by_server(sock) else None


BAD_VALUES = [("--idle-timeout", "0"), ("--idle-timeout", "-1"), ("--body-timeout", "inf"),
              ("--send-timeout", "nan"), ("--send-timeout", "abc"), ("--max-connections", "0"),
              ("--max-connections", "1.5")]


@pytest.mark.parametrize("command", ["serve", "review"])
@pytest.mark.parametrize(("flag", "value"), BAD_VALUES)
def test_a_bad_value_is_a_usage_error_naming_the_option(commands, command, flag, value) -> None:
    code, output, started = commands.start(command, flag, value)
    assert code == 2, output
    assert "Error: Invalid value" in output and flag in output and started is None
    if value in ("inf", "nan"):
        assert f"{flag} must be a positive finite number of seconds, got {value}" in output


@pytest.mark.parametrize("command", ["serve", "review"])
def test_the_options_reach_the_protocol_and_the_app(commands, command) -> None:
    code, output, started = commands.start(command, "--idle-timeout", "0.5", "--body-timeout", "7",
                                           "--send-timeout", "2.5", "--max-connections", "50")
    assert code == 0, output
    assert started is not None
    protocol = started.protocol
    assert issubclass(protocol, GuardedH11Protocol) and protocol is not GuardedH11Protocol
    assert (protocol.idle_timeout, protocol.send_timeout, protocol.max_connections) == (0.5, 2.5, 50)
    assert started.body_timeout() == 7.0
    if command == "serve":
        assert started.app_kwargs["limits"].body_timeout_s == 7.0


@pytest.mark.parametrize("command", ["serve", "review"])
def test_without_the_options_the_defaults_hold(commands, command) -> None:
    code, output, started = commands.start(command)
    assert code == 0, output
    assert started is not None and started.protocol is GuardedH11Protocol
    assert (GuardedH11Protocol.idle_timeout, GuardedH11Protocol.send_timeout, GuardedH11Protocol.max_connections) \
        == (IDLE_TIMEOUT_S, SEND_TIMEOUT_S, MAX_CONNECTIONS) == (10.0, 30.0, 1000)
    assert started.body_timeout() == (Limits().body_timeout_s if command == "serve" else BODY_TIMEOUT_S)
    help_text = CliRunner().invoke(main, ["serve", "--help"] if command == "serve" else ["review", "serve", "--help"])
    for flag in ("--idle-timeout", "--body-timeout", "--send-timeout", "--max-connections"):
        assert flag in help_text.output


def test_serve_announces_serving_only_once_the_model_is_loaded(commands, monkeypatch) -> None:
    from cxrground.errors import InputError

    code, output, started = commands.start("serve")
    assert code == 0 and started is not None and "serving " in output

    def broken(path, **kw):
        raise InputError("not a readable safetensors file (a truncated copy?)", Path(path) / "weights.safetensors")

    monkeypatch.setattr(run, "load_and_create", broken)
    code, output, started = commands.start("serve")
    assert code == 1 and started is None and "not a readable safetensors file" in output
    assert "serving " not in output and "Traceback" not in output


def test_the_requests_refuse_what_the_command_line_refuses() -> None:
    from cxrground.net.limits import ConnectionLimits

    with pytest.raises(OptionValueError, match="--send-timeout must be a positive finite number of seconds"):
        ConnectionLimits(send_timeout=float("inf"))
    with pytest.raises(OptionValueError, match="--idle-timeout"):
        ServeRequest(checkpoint=Path("x"), idle_timeout=0.0)
    with pytest.raises(OptionValueError, match="--max-connections"):
        ServeRequest(checkpoint=Path("x"), max_connections=0)
    with pytest.raises(ValueError):
        guarded_protocol(idle_timeout=float("inf"))
    with pytest.raises(ValueError):
        Limits(body_timeout_s=float("nan"))


@pytest.mark.parametrize("command", ["serve", "review"])
def test_a_short_idle_timeout_closes_a_silent_connection_and_the_default_keeps_it(commands, command) -> None:
    code, output, short = commands.start(command, "--idle-timeout", "0.5")
    assert code == 0 and short is not None, output
    code, output, default = commands.start(command)
    assert code == 0 and default is not None, output
    with running(short) as (short_port, _), running(default) as (default_port, _):
        quick = socket.create_connection(("127.0.0.1", short_port), timeout=5)
        kept = socket.create_connection(("127.0.0.1", default_port), timeout=1.5)
        try:
            took = _seconds_until_closed(quick)
            assert took is not None and 0.3 <= took < 3.0, took
            assert not closed_by_server(kept)  # still open after 1.5 s: the default is 10 s
        finally:
            quick.close()
            kept.close()


def _big_image_request(db: ReviewDB, token: str, folder: Path) -> bytes:
    """A request for an 8 MB image of the database's one reviewer: more than the kernel's socket buffers hold."""
    big = folder / "big.png"
    big.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(8 * 1024 * 1024))
    db.add_and_assign([{"kind": "ils", "key": "big", "lesion": "effusion", "item_type": "basic", "positive": False,
                        "source": str(folder), "height": 1, "width": 1, "payload": {}, "mask": None,
                        "images": [{"path": str(big), "role": "png", "label": "big"}]}], 1)
    own = db.assignments()[-1].id
    return (f"GET /api/assignments/{own}/image/0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n"
            ).encode()


def _big_segment_request() -> bytes:
    """A raw multipart ``/v1/segment`` request whose answer is about 10 MB of JSON (a noise image: its overlay and
    PNGs barely compress)."""
    pixels = np.random.default_rng(0).integers(0, 256, (1536, 1536), dtype=np.uint8)
    request = httpx.Request("POST", "http://x/v1/segment?overlay=true&include_image=true",
                            files={"image": ("x.png", png_bytes(pixels))},
                            data={"instruction": "Segment the effusion."})
    body = request.read()
    head = (f"POST /v1/segment?overlay=true&include_image=true HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: {request.headers['content-type']}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


@pytest.mark.parametrize("command", ["serve", "review"])
def test_a_short_send_timeout_drops_a_client_that_never_reads(commands, command, tmp_path) -> None:
    request = _big_segment_request() if command == "serve" else _big_image_request(commands.db, commands.token,
                                                                                    tmp_path)
    code, output, started = commands.start(command, "--send-timeout", "0.5")
    assert code == 0 and started is not None, output
    with running(started) as (port, records):
        stalled = small_window_socket(port)
        try:
            stalled.sendall(request)
            sent = time.time()
            assert wait_for_bytes(stalled, 20), "the answer never started"
            dropped = wait_for_log(records, DROPPED, 8)
            assert dropped is not None, "the non-reading client was never dropped"
            assert 0.4 <= dropped.created - sent < 5.0 and "send timeout 0.5 s" in dropped.getMessage()
            got = read_until_closed(stalled, 8)
            assert got is not None, "the server did not close the connection"
            assert got.startswith(b"HTTP/1.1 200") and len(got) < response_length(got), len(got)  # cut short
        finally:
            stalled.close()


def test_two_servers_with_different_limits_in_one_process_keep_their_own(commands) -> None:
    code, output, serve_started = commands.start("serve", "--idle-timeout", "0.5", "--send-timeout", "1")
    assert code == 0 and serve_started is not None, output
    code, output, review_started = commands.start("review", "--idle-timeout", "2.5", "--send-timeout", "2")
    assert code == 0 and review_started is not None, output
    fast, slow = serve_started.protocol, review_started.protocol
    assert fast is not slow and fast.send_log is not slow.send_log
    assert (fast.idle_timeout, fast.send_timeout, slow.idle_timeout, slow.send_timeout) == (0.5, 1.0, 2.5, 2.0)
    with running(serve_started) as (fast_port, _), running(review_started) as (slow_port, _):
        to_fast = socket.create_connection(("127.0.0.1", fast_port), timeout=5)
        to_slow = socket.create_connection(("127.0.0.1", slow_port), timeout=1.5)
        try:
            t0 = time.monotonic()
            assert closed_by_server(to_fast) and time.monotonic() - t0 < 2.0
            assert not closed_by_server(to_slow)  # 1.5 s and more: the other server's 0.5 s did not reach it
            to_slow.settimeout(5)
            assert closed_by_server(to_slow)
            assert 2.0 <= time.monotonic() - t0 < 6.0
        finally:
            to_fast.close()
            to_slow.close()
    # the shared class and the defaults are untouched
    assert (GuardedH11Protocol.idle_timeout, GuardedH11Protocol.send_timeout, GuardedH11Protocol.max_connections) \
        == (IDLE_TIMEOUT_S, SEND_TIMEOUT_S, MAX_CONNECTIONS)
    assert guarded_protocol() is GuardedH11Protocol


def test_workers_get_the_limits_through_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("CXRGROUND_SERVE_CONNECTIONS", raising=False)
    for name in ("CXRGROUND_SERVE_CHECKPOINT", "CXRGROUND_SERVE_DEVICE", "CXRGROUND_SERVE_LIMITS",
                 "CXRGROUND_SERVE_ACCESS"):
        monkeypatch.delenv(name, raising=False)
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: calls.append(kw))
    (tmp_path / "checkpoint.json").write_text('{"model": "baseline"}')
    res = CliRunner().invoke(main, ["serve", "--checkpoint", str(tmp_path), "--workers", "2", "--idle-timeout", "3",
                                    "--send-timeout", "4", "--max-connections", "5", "--body-timeout", "6"])
    assert res.exit_code == 0, res.output
    http = calls[-1]["http"]
    assert isinstance(http, str)  # a class made for these limits cannot be pickled into the workers
    assert import_from_string(http) is run.protocol_from_env
    cls = run.protocol_class_from_env()
    assert (cls.idle_timeout, cls.send_timeout, cls.max_connections) == (3.0, 4.0, 5)
    assert run.protocol_class_from_env() is cls
    assert '"body_timeout_s": 6.0' in os.environ["CXRGROUND_SERVE_LIMITS"]
    monkeypatch.delenv("CXRGROUND_SERVE_CONNECTIONS")
    assert run.protocol_class_from_env() is GuardedH11Protocol


def test_serve_refuses_a_folder_that_is_no_checkpoint_before_announcing_itself(tmp_path) -> None:
    result = CliRunner().invoke(main, ["serve", "--checkpoint", str(tmp_path), "--port", "18999"])
    assert result.exit_code != 0 and "not a cxrground checkpoint" in result.output
    assert "serving" not in result.output
