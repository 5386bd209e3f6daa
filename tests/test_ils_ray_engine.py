"""The Ray engine's connection and shutdown, and the run loop's bar and markers, without starting Ray (fakes)."""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
import types
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor

import pytest

from cxrground.errors import ConfigError
from cxrground.ils import build as build_mod
from cxrground.ils import ray_engine
from cxrground.ils.backend_spec import BackendSpec
from cxrground.ils.config import IlsConfig
from cxrground.ils.ray_engine import _connect, check_reachable, run_ray
from cxrground.ils.tasks import StudyTask


class _FakeRay:
    """What ``_connect`` and ``run_ray`` ask of the ``ray`` module."""

    def __init__(self, initialized: bool = False, error: Exception | None = None) -> None:
        self.initialized, self.error = initialized, error
        self.inits: list[dict] = []
        self.killed: list[object] = []
        self.shutdowns = 0

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **kwargs: object) -> None:
        self.inits.append(kwargs)
        if self.error is not None:
            raise self.error

    def kill(self, handle: object, no_restart: bool = False) -> None:
        self.killed.append(handle)

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_without_an_address_a_fresh_local_ray_is_started_not_a_cluster_of_this_node(monkeypatch):
    # ray.init() without an address joins a cluster that `ray start` runs on the node, and then refuses num_cpus
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fake = _FakeRay()
    assert _connect(fake, None, 2) is True
    assert fake.inits[0]["address"] == "local" and fake.inits[0]["num_cpus"] == 2


def test_a_ray_that_refuses_the_connection_is_one_error_naming_the_address_and_the_fix(monkeypatch):
    monkeypatch.setattr(ray_engine, "check_reachable", lambda address: None)
    fake = _FakeRay(error=ConnectionError("Failed to connect to Ray cluster at 10.0.0.9:6379"))
    with pytest.raises(ConfigError, match=r"cannot connect to the Ray cluster at 10\.0\.0\.9:6379 .*GCS port"):
        _connect(fake, "10.0.0.9:6379", 2)


