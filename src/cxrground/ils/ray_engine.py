"""The Ray engine of the ILS build: a pool of actors on a local Ray instance or an existing cluster.

Each actor loads the backends once (its state) from the build's settings, which are put in the object store once;
the driver hands out studies one at a time, at most :data:`~cxrground.ils.units.IN_FLIGHT_PER_WORKER` per actor, so
it holds a bounded number of tasks and object refs whatever the cohort size, and each ``ray.wait`` looks at that
bounded set only. An actor whose process or node dies is replaced; the studies it had in flight are handed to the
others, and a study whose actor died under it twice is recorded as failed ("worker died"), as the local engine does
(only the study an actor was running counts its death, not those queued behind it).

The actors write the study's masks and unit file themselves, under the build's output folder: every node must see
that folder (a shared file system mounted at the same path). The registrations of the build's backends go with the
settings (:func:`ray_registrations`), so a backend registered at run time, even in an interactive session, is known
to the actors; a module it is imported from must be importable on every node (e.g. from the shared file system).
"""

from __future__ import annotations

import logging
import os
import sys
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError, CXRGroundError
from cxrground.ils.backend_spec import BackendSpec
from cxrground.ils.config import IlsConfig
from cxrground.ils.tasks import StudyTask

__all__ = ["STORE_LOCATION_VARS", "StudyWorker", "actor_env", "gpu_backends", "gpus_per_worker", "ray_registrations",
           "run_ray"]


def gpu_backends() -> dict[str, frozenset[str]]:
    """The backends of each stage of a :class:`BackendSpec` that run on a GPU when one is there (registered with
    ``gpu=True``; their ``device=cpu`` option keeps them on the CPU)."""
    from cxrground.anatomy.segment import SEGMENTERS
    from cxrground.ils.spatial import DETECTORS, SYNTHESIZERS

    registries = {"segmenter": SEGMENTERS, "synthesizer": SYNTHESIZERS, "detector": DETECTORS,
                  "qc_segmenter": SEGMENTERS}
    return {stage: frozenset(name for name in reg if reg.get(name).gpu) for stage, reg in registries.items()}


_LOG = logging.getLogger(__name__)

#: Times a study's actor may die under it before the study is recorded as failed ("worker died").
MAX_ATTEMPTS = 2


def gpus_per_worker(spec: BackendSpec) -> int:
    """1 when a backend of ``spec`` runs on a GPU (:func:`gpu_backends`, unless its ``device`` option is ``cpu``),
    else 0."""
    for stage, names in gpu_backends().items():
        name = getattr(spec, stage)
        kwargs = getattr(spec, f"{stage}_kwargs") or {}
        if name in names and str(kwargs.get("device", "cuda")).lower() != "cpu":
            return 1
    return 0


def ray_registrations(spec: BackendSpec) -> bytes:
    """The registrations of the backends ``spec`` names (:func:`~cxrground.ils.pipeline.backend_registrations`),
    serialized for the actors by Ray's cloudpickle, which copies what an interactive session defines; a
    :class:`ConfigError` names one that cannot be serialized. Empty without the ``ray`` package (:func:`run_ray`
    refuses the build)."""
    from cxrground.ils.pipeline import backend_registrations

    try:
        from ray import cloudpickle
    except ImportError:
        return b""
    return cloudpickle.dumps(backend_registrations(spec, cloudpickle.dumps))


