"""How ``cxrground serve`` starts: a port that cannot be listened on is refused before the model loads, and with
``--workers N`` the server says it serves only once every worker has loaded its model, and stops (instead of
restarting workers forever) when a worker cannot load it."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
import uvicorn
from click.testing import CliRunner

import cxrground.serve.run as run
from cxrground.cli import main
from cxrground.errors import ConfigError
from cxrground.net.connections import check_port

ENV = ("CXRGROUND_SERVE_CHECKPOINT", "CXRGROUND_SERVE_DEVICE", "CXRGROUND_SERVE_LIMITS", "CXRGROUND_SERVE_ACCESS",
       "CXRGROUND_SERVE_CONNECTIONS", "CXRGROUND_SERVE_READY_DIR")


@pytest.fixture
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _checkpoint(folder: Path) -> Path:
    (folder / "checkpoint.json").write_text('{"model": "baseline"}')
    return folder


def test_a_port_in_use_is_refused_before_the_model_is_loaded(clean_env, tmp_path) -> None:
    loaded: list[str] = []
    clean_env.setattr(run, "load_and_create", lambda *a, **kw: loaded.append("model") or (None, None))
    clean_env.setattr(uvicorn, "run", lambda *a, **kw: loaded.append("uvicorn"))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for workers in ("1", "2"):
            result = CliRunner().invoke(main, ["serve", "--checkpoint", str(_checkpoint(tmp_path)), "--port",
                                               str(port), "--workers", workers])
            assert result.exit_code == 1, result.output
            assert f"cannot listen on 127.0.0.1:{port}" in result.output and "--port" in result.output
            assert "serving" not in result.output
    assert loaded == []
    with pytest.raises(ConfigError, match=r"cannot listen on 203\.0\.113\.9:"):  # an address of another machine
        check_port("203.0.113.9", port)
    check_port("127.0.0.1", port)  # free again


def test_workers_are_announced_once_every_one_has_loaded_its_model(clean_env, tmp_path) -> None:
    _checkpoint(tmp_path)
    clean_env.setattr(run, "load_and_create", lambda *a, **kw: ("app", None))
    said = threading.Event()
    seen: list[bool] = []

    def workers_start(*args, **kwargs):  # what uvicorn's two worker processes do, one after the other
        assert kwargs["timeout_worker_healthcheck"] == run.WORKER_HEALTHCHECK_S
        assert run.app_from_env() == "app"  # the first worker has its model
        seen.append(said.wait(1.0))
        marks = Path(run.os.environ["CXRGROUND_SERVE_READY_DIR"])
        (marks / "ready-99999").touch()  # and the second
        seen.append(said.wait(5.0))

    clean_env.setattr(uvicorn, "run", workers_start)
    run.serve(tmp_path, port=0, workers=2, on_ready=said.set)
    assert seen == [False, True]
    assert "CXRGROUND_SERVE_READY_DIR" not in run.os.environ


def test_a_worker_that_cannot_load_the_model_stops_the_server_with_its_reason(clean_env, tmp_path) -> None:
    _checkpoint(tmp_path)

    def broken(*a, **kw):
        raise ConfigError("weights.safetensors: not a readable safetensors file")

    clean_env.setattr(run, "load_and_create", broken)
    said: list[str] = []
    exits: list[int] = []

    def workers_start(*args, **kwargs):
        with pytest.raises(SystemExit) as stopped:  # uvicorn's STARTUP_FAILURE: the parent stops, not restarts
            run.app_from_env()
        exits.append(stopped.value.code)

    clean_env.setattr(uvicorn, "run", workers_start)
    with pytest.raises(ConfigError, match=r"workers could not load .*not a readable safetensors file"):
        run.serve(tmp_path, port=0, workers=2, on_ready=lambda: said.append("serving"))
    assert exits == [3] and said == []
    with pytest.raises(ConfigError, match="not a readable"):  # outside a multi-worker server: the error itself
        run.app_from_env()


def test_the_announcer_waits_for_every_worker(tmp_path) -> None:
    said = threading.Event()
    stop = threading.Event()
    thread = run._announce_when_ready(tmp_path, 2, said.set, stop)
    (tmp_path / "ready-1").touch()
    (tmp_path / "failed-2").touch()
    assert not said.wait(0.6)
    (tmp_path / "ready-3").touch()
    assert said.wait(5)
    thread.join(5)
    stop.set()


def test_review_serve_refuses_a_port_in_use_before_saying_where_it_listens(clean_env, tmp_path) -> None:
    from cxrground.review import app as review_app
    from cxrground.review.db import ReviewDB

    started: list[int] = []
    clean_env.setattr(review_app, "serve", lambda *a, **kw: started.append(1))
    db = tmp_path / "r.sqlite"
    ReviewDB.create(db).add_user("a")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = CliRunner().invoke(main, ["review", "serve", "--db", str(db), "--port", str(port)])
    assert result.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in result.output, result.output
    assert "review app for" not in result.output and started == []
    result = CliRunner().invoke(main, ["review", "serve", "--db", str(db), "--port", str(port)])
    assert result.exit_code == 0 and "review app for" in result.output and started == [1], result.output
