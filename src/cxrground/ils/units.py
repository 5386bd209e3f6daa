"""One study's work unit on disk or object storage: where its record lives, how a worker writes it (masks first,
the record last and atomically), and the worker-side helpers shared by the local pool and the Ray engine.

A unit records what it was made from, ``inputs``: the study's input fingerprint
(:func:`~cxrground.ils.tasks.input_fingerprint`), taken before the worker reads the report and image, so that an
input changed while the study runs makes the unit look stale (and redone by the next run), never fresh."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from cxrground.ils.backend_spec import BackendSpec
from cxrground.ils.config import IlsConfig
from cxrground.ils.layout import MASK_DIR, UNITS_DIR
from cxrground.ils.pipeline import process_study, structurer_counts
from cxrground.ils.tasks import StudyTask, input_fingerprint
from cxrground.io.image import DEFAULT_MAX_PIXELS
from cxrground.io.store import Store

__all__ = ["IN_FLIGHT_PER_WORKER", "counted_run", "has_unit", "init_worker", "is_running", "record_worker_death",
           "run_one", "running_rel", "unit_rel", "unit_spec_hash", "unit_store", "worker_threads", "write_unit"]


#: Studies in flight per worker (pool process or Ray actor): enough to keep each busy, few enough that the driver
#: holds a bounded number of tasks and futures whatever the cohort size.
IN_FLIGHT_PER_WORKER = 2


@functools.lru_cache(maxsize=8)
def unit_store(out: str) -> Store:
    """The output folder ``out`` (a local path or an fsspec URL) as a :class:`Store`, one per process."""
    return Store(out)


def unit_rel(key: str) -> str:
    """Where the unit record of study ``key`` lives, relative to the output folder."""
    return f"{UNITS_DIR}/{key}.json"


def running_rel(key: str) -> str:
    """The marker of study ``key`` while a local-pool worker processes it."""
    return f"{UNITS_DIR}/{key}.running"


def has_unit(out: str | Path, key: str) -> bool:
    """Whether study ``key`` is done (its unit record exists)."""
    return unit_store(str(out)).exists(unit_rel(key))


def is_running(out: str | Path, key: str) -> bool:
    """Whether study ``key`` has a running marker."""
    return unit_store(str(out)).exists(running_rel(key))


def unit_spec_hash(spec: BackendSpec) -> str:
    """The spec hash a unit records: :meth:`BackendSpec.spec_hash` without the fitted normative model's file path
    (its sha256 stays), so identical builds in different folders write identical units."""
    kwargs = {k: v for k, v in spec.synthesizer_kwargs.items() if k != "fitted"}
    return replace(spec, synthesizer_kwargs=kwargs).spec_hash()


def write_unit(out: str | Path, unit: dict[str, Any], config: IlsConfig, spec: BackendSpec,
               inputs: str | None = None) -> None:
    """Write a study's unit record (with the settings hashes and, when given, its ``inputs`` fingerprint)
    atomically."""
    if inputs is not None:
        unit["inputs"] = inputs
    unit["config_hash"] = config.config_hash()
    unit["spec_hash"] = unit_spec_hash(spec)
    unit_store(str(out)).write_text(unit_rel(unit["study_key"]), json.dumps(unit, sort_keys=True))


def run_one(task: StudyTask, out: str, config: IlsConfig, spec: BackendSpec,
             max_pixels: int | None = DEFAULT_MAX_PIXELS) -> tuple[str, str]:
    """Process one study in the current process and write its outputs (masks, then the unit); returns (study,
    status). On object storage the masks are made in a local temporary folder and uploaded before the unit."""
    store = unit_store(str(out))
    inputs = input_fingerprint(task)  # before the inputs are read
    if store.local:
        unit = process_study(task, Path(store.root), config, spec, max_pixels=max_pixels)
    else:
        with tempfile.TemporaryDirectory(prefix="cxrground-unit-") as tmp:
            unit = process_study(task, Path(tmp), config, spec, max_pixels=max_pixels)
            for m in unit.get("masks", []):
                store.put_file(Path(tmp) / MASK_DIR / m["path"], f"{MASK_DIR}/{m['path']}")
    write_unit(out, unit, config, spec, inputs)
    return task.study_key, unit["status"]


def counted_run(runner: Callable[..., tuple[str, str]], task: StudyTask, out: str, config: IlsConfig,
                spec: BackendSpec, max_pixels: int | None) -> tuple[tuple[str, str], dict[str, int]]:
    """``runner`` on one study (:func:`run_one`'s arguments), with what the study added to the counters of this
    process's structurer (:func:`~cxrground.ils.pipeline.structurer_counts`: the LLM structurer's requests, cache
    hits, retries, ...), for the driver to add up."""
    before = structurer_counts(spec)
    result = runner(task, out, config, spec, max_pixels)
    return result, dict(structurer_counts(spec) - before)


def record_worker_death(out: str | Path, task: StudyTask, config: IlsConfig, spec: BackendSpec) -> None:
    """Write the failed unit of a study whose worker process died while processing it (twice)."""
    write_unit(out, {"study_key": task.study_key, "split": task.split, "image_path": task.image_path,
                      "status": "failed", "stage": "worker", "error": "WorkerDied",
                      "reason": "worker died (the process was killed, e.g. by the out-of-memory killer)"}, config, spec,
               input_fingerprint(task))
    unit_store(str(out)).remove(running_rel(task.study_key))


def worker_threads() -> int:
    """torch threads of each local worker process: ``OMP_NUM_THREADS`` (what the CLI's ``--threads`` sets),
    else 1."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS") or 1))
    except ValueError:
        return 1


def init_worker(threads: int) -> None:
    """Limit a worker process to ``threads`` BLAS/torch threads."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass


#: Unit records read ahead on object storage (in order, by a few threads), so that assembly is not one
#: round trip per study.
READ_AHEAD = 64


def done_check(out: str | Path, clear_markers: bool = False) -> Callable[[str], bool]:
    """``study -> has a unit``: a file check per study locally; on object storage one listing of ``units/`` made
    now (a set of study keys, a few tens of MB at MIMIC size) instead of a request per study.

    ``clear_markers``: also remove every running marker (:func:`running_rel`) there, which pool workers of an earlier
    run that was killed or stopped by Ctrl-C left; for the start of a run, when no worker of the build runs (the
    build holds its output folder's lock)."""
    store = unit_store(str(out))
    if store.local:
        folder = Path(store.root) / UNITS_DIR
        if clear_markers and folder.is_dir():
            for marker in folder.glob("*.running"):
                marker.unlink(missing_ok=True)
        return lambda key: has_unit(out, key)
    start, end = len(UNITS_DIR) + 1, -len(".json")
    store.refresh()
    listing = store.find(UNITS_DIR)
    if clear_markers:
        for rel in [rel for rel in listing if rel.endswith(".running")]:
            store.remove(rel)
    keys = {rel[start:end] for rel in listing if rel.endswith(".json")}
    return keys.__contains__


def read_unit(store: Store, key: str) -> str | None:
    """The text of study ``key``'s unit record, None when it has none."""
    try:
        return store.read_text(unit_rel(key))
    except FileNotFoundError:
        return None