class StudyWorker:
    """A Ray actor's state: the build's settings and backends, loaded once; :meth:`run` processes one study.

    The settings end with the driver's ``sys.path`` and :func:`ray_registrations`: the folders of the driver's
    ``sys.path`` the actor lacks are added to its own (last) before the registrations are read, so that a module
    the driver imports a backend from is found where the same folder exists."""

    def __init__(self, settings: tuple[str, IlsConfig, BackendSpec, int | None, Any, tuple[str, ...], bytes, bool]
                 ) -> None:
        from cxrground.ils.pipeline import get_backends, install_registrations, note_retries, worker_note
        from cxrground.ils.units import init_worker

        self.out, self.config, self.spec, self.max_pixels, self.runner, paths, registrations, notes = settings
        init_worker(1)
        if notes:
            note_retries(worker_note)
        sys.path.extend(p for p in paths if p not in sys.path)
        if registrations:
            from ray import cloudpickle

            install_registrations(cloudpickle.loads(registrations))  # those registered at run time on the driver
        get_backends(self.spec)  # once per actor, before the first study

    def ready(self) -> str:
        """The id of the Ray node this actor runs on, once its backends are loaded."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def run(self, task: StudyTask) -> tuple[tuple[str, str], dict[str, int]]:
        """Process one study and write its unit; returns ((study, status), what the study added to the structurer's
        counters) (:func:`~cxrground.ils.units.counted_run`)."""
        from cxrground.ils.units import counted_run

        return counted_run(self.runner, task, self.out, self.config, self.spec, self.max_pixels)


#: Seconds to wait for a TCP connection to a given Ray address before the build is refused.
CONNECT_TIMEOUT_S = 10.0


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`ConfigError` when ``address`` (``HOST:PORT``, ``ray://HOST:PORT``, or ``auto``: the cluster
    ``ray start`` started on this node, as Ray finds it) takes no TCP connection within ``timeout`` seconds, answers
    but not as a gRPC server (Ray's ports are gRPC; unless ``RAY_USE_TLS``, where only the connection is checked),
    or when ``auto`` finds no cluster. Ray itself retries such addresses for minutes."""
    import socket
    from urllib.parse import urlsplit

    if address.startswith("local"):
        return
    if address == "auto":
        found = _auto_address()
        if found is None:
            return
        address = found
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ConfigError(f"--ray-address {address!r} is not HOST:PORT or ray://HOST:PORT ({exc})") from exc
    if not host or port is None:
        raise ConfigError(f"--ray-address {address!r} is not HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            answer = None if _uses_tls() else _grpc_answer(conn)
    except OSError as exc:
        raise ConfigError(f"cannot reach the Ray cluster at {address} within {timeout:g} s ({exc.strerror or exc}); "
                          "is its head node running (ray start --head) and the port open?") from exc
    if answer is not None:
        raise ConfigError(f"{address} answers, but not as a Ray cluster ({answer}); give the head node's GCS port "
                          "(HOST:6379 unless ray start --head was given another --port) or its Ray client port as "
                          "ray://HOST:10001, not the dashboard's (8265)")


#: What an HTTP/2 client sends first (RFC 9113 §3.4): the preface and an empty SETTINGS frame.
_H2_PREFACE: Final[bytes] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _uses_tls() -> bool:
    """Whether Ray talks TLS (``RAY_USE_TLS``), so that a plain HTTP/2 greeting cannot tell a Ray port."""
    return os.environ.get("RAY_USE_TLS", "").strip().lower() in ("1", "true")


def _grpc_answer(conn: Any) -> str | None:
    """None when the server on ``conn`` answers an HTTP/2 greeting as every gRPC server does (a Ray head node's GCS
    and Ray client ports are gRPC), its SETTINGS frame first; else what it did instead. Ray itself would retry such
    a port for minutes."""
    try:
        conn.sendall(_H2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = conn.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except TimeoutError:
        return "no answer to a gRPC greeting"
    except OSError as exc:
        return f"the connection failed: {exc.strerror or exc}"
    if len(head) == 9 and head[3] == 4:  # an HTTP/2 frame header of type SETTINGS
        return None
    return "it closed the connection at a gRPC greeting" if not head else "not a gRPC server"


def _auto_address() -> str | None:
    """The ``HOST:PORT`` that ``ray.init(address="auto")`` connects to, found as Ray finds it (the cluster ``ray
    start`` recorded on this node, else the one running here); None when this Ray offers no way to ask (Ray then
    says itself). No cluster, or several, is a :class:`ConfigError`."""
    try:
        from ray._private.services import canonicalize_bootstrap_address_or_die
    except ImportError:
        return None
    try:
        return str(canonicalize_bootstrap_address_or_die("auto"))
    except ConnectionError as exc:
        several = "multiple" in str(exc)
        raise ConfigError("--ray-address auto: " + (
            "several Ray clusters run on this node; give one as --ray-address HOST:PORT" if several else
            "no Ray cluster runs on this node; start one (ray start --head), or give the head node as "
            "--ray-address HOST:PORT")) from exc
    except (ValueError, OSError):
        return None  # a recorded address Ray cannot parse: ray.init names it


#: Where object storage is (endpoints, region, profile, emulator, key file path), passed from the driver to the Ray
#: actors so they read and write the store the driver checked. Secrets (keys, tokens, API keys) are not passed: Ray
#: records a job's environment in its cluster metadata, so they come from the nodes' own environment or roles.
STORE_LOCATION_VARS: Final[tuple[str, ...]] = (
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE",
    "FSSPEC_S3_ENDPOINT_URL", "STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT", "GOOGLE_APPLICATION_CREDENTIALS",
)


def actor_env() -> dict[str, str]:
    """The environment variables the Ray actors get: one thread each, and the driver's object-storage location
    settings (:data:`STORE_LOCATION_VARS`) that are set."""
    return {"OMP_NUM_THREADS": "1", **{k: os.environ[k] for k in STORE_LOCATION_VARS if os.environ.get(k)}}


def _connect(ray: Any, address: str | None, workers: int) -> bool:
    """Connect to ``address`` (or ``RAY_ADDRESS``), else start a new local Ray instance (``address='local'``: not a
    cluster that ``ray start`` runs on this node, which ``ray.init()`` would join, refusing ``num_cpus``); True
    when this call started or joined one. Ray's refusal of the address is a :class:`ConfigError` naming it."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    env = {"env_vars": actor_env()}
    if not address:  # "local": a fresh instance, never a cluster that `ray start` left on this node
        ray.init(address="local", num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False,
                 runtime_env=env, logging_level=logging.WARNING)
        return True
    check_reachable(address)
    try:
        ray.init(address=address, log_to_driver=False, runtime_env=env, logging_level=logging.WARNING)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"cannot connect to the Ray cluster at {address} ({exc}); give the head node's GCS port "
                          "(HOST:6379 unless ray start --head was given another --port) or its Ray client port as "
                          "ray://HOST:10001, and use on this machine the Ray and Python versions of the cluster"
                          ) from exc
    return True


def run_ray(todo: Iterator[StudyTask], out: str | Path, config: IlsConfig, spec: BackendSpec, workers: int, bar: Any,
            max_pixels: int | None, runner: Any, address: str | None = None, counts: Counter | None = None,
            notes: bool = False) -> None:
    """Process the studies of ``todo`` on ``workers`` Ray actors (see the module docstring); the actors' structurer
    counters are added to ``counts``, and with ``notes`` their retry notes go to their stderr (which Ray forwards)."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--engine ray needs the 'ray' package: pip install 'cxrground[ray]'") from exc
    started = _connect(ray, address, workers)
    scheduler = None
    try:
        scheduler = _Scheduler(ray, todo, out, config, spec, max(1, workers), bar, max_pixels, runner,
                               Counter() if counts is None else counts, notes)
        scheduler.run()
    finally:  # also on Ctrl-C or an error: the actors stop now, not when they next notice the driver is gone
        if scheduler is not None:
            scheduler.close()
        if started:
            ray.shutdown()


class _Scheduler:
    """The driver's side of a Ray build: actors, the studies in flight on each, retries after a death."""

    def __init__(self, ray: Any, todo: Iterator[StudyTask], out: str | Path, config: IlsConfig, spec: BackendSpec,
                 workers: int, bar: Any, max_pixels: int | None, runner: Any, counts: Counter,
                 notes: bool = False) -> None:
        from cxrground.ils.units import IN_FLIGHT_PER_WORKER

        self.ray, self.todo, self.out, self.config, self.spec, self.bar = ray, todo, out, config, spec, bar
        self.counts = counts
        self.per_actor = IN_FLIGHT_PER_WORKER
        # shipped once, shared by every actor
        settings = ray.put((str(out), config, spec, max_pixels, runner, tuple(sys.path), ray_registrations(spec),
                            notes))
        self.actor_class = ray.remote(StudyWorker).options(num_cpus=1, num_gpus=gpus_per_worker(spec),
                                                           max_restarts=0, max_task_retries=0)
        self.settings = settings
        self.workers = workers
        self.replacements_left = 10 * workers
        self.starting: dict[Any, int] = {}      # ready() ref -> actor slot
        self.actors: dict[int, Any] = {}        # slot -> handle (started or starting)
        self.live: dict[int, int] = {}          # slot -> studies in flight (started actors only)
        self.nodes: dict[int, str] = {}         # slot -> Ray node id (started actors only)
        self.inflight: dict[Any, tuple[StudyTask, int, int]] = {}  # ref -> (study, actor slot, order sent)
        self.sent = 0
        self.retry: deque[StudyTask] = deque()
        self.deaths: Counter = Counter()
        self.exhausted = False
        self.ever_ready = False
        self.next_slot = 0
        for _ in range(workers):
            self._start_actor()

    def _start_actor(self) -> None:
        slot, self.next_slot = self.next_slot, self.next_slot + 1
        handle = self.actor_class.remote(self.settings)
        self.actors[slot] = handle
        self.starting[handle.ready.remote()] = slot

    def _next_task(self) -> StudyTask | None:
        if self.retry:
            return self.retry.popleft()
        if self.exhausted:
            return None
        task = next(self.todo, None)
        self.exhausted = task is None
        return task

    def _dispatch(self) -> None:
        for slot in list(self.live):
            while self.live[slot] < self.per_actor:
                task = self._next_task()
                if task is None:
                    return
                self.inflight[self.actors[slot].run.remote(task)] = (task, slot, self.sent)
                self.sent += 1
                self.live[slot] += 1
                _LOG.debug("study %s sent to Ray worker %d on node %s", task.study_key, slot, self.nodes[slot])

    def _lose(self, slot: int) -> None:
        """Forget a dead actor and start another in its place (within a budget, so a crash loop ends)."""
        if slot not in self.actors:
            return
        handle = self.actors.pop(slot)
        self.live.pop(slot, None)
        self.nodes.pop(slot, None)
        self.ray.kill(handle, no_restart=True)
        if self.replacements_left <= 0:
            if not self.actors:
                raise ConfigError("every Ray worker died and the replacement budget is spent; see the Ray logs")
            return
        self.replacements_left -= 1
        self._start_actor()

    def close(self) -> None:
        """Stop every actor (those still starting included), with the study it is processing."""
        for handle in self.actors.values():
            try:
                self.ray.kill(handle, no_restart=True)
            except Exception:
                _LOG.debug("Ray worker already gone", exc_info=True)
        self.actors.clear()

    def run(self) -> None:
        """Until every study is done or recorded."""
        from ray.exceptions import RayError, RayTaskError


        while True:
            self._dispatch()
            if not self.inflight and self.exhausted and not self.retry:
                break
            done, _ = self.ray.wait([*self.inflight, *self.starting], num_returns=1)
            ref = done[0]
            if ref in self.starting:
                slot = self.starting.pop(ref)
                try:
                    node = self.ray.get(ref)
                except RayError as exc:
                    if not self.ever_ready:  # no actor has started at all: the backends cannot load, say why
                        raise ConfigError(f"a Ray worker could not start (loading the backends): {exc}") from exc
                    self._lose(slot)
                    continue
                self.ever_ready = True
                if slot in self.actors:
                    self.live[slot] = 0
                    self.nodes[slot] = node
                continue
            task, slot, order = self.inflight.pop(ref)
            if slot in self.live:
                self.live[slot] -= 1
            try:
                self.counts.update(self.ray.get(ref)[1])
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, CXRGroundError):
                    raise cause from None  # one line, as the local engine says it, not Ray's wrapped traceback
                raise
            except RayError as exc:  # the actor's process or node died under the study
                self._died(slot, [(order, task), *((o, t) for t, s, o in self.inflight.values() if s == slot)], exc)
                continue
            self.bar.update()

    def _died(self, slot: int, held: list[tuple[int, StudyTask]], exc: Exception) -> None:
        """The actor of ``slot`` died holding the studies ``held`` ((order sent, study)). An actor runs its studies
        one at a time in the order they were sent, so the first of them without a unit was the one running: it
        counts a death (recorded as failed at :data:`MAX_ATTEMPTS`); the others waited behind it and are handed out
        again as they are, so that a study that kills its worker does not take the study queued behind it along."""
        from cxrground.ils.units import has_unit, record_worker_death

        self._lose(slot)
        studies = {t.study_key for _, t in held}
        for ref in [r for r, (t, _, _) in self.inflight.items() if t.study_key in studies]:
            del self.inflight[ref]
        running = None
        for _, task in sorted(held, key=lambda item: item[0]):
            if has_unit(self.out, task.study_key):
                self.bar.update()  # it finished just before
            elif running is not None:
                _LOG.debug("study %s was waiting on the lost Ray worker; handed out again", task.study_key)
                self.retry.append(task)
            else:
                running = task
        if running is None:
            return
        self.deaths[running.study_key] += 1
        _LOG.warning("Ray worker lost under study %s (attempt %d): %s", running.study_key,
                     self.deaths[running.study_key], type(exc).__name__)
        if self.deaths[running.study_key] >= MAX_ATTEMPTS:
            record_worker_death(self.out, running, self.config, self.spec)
            self.bar.update()
        else:
            self.retry.append(running)