def _serve_http() -> http.server.HTTPServer:
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    server.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[method-assign]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_port_that_is_not_a_ray_cluster_is_refused_at_once():
    # Ray retries such a port (the dashboard's, an HTTP server) for minutes; the check refuses it at the greeting
    server = _serve_http()
    try:
        for address in (f"127.0.0.1:{server.server_port}", f"ray://127.0.0.1:{server.server_port}"):
            with pytest.raises(ConfigError, match=r"answers, but not as a Ray cluster .*not the dashboard's"):
                check_reachable(address, timeout=5)
    finally:
        server.shutdown()
    with socket.socket() as silent:  # takes the connection, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        with pytest.raises(ConfigError, match="no answer to a gRPC greeting"):
            check_reachable(f"127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)


def test_a_grpc_port_passes_the_check():
    grpc = pytest.importorskip("grpc")
    server = grpc.server(ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        check_reachable(f"127.0.0.1:{port}", timeout=5)
        check_reachable(f"ray://127.0.0.1:{port}", timeout=5)
    finally:
        server.stop(None)


def test_ctrl_c_stops_the_ray_actors_before_the_driver_exits(monkeypatch, tmp_path):
    fake = _FakeRay(initialized=True)
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(**{n: getattr(fake, n) for n in
                                                                     ("is_initialized", "init", "kill", "shutdown")}))

    class Scheduler:
        def __init__(self, ray, *args, **kwargs):
            self.ray, self.actors = ray, {0: "actor-0", 1: "actor-1"}

        def run(self):
            raise KeyboardInterrupt

        close = ray_engine._Scheduler.close

    monkeypatch.setattr(ray_engine, "_Scheduler", Scheduler)
    with pytest.raises(KeyboardInterrupt):
        run_ray(iter([]), tmp_path, IlsConfig(), BackendSpec(), 2, None, None, None)
    assert fake.killed == ["actor-0", "actor-1"]


class _Bar:
    def __init__(self, **kwargs: object) -> None:
        self.closed = False

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _task(key: str) -> StudyTask:
    return StudyTask(study_key=key, subject_id="p1", dicom_id=key, image_path=f"/nowhere/{key}.png",
                     relative_image_path=f"{key}.png", split="train")


def test_the_progress_bar_is_closed_when_ctrl_c_stops_the_run(monkeypatch, tmp_path):
    # else its last repaint comes after the "Interrupted" line
    bars: list[_Bar] = []
    monkeypatch.setattr(build_mod, "progress_bar", lambda **kw: bars.append(_Bar()) or bars[-1])

    def interrupted(*args: object) -> tuple[str, str]:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_mod.run_units([_task("s1")], tmp_path, IlsConfig(), BackendSpec(), runner=interrupted)
    assert bars and bars[0].closed


def test_running_markers_an_earlier_run_left_are_removed_when_a_run_starts(tmp_path):
    # a pool stopped by Ctrl-C or killed leaves units/{study}.running, also of studies whose unit it wrote
    units = tmp_path / "units"
    units.mkdir()
    (units / "s1.json").write_text("{}")
    (units / "s1.running").write_text("4242")
    (units / "s2.running").write_text("4243")
    processed, skipped = build_mod.run_units([_task("s1")], tmp_path, IlsConfig(), BackendSpec(), progress=False)
    assert (processed, skipped) == (0, 1)
    assert sorted(p.name for p in units.iterdir()) == ["s1.json"]


@pytest.mark.parametrize("first_error", ["running", "waiting"])
def test_only_the_study_a_dead_ray_actor_was_running_counts_the_death(tmp_path, first_error):
    # an actor holds two studies and runs them in the order sent; the one waiting behind the study that killed it
    # used to count the death too, and after two deaths be recorded as failed with it
    sched = object.__new__(ray_engine._Scheduler)
    sched.ray, sched.out, sched.config, sched.spec, sched.bar = _FakeRay(), tmp_path, IlsConfig(), BackendSpec(), _Bar()
    sched.actors, sched.live, sched.nodes, sched.replacements_left = {0: "actor-0"}, {0: 2}, {0: "node"}, 1
    sched.retry, sched.deaths = deque(), Counter()
    sched._start_actor = lambda: None  # type: ignore[method-assign]
    running, waiting = _task("s1"), _task("s2")
    if first_error == "running":  # the error of one ref arrives first; the other is still in flight
        sched.inflight = {"ref-2": (waiting, 0, 1)}
        held = [(0, running), (1, waiting)]
    else:
        sched.inflight = {"ref-1": (running, 0, 0)}
        held = [(1, waiting), (0, running)]
    sched._died(0, held, RuntimeError("actor died"))
    assert sched.deaths == Counter({"s1": 1}) and not sched.inflight
    assert sorted(t.study_key for t in sched.retry) == ["s1", "s2"]
    assert sched.ray.killed == ["actor-0"]


def test_a_study_that_kills_its_ray_worker_is_recorded_and_the_others_finish(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    tasks = [_task("s1"), _task("s2"), _task("s3")]

    def killer(task, out, config, spec, max_pixels):
        """The worker dies under s1, as under the out-of-memory killer; the others write a unit at once."""
        import os

        from cxrground.ils.units import write_unit

        if task.study_key == "s1":
            os._exit(1)
        write_unit(out, {"study_key": task.study_key, "status": "ok"}, config, spec)
        return task.study_key, "ok"

    spec = BackendSpec(synthesizer="pseudo-normal")  # no fitted model to name
    processed, _ = build_mod.run_units(tasks, tmp_path, IlsConfig(), spec, "ray", 1, progress=False, runner=killer)
    assert processed == 3
    status = {t.study_key: json.loads((tmp_path / "units" / f"{t.study_key}.json").read_text()) for t in tasks}
    assert status["s1"]["status"] == "failed" and "worker died" in status["s1"]["reason"]
    assert status["s2"]["status"] == status["s3"]["status"] == "ok"
