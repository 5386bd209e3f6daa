"""The ILS build engine: per-study work units, local process pool or Ray, resumable, then assembly.

Each study is processed independently (:func:`cxrground.ils.pipeline.process_study`) with its own
seeded RNG; its mask PNGs are written first and its unit record ``units/{study}.json`` last and
atomically (:mod:`cxrground.ils.units`), so a study is done iff its unit file exists. A killed run started again
with the same command processes the remaining studies only; ``retry_failed`` also redoes the failed ones.

A resume also compares each study's inputs with those its unit was made from (the unit's input fingerprint,
:func:`~cxrground.ils.tasks.input_fingerprint`: the report's sha256, the image file's size and modification
time, the study's fields): a study whose report or image changed is processed again, its stale unit and masks
removed first. The driver keeps ``OUT/unit_inputs.jsonl`` (:class:`InputIndex`), so that a resume reads one file
rather than every unit. A build whose normative model was fitted on its own studies keeps it on a resume; it refuses
one that changed or removed a study whose film the model read (``OUT/normative_fitted.inputs.jsonl`` against the
model's sidecar), and counts other changes since the fit (a fresh build of those inputs may fit another model).

The driver streams: the resume check, the scheduling and :func:`assemble` take the studies one at a time, the
engines keep a bounded number in flight (:data:`~cxrground.ils.units.IN_FLIGHT_PER_WORKER` per worker), and the
dataset JSON is written study by study in the same bytes as a dump of the whole dict; only counters stay in
memory. The output folder may be local or on object storage (an fsspec URL, :mod:`cxrground.io.store`).

A study whose worker process dies (the OOM killer, SIGKILL, a lost Ray node) is retried once alone; when its
worker dies again it is recorded as failed ("worker died") in its unit file and the rest goes on. While a study
runs in the local pool, ``units/{study}.running`` marks it, which is how the dead worker's study is found.
Assembly reads the unit files in study order, so the output is byte-identical whatever the engine, the number of
workers, the storage or the interruptions.
:class:`~cxrground.ils.backend_spec.BackendSpec` and ``DATASET_FILE`` (:mod:`cxrground.ils.layout`) are
re-exported here, the build's inputs and output name.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence, Sized
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cxrground import __version__
from cxrground.anatomy.segment.pose_net import pose_reader_at, pose_reader_record
from cxrground.errors import BatchStopped, ConfigError, Failure
from cxrground.extras import Need, check_needs
from cxrground.ils.backend_spec import BackendSpec
from cxrground.ils.card import (
    FIT_INPUTS_KEY,
    NO_PAIRS_LISTED,
    READING_NOTES,
    REPROCESSED_KEY,
    REVIEW_FILE,
    DatasetCounts,
    addendum_lines,
    no_pairs_lines,
    pose_lines,
    read_review_summary,
    reading_lines,
    render_card,
    rules_lines,
    view_lines,
)
from cxrground.ils.cohort_normative import FITTED_FILE, _fitted_ready, resolve_spec
from cxrground.ils.compose import WITHHELD_HEART_IMPLAUSIBLE
from cxrground.ils.config import IlsConfig
from cxrground.ils.inputs import (
    FITTED_INPUTS,
    INPUTS_INDEX,
    InputIndex,
    InputSurvey,
    survey_inputs,
    write_fitted_inputs,
)
from cxrground.ils.layout import DATASET_FILE, MASK_DIR, UNITS_DIR
from cxrground.ils.pipeline import (
    REPORT_DETAILS,
    Registration,
    backend_provenance,
    backend_registrations,
    get_backends,
    install_registrations,
    note_retries,
    prestructure,
    worker_note,
)
from cxrground.ils.schema import SPLITS, validate_dataset
from cxrground.ils.tasks import DEFAULT_SPLIT_RATIOS, StudyTask, in_key_order
from cxrground.ils.units import (
    IN_FLIGHT_PER_WORKER,
    READ_AHEAD,
    counted_run,
    done_check,
    has_unit,
    init_worker,
    is_running,
    read_unit,
    record_worker_death,
    run_one,
    running_rel,
    unit_rel,
    unit_store,
    worker_threads,
)
from cxrground.ils.zone_guide import guide_outcome
from cxrground.io.files import (
    atomic_path,
    atomic_write_bytes,
    atomic_write_text,
    flat_json,
    remove_stale_temp_dirs,
    remove_stale_temps,
    sha256_json,
)
from cxrground.io.image import DEFAULT_MAX_PIXELS
from cxrground.io.output_lock import locks_output
from cxrground.io.progress import progress_bar
from cxrground.io.store import Store, is_url
from cxrground.io.workers import stop_workers, worker_pool

__all__ = ["DATASET_FILE", "IN_FLIGHT_PER_WORKER", "BackendSpec", "BuildSummary", "assemble", "build_dataset",
           "check_backends", "check_workers", "clear_failed", "run_needs", "run_units"]

@dataclass(frozen=True)
class BuildSummary:
    """What a build did."""

    out_dir: str
    processed: int
    skipped: int
    studies_in_dataset: int
    pairs: int
    failures: int
    seconds: float
    blind_choices: int = 0
    """Studies whose image was chosen among several of unknown view (no view table): it may be a lateral film."""
    pose_warnings: int = 0
    """Films the pose reader flagged as stored mirrored, turned or flipped (listed on the card; none rejected)."""
    inputs_changed: int = 0
    """Studies whose report or image changed since their unit was built: processed again by this run."""
    predating_units: int = 0
    """Units written before units recorded their inputs: kept as they are (their inputs cannot be compared)."""
    predating_named: tuple[str, ...] = ()
    """The first :data:`NAMED_PREDATING` of them."""
    fit_inputs_since: dict[str, int] | None = None
    """Studies ``added``, ``removed``, ``changed`` since the build fitted its normative model on its own studies
    (none of them among the films it read; the model is kept), None when none or no such model."""
    every_failed: bool = False
    """Every study with a unit failed (none kept, none merely rejected by QC): ``ils build`` exits 1."""
    code_then: str | None = None
    """The git revision of the code that made the units this resume kept, when it is not this run's (the
    package version is a setting: another version is refused; another revision of one version only warns)."""
    code_now: str | None = None
    """This run's git revision (None: not a git checkout)."""
    without_pairs: int = 0
    """Studies processed that gave no pair (left out of the dataset, named on the card)."""
    first_failure: str | None = None
    """``PATH: REASON`` of the first line of ``failures.jsonl`` (None: no failure)."""
    failed: int = 0
    """The lines of ``failures.jsonl`` that are not a QC rejection (an input that could not be used, a report the
    structurer could not structure, a worker that died): ``ils build --strict`` exits 3 when there are any."""
    llm_counts: dict[str, int] | None = None
    """The ``llm`` structurer's counters of this run (requests, cache hits, retries, ...: the pass that structures
    the reports before the workers and the workers' own, added up); None with another structurer."""


#: Studies named in the line about units that predate input fingerprints.
NAMED_PREDATING = 5


def input_lines(summary: BuildSummary) -> list[str]:
    """What the CLI says, after the build's own lines, about the studies whose inputs changed since their unit was
    built and the units too old to tell (one line each, none when there are none)."""
    lines = []
    if summary.inputs_changed:
        since = "its unit was" if summary.inputs_changed == 1 else "their units were"
        lines.append(f"  {summary.inputs_changed:,} {_studies(summary.inputs_changed)} changed since {since} built: "
                     "processed again")
    if summary.predating_units:
        named = ", ".join(summary.predating_named)
        more = ", …" if summary.predating_units > len(summary.predating_named) else ""
        units = "unit predates" if summary.predating_units == 1 else "units predate"
        lines.append(f"  warning: {summary.predating_units:,} {units} input fingerprints ({named}{more}); rebuild "
                     "with --overwrite to check them")
    if summary.code_then:
        lines.append(f"  warning: the {summary.skipped:,} kept {'unit was' if summary.skipped == 1 else 'units were'}"
                     f" made by cxrground revision {summary.code_then}, this run is {summary.code_now}; rebuild with "
                     "--overwrite if the change concerns them")
    return lines + fit_input_lines(summary.fit_inputs_since)


def _studies(n: int) -> str:
    return "study" if n == 1 else "studies"


Runner = Callable[[StudyTask, str, IlsConfig, BackendSpec, "int | None"], tuple[str, str]]


def _run_marked(runner: Runner, task: StudyTask, out: str, config: IlsConfig, spec: BackendSpec,
                max_pixels: int | None) -> tuple[tuple[str, str], dict[str, int]]:
    """``runner`` on one study in a pool worker, with ``units/{study}.running`` present while it runs; returns what
    :func:`~cxrground.ils.units.counted_run` returns."""
    store = unit_store(str(out))
    store.write_text(running_rel(task.study_key), str(os.getpid()))
    try:
        return counted_run(runner, task, out, config, spec, max_pixels)
    finally:  # also when the study stops the build (BatchStopped); a killed worker leaves the marker
        store.remove(running_rel(task.study_key))


def _init_pool_worker(threads: int, registrations: Sequence[Registration], notes: bool = False) -> None:
    """A local pool worker's set-up: its thread count, the registrations of the build's backends (those registered
    at run time included) and, with ``notes``, its structurer's retry notes on its stderr
    (:func:`~cxrground.ils.pipeline.worker_note`)."""
    init_worker(threads)
    install_registrations(registrations)
    if notes:
        note_retries(worker_note)


def _pool_round(todo: Iterator[StudyTask], out: str | Path, config: IlsConfig, spec: BackendSpec, workers: int,
                max_pixels: int | None, runner: Runner, bar: Any, counts: Counter[str], notes: bool = False,
                ) -> tuple[list[StudyTask], list[StudyTask]] | None:
    """Run the studies of ``todo`` in one process pool, at most :data:`IN_FLIGHT_PER_WORKER` per worker in flight;
    the workers' structurer counters are added to ``counts``, and with ``notes`` their retry notes go to their
    stderr.

    None when ``todo`` is exhausted and all finished; else, the pool having broken, the studies that were running
    (their marker present, no unit) and the other unfinished ones that had been submitted.
    """
    limit = max(1, workers) * IN_FLIGHT_PER_WORKER
    inflight: dict[Future, StudyTask] = {}
    with worker_pool(workers, _init_pool_worker, (worker_threads(), backend_registrations(spec), notes)) as pool:
        try:
            while True:
                while len(inflight) < limit and (t := next(todo, None)) is not None:
                    inflight[pool.submit(_run_marked, runner, t, str(out), config, spec, max_pixels)] = t
                if not inflight:
                    return None
                done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                for fut in done:
                    counts.update(fut.result()[1])
                    del inflight[fut]
                    bar.update()
        except BrokenProcessPool:
            left = [t for t in inflight.values() if not has_unit(out, t.study_key)]
            running = [t for t in left if is_running(out, t.study_key)]
            return running, [t for t in left if t not in running]
        except (KeyboardInterrupt, BatchStopped):  # Ctrl-C (the workers ignore it), or a study stopped the build
            stop_workers(pool)
            raise


def _run_pool(todo: Iterable[StudyTask], out: str | Path, config: IlsConfig, spec: BackendSpec, workers: int,
              max_pixels: int | None, runner: Runner, bar: Any, counts: Counter[str], notes: bool = False) -> None:
    """Process ``todo`` in process pools, restarting the pool when a worker dies (``counts``, ``notes``: see
    :func:`_pool_round`).

    The studies that were running when the pool broke are each retried once alone: one that kills its worker
    again is recorded as failed ("worker died"), the others (killed beside it) finish normally.
    """
    queue: Iterator[StudyTask] = iter(todo)
    while True:
        broke = _pool_round(queue, out, config, spec, workers, max_pixels, runner, bar, counts, notes)
        if broke is None:
            return
        running, others = broke
        if not running:
            raise ConfigError("a worker process died before it started a study; rerun with --workers 1 to see why")
        for t in running:
            unit_store(str(out)).remove(running_rel(t.study_key))
            if _pool_round(iter([t]), out, config, spec, 1, max_pixels, runner, bar, counts, notes) is not None:
                record_worker_death(out, t, config, spec)
                bar.update()
        queue = itertools.chain(others, queue)


def _pending(tasks: Iterable[StudyTask], out: str | Path, done: Callable[[str], bool] | None = None
             ) -> Iterator[StudyTask]:
    """The tasks whose unit file is missing, one at a time (``done``: a :func:`done_check` made beforehand)."""
    done = done or done_check(out)
    return (t for t in tasks if not done(t.study_key))


def _fits_cohort_model(spec: BackendSpec) -> bool:
    """Whether ``spec``'s synthesizer is the normative one with a model fitted on the build's own studies (what
    :func:`~cxrground.ils.cohort_normative.resolve_spec` fits)."""
    from cxrground.ils.spatial import get_synthesizer
    from cxrground.ils.spatial.normative import COHORT, NormativeSynthesizer

    if spec.synthesizer != "normative":
        return False
    synth = get_synthesizer(spec.synthesizer, **spec.synthesizer_kwargs)
    return isinstance(synth, NormativeSynthesizer) and synth.model == COHORT


def _resolve(spec: BackendSpec, tasks: Sequence[StudyTask], out: Path, config: IlsConfig, progress: bool
             ) -> BackendSpec:
    """:func:`~cxrground.ils.cohort_normative.resolve_spec`, the input set written first when it is about to fit
    a cohort model."""
    if _fits_cohort_model(spec) and not _fitted_ready(out / FITTED_FILE):
        write_fitted_inputs(tasks, out / FITTED_INPUTS)
    return resolve_spec(spec, tasks, out, config, progress)


def _fitted_films(out: Path) -> set[str]:
    """The studies whose films the build's fitted normative model read (fitted on or trimmed), from its sidecar; none
    when too few normal films fell back to the shipped model."""
    try:
        meta = json.loads((out / FITTED_FILE).with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if str(meta.get("source", "")).startswith("shipped"):
        return set()  # too few normal films: the shipped model, which no film of the build shaped, was used
    trimmed = meta.get("trimmed") if isinstance(meta.get("trimmed"), dict) else {}
    return {str(k) for k in [*(meta.get("studies") or []), *(trimmed.get("studies") or [])]}


def _fitted_change(gone: Sequence[str]) -> str:
    """How a refused resume names the studies the fitted normative model read that changed or were removed."""
    named = ", ".join(sorted(gone)[:NAMED_PREDATING]) + (", …" if len(gone) > NAMED_PREDATING else "")
    return (f"inputs: {len(gone):,} of the studies its normative model ({FITTED_FILE}) was fitted on changed or "
            f"were removed ({named}), so that model no longer describes these inputs")


def fit_input_lines(counts: Mapping[str, int] | None) -> list[str]:
    """The warning that studies were added, removed or changed since the build fitted its normative model (none of
    them among the films it read), or nothing."""
    if not counts or not any(counts.values()):
        return []
    return [f"  warning: {counts['added']:,} {_studies(counts['added'])} added, {counts['removed']:,} removed and "
            f"{counts['changed']:,} changed since the normative model was fitted on this build's studies (none of "
            "its films): the build keeps that model; a fresh build of these inputs may fit another (--overwrite)"]


def _remove_unit(dest: str | Path, key: str) -> None:
    """Remove the unit of study ``key`` and the masks it lists (masks first: a kill in between leaves the unit,
    which the next resume finds stale again)."""
    store = unit_store(str(dest))
    text = read_unit(store, key)
    try:
        masks = [m["path"] for m in json.loads(text).get("masks", [])] if text else []
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError):
        masks = []
    for rel in masks:
        store.remove(f"{MASK_DIR}/{rel}")
    if store.local and masks:
        folders = {Path(store.path(f"{MASK_DIR}/{rel}")).parent for rel in masks}
        for folder in folders:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
    store.remove(unit_rel(key))


def clear_failed(tasks: Iterable[StudyTask], out: str | Path) -> int:
    """Remove the unit files of ``tasks`` whose study failed (not those rejected by QC), so that the next run
    processes them again; returns how many."""
    n = 0
    store = unit_store(str(out))
    for t in tasks:
        try:
            status = json.loads(store.read_text(unit_rel(t.study_key))).get("status")
        except FileNotFoundError:
            continue
        except (json.JSONDecodeError, UnicodeDecodeError):
            status = "failed"  # a torn unit cannot come from an atomic write; redo it
        if status == "failed":
            store.remove(unit_rel(t.study_key))
            n += 1
    return n


def run_units(
    tasks: Iterable[StudyTask],
    out: str | Path,
    config: IlsConfig,
    spec: BackendSpec,
    engine: str = "local",
    workers: int = 1,
    progress: bool = True,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    runner: Runner = run_one,
    ray_address: str | None = None,
    index: InputIndex | None = None,
    note: Callable[[str], None] | None = None,
    counts: Counter[str] | None = None,
) -> tuple[int, int]:
    """Process every task whose unit file is missing; returns (processed, skipped).

    ``tasks``: a list, or any iterable that can be iterated again (it is read twice: counting, then running);
    the tasks are streamed, the driver holds only those in flight. ``max_pixels``: images whose header states more
    pixels fail without being decoded. ``runner``: the per-study function (picklable; it writes the unit file),
    :func:`~cxrground.ils.units.run_one` unless a test injects faults. ``ray_address``: the Ray cluster of
    ``engine='ray'`` (``auto``, ``ray://host:10001``, ``host:6379``; default ``RAY_ADDRESS``, else a new local
    Ray instance with ``workers`` CPUs). ``index``: the build's :class:`InputIndex`, which gets each study's input
    fingerprint as the study is handed to a worker (None: not kept; a resume then reads those units).

    ``note``: where the retry notes of the structurer that processes the studies go (the LLM structurer's: at most
    one every 10 s per process), None: nowhere. In this process (one local worker) ``note`` gets them; pool workers
    and Ray actors print theirs on their stderr, naming the worker (the console or log of the build; Ray forwards an
    actor's). ``counts``: the workers' structurer counters (requests, cache hits, retries, ...) are added to it.
    """
    total = n_todo = 0
    done = done_check(out, clear_markers=True)
    for t in tasks:
        total += 1
        n_todo += not done(t.study_key)
    bar = progress_bar(total=n_todo, desc="ils build", unit="study", progress=progress, dynamic_ncols=True)
    todo = _pending(tasks, out, done)
    if index is not None:
        todo = index.noting(todo)
    counts = Counter() if counts is None else counts
    try:  # the bar is closed also when Ctrl-C or an error stops the run, so that its line ends before the message
        if engine == "local" and workers <= 1:
            previous = note_retries(note)
            try:
                for t in todo:
                    counts.update(counted_run(runner, t, str(out), config, spec, max_pixels)[1])
                    bar.update()
            finally:
                note_retries(previous)
        elif engine == "local":
            _run_pool(todo, out, config, spec, workers, max_pixels, runner, bar, counts, note is not None)
        elif engine == "ray":
            from cxrground.ils.ray_engine import run_ray

            run_ray(todo, out, config, spec, workers, bar, max_pixels, runner, ray_address, counts, note is not None)
        else:
            raise ConfigError(f"unknown engine {engine!r}; use 'local' or 'ray'")
    finally:
        bar.close()
    return n_todo, total - n_todo


def _git(args: Sequence[str], cwd: Path) -> str:
    """``git ARGS`` run in ``cwd``: its output, "" when git is missing or fails."""
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=cwd,
                              check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _project_name(pyproject: Path) -> str | None:
    """``[project] name`` of a ``pyproject.toml`` (None when unreadable)."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    name = (data.get("project") or {}).get("name")
    return name if isinstance(name, str) else None


def source_checkout(package: Path) -> Path | None:
    """The git work tree of cxrground's own source that holds the package folder ``package`` (its toplevel holds a
    ``pyproject.toml`` naming the project ``cxrground`` and ``package`` lies under its ``src/``); None for an
    installed package, also one installed inside another project's repository."""
    top = _git(["rev-parse", "--show-toplevel"], package)
    if not top:
        return None
    root = Path(top).resolve()
    if _project_name(root / "pyproject.toml") != "cxrground" or not package.resolve().is_relative_to(root / "src"):
        return None
    return root


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
    """The package version, with ``+g<commit>`` when the code runs from cxrground's own git checkout
    (:func:`source_checkout`); an installed package, even one inside another git repository, gives the version
    alone."""
    package = Path(__file__).resolve().parents[1]
    root = source_checkout(package)
    rev = _git(["rev-parse", "--short", "HEAD"], root) if root is not None else ""
    return f"{__version__}+g{rev}" if rev else __version__


#: The failure reason of a study that has no unit record when the dataset is assembled.
UNIT_MISSING: Final[str] = "no unit record at assembly"


def _units(out: str | Path, tasks: Iterable[StudyTask]) -> Iterator[tuple[StudyTask, dict[str, Any] | None]]:
    """Each task of ``tasks`` with its unit record (None when it has none), one at a time in the order of ``tasks``
    (on object storage read :data:`READ_AHEAD` ahead by 16 threads, after the cached listings are dropped: the
    workers wrote the units since the driver listed them)."""
    store = unit_store(str(out))
    if store.local:
        for t in tasks:
            yield t, _unit_record(store, t.study_key, read_unit(store, t.study_key))
        return
    store.refresh()
    with ThreadPoolExecutor(16) as pool:
        window: deque[tuple[StudyTask, Future]] = deque()
        for t in tasks:
            window.append((t, pool.submit(read_unit, store, t.study_key)))
            if len(window) >= READ_AHEAD:
                task, future = window.popleft()
                yield task, _unit_record(store, task.study_key, future.result())
        while window:
            task, future = window.popleft()
            yield task, _unit_record(store, task.study_key, future.result())


def _unit_record(store: Any, study_key: str, text: str | None) -> dict[str, Any] | None:
    """The unit record ``text`` of ``study_key`` (None when there is none); a damaged one (cut short, edited) is a
    :class:`~cxrground.errors.ConfigError` naming the file and how to redo the study."""
    if text is None:
        return None
    try:
        record = json.loads(text)
    except ValueError as exc:
        record = exc
    if not isinstance(record, dict):
        why = record if isinstance(record, Exception) else "not a JSON object"
        raise ConfigError(f"{store.url(unit_rel(study_key))} is damaged ({why}); delete it and run the same command "
                          "again to redo that study")
    return record


class _DatasetWriter:
    """Writes the dataset JSON one study at a time, byte for byte what ``json.dumps(dataset, ensure_ascii=False)``
    gives for the dict ``{split: {study: record}}`` (splits in :data:`SPLITS` order, studies in arrival order).

    Each split's studies go to their own part file under ``folder``; :meth:`finish` joins the parts into ``path``
    atomically.
    """

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.parts = {s: (folder / f"{s}.part").open("w", encoding="utf-8") for s in SPLITS}
        self.count = dict.fromkeys(SPLITS, 0)

    def add(self, split: str, key: str, study: dict[str, Any]) -> None:
        """Append one study to ``split``."""
        fh = self.parts[split]
        fh.write((", " if self.count[split] else "") + json.dumps(key, ensure_ascii=False) + ": "
                 + json.dumps(study, ensure_ascii=False))
        self.count[split] += 1

    def finish(self, path: Path) -> None:
        """Write ``path`` from the parts (atomically) and remove them."""
        for fh in self.parts.values():
            fh.close()
        with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as out:
            out.write("{")
            for i, split in enumerate(SPLITS):
                out.write((", " if i else "") + json.dumps(split) + ": {")
                with (self.folder / f"{split}.part").open(encoding="utf-8") as part:
                    shutil.copyfileobj(part, out, 1 << 20)
                out.write("}")
            out.write("}")
        self.close()

    def close(self) -> None:
        """Remove the part files (after :meth:`finish` or an error)."""
        for fh in self.parts.values():
            fh.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _jsonl_writer(stack: ExitStack, path: Path) -> Any:
    """A text file handle whose content replaces ``path`` atomically when ``stack`` closes without an error."""
    tmp = stack.enter_context(atomic_path(path))
    return stack.enter_context(tmp.open("w", encoding="utf-8"))


#: What :func:`assemble` writes beside the units and masks.
OUTPUT_FILES = (DATASET_FILE, "findings.jsonl", "masks.jsonl", "anatomy.jsonl", "failures.jsonl", "provenance.json",
                "card.md")


def assemble(out: str | Path, tasks: Iterable[StudyTask], config: IlsConfig, spec: BackendSpec,
             scan_failures: Iterable[Failure], backend_provenance: dict[str, Any],
             truth_cohort: Path | None = None, view_table: Mapping[str, Any] | None = None,
             split: Mapping[str, Any] | None = None, redone: Collection[str] = (),
             fit_changes: Mapping[str, int] | None = None, progress: bool = False) -> dict[str, Any]:
    """Write the JSON, mask index, findings, anatomy, failures, provenance and card from the unit files
    (``view_table``: the view table the image choice used, :func:`~cxrground.datasets.views.view_table_record`;
    ``split``: where the splits came from, :func:`~cxrground.ils.tasks.split_record`; each None when unknown;
    ``redone``: the studies processed again because their inputs changed, counted in the provenance and card;
    ``fit_changes``: studies added, removed, changed since a cohort normative model was fitted, recorded likewise).

    Streams: one unit is read, checked and written out at a time, and only counters stay in memory, so the
    driver's memory does not grow with the number of studies. ``out``: a local folder or an fsspec URL (the files
    are then written in a local temporary folder and each uploaded in one piece). ``progress``: a bar over the
    units read. Returns the counts (``studies``, ``pairs``, ``failures``: the lines of ``failures.jsonl``, ``failed``:
    those of them that are not a QC rejection, ``every_failed``, ``rejections``) and ``first_failure`` (``PATH:
    REASON`` of the first failure, or None).
    """
    store = unit_store(str(out))
    if store.local:
        return _assemble(out, Path(store.root), tasks, config, spec, scan_failures, backend_provenance, truth_cohort,
                         view_table, split, redone, fit_changes, progress)
    with tempfile.TemporaryDirectory(prefix="cxrground-assemble-") as tmp:
        result = _assemble(out, Path(tmp), tasks, config, spec, scan_failures, backend_provenance, None,
                           view_table, split, redone, fit_changes, progress)
        store.remove("card.md")  # uploaded last: an upload cut short leaves no card describing other files
        for name in OUTPUT_FILES:
            store.put_file(Path(tmp) / name, name)
    return result


def _assemble(out: str | Path, stage: Path, tasks: Iterable[StudyTask], config: IlsConfig, spec: BackendSpec,
              scan_failures: Iterable[Failure], backend_provenance: dict[str, Any],
              truth_cohort: Path | None, view_table: Mapping[str, Any] | None = None,
              split: Mapping[str, Any] | None = None, redone: Collection[str] = (),
              fit_changes: Mapping[str, int] | None = None, progress: bool = False) -> dict[str, Any]:
    """:func:`assemble`, the files written to the local folder ``stage`` (the output folder itself when local)."""
    store = unit_store(str(out))
    counts = DatasetCounts()
    reported: Counter = Counter()
    rejections: Counter = Counter()
    no_pairs: list[str] = []  # the first studies without pairs, named on the card
    grounding_reasons: Counter = Counter()
    dropped_pairs: Counter = Counter()
    placed_negatives: Counter = Counter()
    guided: Counter = Counter()
    addenda: list[tuple[str, list[str]]] = []  # (study, lesions its addendum names) of the dataset's studies
    posed: list[tuple[str, dict[str, Any], bool]] = []  # (study, pose warning, in the dataset) of films flagged
    read_as: dict[str, list[str]] = defaultdict(list)  # READING_NOTES key -> studies whose film was read so
    views: Counter = Counter()  # view of each study's chosen image ("unknown" when none was known)
    blind = 0  # studies with several images and no known view for the chosen one
    n_redone = 0  # studies processed again because their inputs changed
    problems: list[str] = []
    n_failures = 0
    first = ""  # the first line of failures.jsonl, as the console names it: "PATH: REASON"
    n_units = n_failed = 0  # studies with a unit, and those of them that failed (not rejected by QC)
    n_rejected = 0  # studies with a unit rejected by QC (a failures.jsonl line, but not an error)
    dataset = _DatasetWriter(stage / f".assemble.{os.getpid()}")
    try:
        with ExitStack() as stack:
            findings_fh, masks_fh, anatomy_fh, failures_fh = (
                _jsonl_writer(stack, stage / name) for name in ("findings.jsonl", "masks.jsonl", "anatomy.jsonl",
                                                             "failures.jsonl"))
            for f in scan_failures:
                rejections[f"input: {f.reason.split(' (')[0]}"] += 1
                failures_fh.write(json.dumps({**f.to_dict(), "path": _absolute(f.path)}, sort_keys=True) + "\n")
                first = first or f"{_absolute(f.path)}: {f.reason}"
                n_failures += 1
            for task, u in progress_bar(_units(out, in_key_order(tasks)), desc="assemble", unit="study",
                                        progress=progress, total=len(tasks) if isinstance(tasks, Sized) else None):
                if u is None:  # nothing may be lost in silence: a study without a unit is a failure
                    rejections[UNIT_MISSING] += 1
                    failures_fh.write(json.dumps({"path": _absolute(task.image_path), "stage": "assemble",
                                                  "reason": UNIT_MISSING, "study": task.study_key,
                                                  "error": "no unit record was found for the study when the "
                                                           "dataset was assembled; rerun the same ils build"},
                                                 sort_keys=True) + "\n")
                    first = first or f"{_absolute(task.image_path)}: {UNIT_MISSING}"
                    n_failures += 1
                    continue
                key = u["study_key"]
                n_redone += key in redone
                n_units += 1
                n_failed += u["status"] == "failed"
                n_rejected += u["status"] == "rejected"
                for finding in u.get("findings", []):
                    findings_fh.write(json.dumps({"study": key, **finding}, sort_keys=True) + "\n")
                for m in u.get("masks", []):
                    masks_fh.write(json.dumps({"study": key, **m}, sort_keys=True) + "\n")
                if u.get("anatomy"):
                    posed_as = {"pose_warning": u["pose_warning"]} if "pose_warning" in u else {}
                    notes = {k: u[k] for k, _ in READING_NOTES if k in u}
                    anatomy_fh.write(json.dumps({"study": key, **u["anatomy"], **posed_as, **notes},
                                                sort_keys=True) + "\n")
                for note, _ in READING_NOTES:
                    if note in u:
                        read_as[note].append(key)
                reported.update((lesion, bool(got)) for lesion, got in u.get("reported", []))
                for g in u.get("grounding", []):
                    if g.get("status") != "grounded":
                        reason = g.get("reason") or g.get("status")
                        if reason == "empty_heart" and u.get("heart_note"):
                            reason = "heart estimate implausible"
                        grounding_reasons[f"{g.get('lesion')}: {reason}"] += 1
                    outcome = guide_outcome(g)
                    if outcome is not None:
                        guided[outcome] += 1
                if u.get("heart_note") and not any(g.get("lesion") == "cardiomegaly" for g in u.get("grounding", [])):
                    dropped_pairs[WITHHELD_HEART_IMPLAUSIBLE] += 1  # a CTR-decided negative, not a reported finding
                dropped_pairs.update(u.get("dropped_pairs", {}))
                placed_negatives.update(u.get("placed_negatives", {}))
                if "view" in u:
                    views[u["view"] or "unknown"] += 1
                    blind += u["view"] is None and u.get("images_in_study", 1) > 1
                if "pose_warning" in u:
                    posed.append((key, u["pose_warning"], u["status"] == "ok"))
                if u["status"] != "ok":
                    rejections[u["reason"]] += 1
                    failure = {"path": _absolute(u.get("image_path", key)), "stage": u.get("stage", "build"),
                               "reason": u["reason"], "error": u.get("error", u["status"]), "study": key,
                               **({"file": _absolute(u["file"])} if u.get("file") else {}),
                               **{k: u[k] for k in REPORT_DETAILS if k in u}}
                    if "report_path" in failure:
                        failure["report_path"] = _absolute(failure["report_path"])
                    failures_fh.write(json.dumps(failure, sort_keys=True) + "\n")
                    first = first or f"{failure['path']}: {failure['reason']}"
                    n_failures += 1
                    continue
                study = u["study"]
                pairs = study["instruction_answer_pairs"]
                if not pairs["positive_pairs"] and not pairs["negative_pairs"]:
                    rejections["no pairs"] += 1
                    if len(no_pairs) < NO_PAIRS_LISTED:
                        no_pairs.append(key)
                    continue
                if len(problems) < 5:
                    # masks on object storage were uploaded before their unit: not checked one by one
                    problems += validate_dataset({u["split"]: {key: study}},
                                                 stage / MASK_DIR if store.local else None)
                counts.add(u["split"], study)
                dataset.add(u["split"], key, study)
                if "addendum_lesions" in u:
                    addenda.append((key, u["addendum_lesions"]))
            if problems:
                raise ConfigError("generated dataset fails its own schema check: " + "; ".join(problems[:5])
                                  + f". A file of the build was changed or deleted after it was written: delete the "
                                  f"named studies' unit records ({UNITS_DIR}/<study>.json) and rerun to make them "
                                  "again, or start afresh with --overwrite")
            # the files are replaced from here on and the card is written last: without the old one, a folder whose
            # assembly was cut short holds no card that describes other files (rerunning the command finishes it)
            (stage / "card.md").unlink(missing_ok=True)
        dataset.finish(stage / DATASET_FILE)
    finally:
        dataset.close()
    provenance = {
        "code_version": _code_version(),
        "python": platform.python_version(),
        "seed": config.seed,
        "config_hash": config.config_hash(),
        "config": config.to_dict(),
        "backends": backend_provenance,
        "backend_spec": spec.to_dict(),
        "exclude_studies": list(config.exclude_studies),
        "mask_frame": "native image pixels (no padding, no resize)",
        "image_source": "as given (MIMIC-CXR-JPG paths are files/-relative)",
        "view_table": dict(view_table) if view_table else None,
        "split": dict(split) if split else None,
        "pose_reader": pose_reader_record(pose_reader_at(config.qc.pose_weights)) if config.qc.pose_warning else None,
    }
    if n_redone:
        provenance[REPROCESSED_KEY] = n_redone
    if fit_changes and any(fit_changes.values()):
        provenance[FIT_INPUTS_KEY] = dict(fit_changes)
    atomic_write_text(stage / "provenance.json", json.dumps(provenance, indent=2, sort_keys=True))
    extra: list[str] = []
    if truth_cohort is not None:
        from cxrground.ils.quality import format_findings_quality, format_quality, score_against_truth, score_findings

        extra = ["## Quality against the synthetic cohort's exact truth (test data)", "",
                 f"Cohort: `{truth_cohort}`. Masks vs the drawn lesions, negatives vs lesion-free truth:", "",
                 format_quality(score_against_truth(stage, truth_cohort)), "",
                 "Structured findings vs the report truth (present/uncertain findings per study and lesion):", "",
                 format_findings_quality(score_findings(stage, truth_cohort)), ""]
    extra += rules_lines(config.zone_guide, config.grounded_location, config.silent_report_negatives,
                         config.prominent_heart_negative)
    extra += view_lines(views, blind, view_table)
    extra += no_pairs_lines(no_pairs, rejections["no pairs"])
    extra += addendum_lines(addenda)
    extra += pose_lines(posed, config.qc.pose_warning, shipped=config.qc.pose_weights is None)
    extra += reading_lines(read_as)
    reported_pairs = (pair for pair, n in sorted(reported.items()) for _ in range(n))
    review = read_review_summary(stage) if store.local else (
        json.loads(store.read_text(REVIEW_FILE)) if store.exists(REVIEW_FILE) else None)
    atomic_write_text(stage / "card.md", render_card(counts, reported_pairs, rejections, provenance, extra,
                                                     dict(grounding_reasons), review,
                                                     dict(dropped_pairs),
                                                     dict(placed_negatives) if config.negative_check != "none"
                                                     else None,
                                                     (config.zone_guide, dict(guided)) if config.zone_guide != "none"
                                                     else None))
    return {"studies": sum(counts.studies.values()), "pairs": counts.pairs(), "failures": n_failures,
            "failed": n_failures - n_rejected,
            "first_failure": first or None, "every_failed": n_units > 0 and n_failed == n_units,
            "rejections": dict(rejections), "blind_choices": blind, "pose_warnings": len(posed)}


def _absolute(path: str) -> str:
    """A local file path of ``failures.jsonl`` made absolute (URLs and study keys unchanged): every path there is
    absolute, whether the build was given absolute or relative folders."""
    if is_url(path) or not (os.sep in path or "/" in path or Path(path).suffix):
        return path
    return str(Path(path).absolute())


def backends_identity(spec: BackendSpec, *, with_endpoint: bool = False) -> str:
    """Short hash of what the backends of ``spec`` actually are (:func:`backend_provenance`: settings with their
    defaults, weights' sha256, methods); file-system paths are left out, so a moved folder or install keeps it, and
    so is the LLM structurer's endpoint (where the model is served, not what it is; ``with_endpoint``: kept, as
    stamps of builds that hashed it hold it)."""
    prov = _without_paths(backend_provenance(spec))
    structurer = prov.get("structurer")
    if not with_endpoint and spec.structurer == "llm" and isinstance(structurer, dict):
        prov = {**prov, "structurer": {k: v for k, v in structurer.items() if k != "base_url"}}
    return sha256_json(prov, default=str)[:12]


def _without_paths(value: Any) -> Any:
    """``value`` with every absolute file-system path string removed (recursively)."""
    if isinstance(value, dict):
        return {k: _without_paths(v) for k, v in value.items() if not _is_abs_path(v)}
    if isinstance(value, list | tuple):
        return [_without_paths(v) for v in value if not _is_abs_path(v)]
    return value


def _is_abs_path(value: Any) -> bool:
    return isinstance(value, str) and Path(value).is_absolute()


#: Settings a stamp holds only when they are not the default (compared when either side has one).
_OPTIONAL_SETTINGS = ("view_table", "split", "max_pixels", "limit", "pose_reader")
#: How a refusal names each setting of ``settings.json``.
_SETTING_NAMES = {"config_hash": "options (config hash)", "spec_hash": "backend options (spec hash)",
                  "code": "cxrground version",
                  "view_table": "view table (sha256)", "split": "split (file sha256 or ratios)",
                  "max_pixels": "--max-pixels", "limit": "--limit", "pose_reader": "pose reader weights (sha256)"}
_SETTING_DEFAULTS = {"max_pixels": str(DEFAULT_MAX_PIXELS), "limit": "none", "split": "default ratios",
                     "view_table": "none", "pose_reader": "none"}


def _setting_value(key: str, settings: Mapping[str, Any]) -> str:
    value = settings.get(key)
    return _SETTING_DEFAULTS.get(key, "none") if value is None else str(value)


#: Options named in a refusal before it says "and N more".
NAMED_OPTIONS = 6


def _option_changes(out: Path, key: str, now: Mapping[str, Any]) -> str:
    """Which options differ from those of the build in ``out`` (its ``provenance.json`` field ``key``:
    ``config``, ``backend_spec`` or ``backends``, whose file-system paths are left out), e.g. ``: negative_check
    none then, zone_prior_v1 now``; empty when the previous build left no provenance to compare with."""
    try:
        before = json.loads((out / "provenance.json").read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return ""
    if not isinstance(before, Mapping):
        return ""
    now = json.loads(json.dumps(now, default=str))
    strip = _without_paths if key == "backends" else (lambda value: value)  # a backend's paths are no identity
    then, current = flat_json(strip(before)), flat_json(strip(now))
    diff = [k for k in sorted(set(then) | set(current)) if then.get(k) != current.get(k)]
    if not diff:
        return ""
    named = ", ".join(f"{k} {then.get(k, 'unset')} then, {current.get(k, 'unset')} now" for k in diff[:NAMED_OPTIONS])
    return f" ({named}{f', and {len(diff) - NAMED_OPTIONS} more' if len(diff) > NAMED_OPTIONS else ''})"


def _remove_stale_temporaries(out: Path) -> None:
    """Remove what killed runs left in ``out``: atomic-write temporaries ``.{name}.{pid}.tmp`` (units, masks, the
    assembled files) and assembly folders ``.assemble.{pid}``, of processes that are gone."""
    remove_stale_temps(out)
    remove_stale_temp_dirs(out, ".assemble.")


def _clear_build(out: Path, stamp: Path, overwrite: bool, what: str = "settings", store: Store | None = None) -> None:
    """Remove a previous build's assembled files (the card first), units, masks, fitted model, input index and
    settings stamp from ``out`` and ``store`` (its object-storage copy, if any) (only with ``overwrite``; else an
    error naming the folder and ``what`` differs, or the stored settings)."""
    if not overwrite:
        detail = what if ":" in what else f"{what} ({stamp.read_text().strip()})"
        raise ConfigError(f"{store.url() if store else out} holds a build with other {detail}; use another folder or "
                          "--overwrite")
    # the card first, then the dataset files: a clearing cut short leaves no card describing a build that is gone
    for name in _ASSEMBLED_FIRST_GONE:
        (out / name).unlink(missing_ok=True)
        if store is not None:
            store.remove(name)
    for folder in (out / UNITS_DIR, out / MASK_DIR):
        shutil.rmtree(folder, ignore_errors=True)
    for stale in (*(out / name for name in _STATE_FILES), stamp):
        stale.unlink(missing_ok=True)
    if store is not None:
        for folder in (UNITS_DIR, MASK_DIR):
            store.remove_tree(folder)
        for name in _STATE_FILES:
            store.remove(name)


#: The assembled files in the order a fresh start removes them: the card, then the dataset, then the rest.
_ASSEMBLED_FIRST_GONE: Final[tuple[str, ...]] = ("card.md", DATASET_FILE,
                                                 *(n for n in OUTPUT_FILES if n not in ("card.md", DATASET_FILE)))


#: Files a build writes that another command's folder may hold too (an ILS export, a CheXpercept benchmark).
_SHARED_NAMES: Final[tuple[str, ...]] = ("card.md", "failures.jsonl", DATASET_FILE, "provenance.json")


def _check_foreign(out: Path) -> None:
    """A :class:`ConfigError` when ``out`` holds no build of ours (no ``settings.json``, no ``units/`` of a build
    cut short) but files of the names a build writes, which it would replace (an ``ils export`` folder, a
    CheXpercept benchmark, a user's notes)."""
    clash = [name for name in _SHARED_NAMES if (out / name).exists()]
    if clash and not (out / UNITS_DIR).is_dir():
        raise ConfigError(f"{out} holds {', '.join(clash)} but no ILS build (no settings.json); a build would "
                          "replace them: use a new or empty folder")


#: The build's own state beside the units, copied between an object-storage output and the local stage.
_STATE_FILES = ("settings.json", FITTED_FILE, str(Path(FITTED_FILE).with_suffix(".json")), FITTED_INPUTS, INPUTS_INDEX)


def _stage_path(store: Store) -> Path:
    """Where the local folder of a build on object storage lies (:func:`_stage_for`): under the temporary directory,
    in a folder of this user's own (another user's would not be writable on a shared node); a finished build removes
    it."""
    user = f"-{os.getuid()}" if hasattr(os, "getuid") else ""
    return Path(tempfile.gettempdir()) / f"cxrground-ils-stage{user}" / sha256_json(store.url())[:16]


def _lock_target(out_dir: str | Path) -> Path:
    """What a build into ``out_dir`` locks: the folder, or the local folder of a build on object storage (a lock on
    this machine only)."""
    store = unit_store(str(out_dir))
    return Path(store.root) if store.local else _stage_path(store)


def _stage_for(store: Store) -> Path:
    """The local folder of a build whose output is on object storage (its settings and fitted model), filled
    from the store's copy."""
    stage = _stage_path(store)
    stage.mkdir(parents=True, exist_ok=True)
    for name in _STATE_FILES:
        try:
            atomic_write_bytes(stage / name, store.read_bytes(name))
        except FileNotFoundError:
            (stage / name).unlink(missing_ok=True)
    return stage


def run_needs(spec: BackendSpec, config: IlsConfig | None = None, engine: str = "local") -> list[Need]:
    """The optional libraries every part of a build imports: the segmenters, synthesizer and detector of ``spec``
    (their registered ``needs``), the lesion segmenter of a zone-reader negative check or zone guide and the pose
    reader of ``config``, and Ray for ``engine='ray'``."""
    from cxrground.anatomy.segment import SEGMENTERS
    from cxrground.anatomy.segment.registry import TORCH_WEIGHTS
    from cxrground.ils.spatial import DETECTORS, SYNTHESIZERS

    needs = [SEGMENTERS.need(spec.segmenter), SYNTHESIZERS.need(spec.synthesizer), DETECTORS.need(spec.detector)]
    if spec.qc_segmenter is not None:
        needs.append(SEGMENTERS.need(spec.qc_segmenter))
    if config is not None:
        if config.negative_check.startswith("zone_prior"):
            needs.append(Need(f"the negative check {config.negative_check} (it reads the lesion segmenter)",
                              TORCH_WEIGHTS, "or --negative-check none|algorithm1"))
        if config.zone_guide != "none":
            needs.append(Need(f"the zone guide {config.zone_guide} (it reads the lesion segmenter)", TORCH_WEIGHTS,
                              "or --zone-guide none"))
        if config.qc.pose_warning:
            needs.append(Need("the pose warning (a small CNN reads every film)", TORCH_WEIGHTS,
                              "or build with --no-pose-warning"))
    if engine == "ray":
        needs.append(Need("--engine ray", ("ray",)))
    return needs


def check_backends(spec: BackendSpec, config: IlsConfig | None = None, engine: str = "local") -> None:
    """Raise :class:`ConfigError` for an unknown segmenter, synthesizer or detector, an option it does not take, or
    a detector that cannot be created or run (a missing package or weights file), and a
    :class:`~cxrground.errors.MissingExtraError` naming the extras when a part of the build (:func:`run_needs`:
    the backends, ``config``'s zone readers and pose reader, ``engine``) lacks a library, before any study is
    processed."""
    from cxrground.anatomy.segment import SEGMENTERS
    from cxrground.ils.spatial import DETECTORS, SYNTHESIZERS

    SEGMENTERS.check(spec.segmenter, spec.segmenter_kwargs)
    SYNTHESIZERS.check(spec.synthesizer, spec.synthesizer_kwargs)
    DETECTORS.check(spec.detector, spec.detector_kwargs)
    if spec.qc_segmenter is not None:
        SEGMENTERS.check(spec.qc_segmenter, spec.qc_segmenter_kwargs)
    check_needs(run_needs(spec, config, engine), "ils build")
    try:
        detector = DETECTORS.create(spec.detector, **spec.detector_kwargs)  # e.g. YOLO weights and ultralytics
        ready = getattr(detector, "check_ready", None)
        if callable(ready):
            ready()
    except ImportError as exc:
        raise ConfigError(f"detector {spec.detector!r} needs a package that is not installed ({exc})") from exc


def check_workers(spec: BackendSpec, engine: str, workers: int) -> None:
    """Raise :class:`ConfigError` when a backend of ``spec`` cannot reach the worker processes of ``engine`` (a
    local pool of ``workers`` > 1, or Ray), e.g. one registered from an interactive session, before any study is
    processed."""
    if engine == "local" and workers > 1:
        backend_registrations(spec)
    elif engine == "ray":
        from cxrground.ils.ray_engine import ray_registrations

        ray_registrations(spec)


@locks_output("ils build", "out_dir", _lock_target)
def build_dataset(
    tasks: Iterable[StudyTask],
    out_dir: str | Path,
    config: IlsConfig | None = None,
    spec: BackendSpec | None = None,
    engine: str = "local",
    workers: int = 1,
    scan_failures: Sequence[Failure] = (),
    overwrite: bool = False,
    progress: bool = True,
    truth_cohort: str | Path | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    retry_failed: bool = False,
    ray_address: str | None = None,
    view_table: Mapping[str, Any] | None = None,
    split: Mapping[str, Any] | None = None,
    limit: int | None = None,
    note: Callable[[str], None] | None = None,
) -> BuildSummary:
    """Process all studies (resuming) and assemble the dataset in ``out_dir``.

    ``tasks``: a list, or an iterable in study-key order that can be iterated again; the driver streams it.

    What the backends need from the whole cohort is prepared once, before the workers start
    (:func:`~cxrground.ils.cohort_normative.resolve_spec`: the ``normative`` synthesizer's model fitted on the
    build's report-normal studies, kept in ``out_dir`` for a resumed run).

    A resume needs the same settings and the same effective backends (``settings.json``: config and spec hashes
    and :func:`backends_identity`, which changes with new defaults or weights after an upgrade); otherwise a
    :class:`ConfigError`, or with ``overwrite`` a fresh build in the same folder.

    A resume also compares the inputs. A study whose unit was made from other inputs (another report text, an image
    file of another size or modification time, another chosen image, split or view:
    :func:`~cxrground.ils.tasks.input_fingerprint`) is processed again, its stale unit and masks removed first;
    :attr:`BuildSummary.inputs_changed` counts them, and the provenance and card count every study of the build so
    redone since it began. Units written before units recorded their inputs are kept and counted
    (:attr:`BuildSummary.predating_units`). Studies added since are processed; studies removed since are left out
    of the dataset (their units stay). When the build fitted its normative model on its own studies, a study whose
    film the model read (fitted on or trimmed) that changed or was removed since the fit is a :class:`ConfigError`
    naming it (with ``overwrite``: a fresh build); other studies added, removed or changed since are processed with
    the kept model and counted (:attr:`BuildSummary.fit_inputs_since`, the provenance, the card), since a fresh
    build of these inputs may fit another model (a fitted model without its input set,
    ``OUT/normative_fitted.inputs.jsonl``, from a version that did not keep it, is not checked). Cost: one pass
    over the studies with a fingerprint each (a stat and a report read; 16 at a time) and one read of
    ``OUT/unit_inputs.jsonl`` (:class:`InputIndex`); a unit is read only when the index has no entry for it.

    ``max_pixels``: images whose header states more pixels are recorded as failures without being decoded.
    ``limit``: the ``--limit`` that cut ``tasks`` (None: none), only recorded. Both are part of the settings when
    not the default (the cohort normative model is fitted on the build's studies, and ``max_pixels`` decides which
    studies fail).

    A rerun first removes what killed runs of this folder left: temporary files ``.{name}.{pid}.tmp`` and
    assembly folders ``.assemble.{pid}`` whose process is gone.

    ``truth_cohort``: the synthetic cohort the inputs come from; its exact truth then scores the dataset
    in the card.

    ``retry_failed``: process again the studies whose unit records a failure (a worker that died twice, a file
    unreadable at the time); studies rejected by QC stay as they are. ``ray_address``: see :func:`run_units`.
    ``note`` gets the LLM structurer's retry notes of the pass that structures the reports first
    (:func:`~cxrground.ils.pipeline.prestructure`) and of the studies processed in this process (one local worker);
    given, pool workers and Ray actors print theirs on their stderr, naming the worker (:func:`run_units`). The
    structurer's counters of the run are :attr:`BuildSummary.llm_counts`.

    ``view_table``: the view table that chose each study's image
    (:func:`~cxrground.datasets.views.view_table_record`); its checksum is part of the settings, so a resume with
    another table (or with one where there was none) is refused like other settings, since its studies may now use
    other images. ``split``: where the splits came from (:func:`~cxrground.ils.tasks.split_record`); a split file's
    checksum, or ratios other than the default, are part of the settings too, since every unit records its split.
    """
    config = config or IlsConfig()
    spec = spec or BackendSpec()
    check_backends(spec, config, engine)
    check_workers(spec, engine, workers)
    if engine == "ray" and (ray_address or os.environ.get("RAY_ADDRESS")):
        from cxrground.ils.ray_engine import check_reachable

        check_reachable(ray_address or os.environ["RAY_ADDRESS"])  # before any study is read
    store = unit_store(str(out_dir))
    remote = None if store.local else store
    out = Path(store.root) if store.local else _stage_for(store)  # settings and fitted model live here
    dest: str | Path = out if store.local else store.url()  # units, masks and outputs go here
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    llm_counts: Counter[str] = Counter()  # the LLM structurer's requests, retries, ... of this run
    settings = {"config_hash": config.config_hash(), "spec_hash": spec.resume_hash(), "code": __version__}
    if view_table:
        settings["view_table"] = view_table["sha256"]
    if split and (split.get("sha256") or tuple(split.get("ratios", DEFAULT_SPLIT_RATIOS)) != DEFAULT_SPLIT_RATIOS):
        settings["split"] = split.get("sha256") or ",".join(f"{r:g}" for r in split["ratios"])
    if max_pixels != DEFAULT_MAX_PIXELS:
        settings["max_pixels"] = max_pixels if max_pixels is not None else "none"
    if config.qc.pose_warning:  # units record the reader's warnings: other weights, other records
        settings["pose_reader"] = str(pose_reader_record(pose_reader_at(config.qc.pose_weights).load())["sha256"])[:12]
    if limit is not None:
        settings["limit"] = limit
    stamp = out / "settings.json"
    if store.local:
        _remove_stale_temporaries(out)
    previous = json.loads(stamp.read_text()) if stamp.is_file() else None
    if previous is not None and previous.get("spec_hash") == spec.spec_hash():  # stamped with every option hashed
        previous = {**previous, "spec_hash": settings["spec_hash"]}
    if store.local and previous is None:
        _check_foreign(out)
    if overwrite and (previous is not None or (out / UNITS_DIR).is_dir() or remote is not None):
        _clear_build(out, stamp, overwrite, store=remote)  # --overwrite starts afresh, whatever the settings
        previous = None
    compared = set(settings) | (set(_OPTIONAL_SETTINGS) & set(previous or {}))
    changed = [k for k in sorted(compared) if (previous or {}).get(k) != settings.get(k)]
    if previous is not None and changed:
        detail = {"config_hash": lambda: _option_changes(out, "config", config.to_dict()),
                  "spec_hash": lambda: _option_changes(out, "backend_spec", spec.to_dict())}
        _clear_build(out, stamp, overwrite, "settings: " + ", ".join(
            f"{_SETTING_NAMES.get(k, k)} {_setting_value(k, previous)} then, {_setting_value(k, settings)} now"
            + (detail[k]() if k in detail else "") for k in changed), store=remote)
        previous = None
    # the inputs against those the units (and a cohort-fitted model) were made from
    fitted_inputs = out / FITTED_INPUTS
    compare_fit = _fits_cohort_model(spec) and _fitted_ready(out / FITTED_FILE) and fitted_inputs.is_file()
    index = InputIndex(out / INPUTS_INDEX)
    survey = survey_inputs(tasks, dest, index, fitted_inputs if compare_fit else None, progress)
    gone = sorted(set(survey.fitted_gone) & _fitted_films(out)) if survey.fitted is not None else []
    if gone:
        _clear_build(out, stamp, overwrite, _fitted_change(gone), remote)
        previous, index, survey = None, InputIndex(out / INPUTS_INDEX), InputSurvey()
    # a provenance JSON cannot hold is refused before any film is read (a cohort-fitted synthesizer's once fitted)
    get_backends(spec).provenance(skip=("synthesizer",) if _fits_cohort_model(spec) else ())
    if _fits_cohort_model(spec) and not _fitted_ready(out / FITTED_FILE):
        # the fit below structures reports one at a time: with the LLM structurer and a cache, every pending report
        # is structured first, concurrently, and the fit reads its answers from the cache
        changed, done = set(survey.changed), done_check(dest)
        _add_llm_counts(llm_counts, prestructure((t for t in tasks if t.study_key in changed or not done(t.study_key)),
                                                 config, spec, progress, note))
    # once, before the workers: e.g. the cohort normative model
    run_spec = _resolve(spec, tasks, out, config, progress)
    settings["backends_hash"] = backends_identity(run_spec)
    if previous is not None and previous.get("backends_hash") == backends_identity(run_spec, with_endpoint=True):
        previous = {**previous, "backends_hash": settings["backends_hash"]}  # stamped with the endpoint hashed
    if previous is not None and previous.get("backends_hash") != settings["backends_hash"]:
        # same options, other effective backends (new defaults or weights after an upgrade): never mix the two
        changes = _option_changes(out, "backends", backend_provenance(run_spec))
        _clear_build(out, stamp, overwrite, f"backends: effective backends changed{changes}" if changes
                     else "backends", remote)
        index, survey = InputIndex(out / INPUTS_INDEX), InputSurvey()
        run_spec = _resolve(spec, tasks, out, config, progress)
        settings["backends_hash"] = backends_identity(run_spec)
    rev = _code_version().partition("+g")[2]
    code_then = _other_revision(previous, rev)
    if rev:
        settings["code_revision"] = rev  # recorded, not compared: a resume after a commit warns (code_then)
    atomic_write_text(stamp, json.dumps(settings, sort_keys=True))
    if survey.learned or survey.changed:
        with index.appending() as add:
            for record in survey.learned:
                add(record)
            for key in survey.changed:  # marked before the stale unit goes
                add({"changed": True, "study": key})
    _upload_state(out, remote)
    for key in survey.changed:
        _remove_unit(dest, key)
    if retry_failed:
        clear_failed(tasks, dest)
    # LLM structurer: every report at once
    _add_llm_counts(llm_counts, prestructure(_pending(tasks, dest), config, run_spec, progress, note))
    processed, skipped = run_units(tasks, dest, config, run_spec, engine, workers, progress, max_pixels,
                                   ray_address=ray_address, index=index, note=note, counts=llm_counts)
    index.compact()
    _upload_state(out, remote, (INPUTS_INDEX,))
    result = assemble(dest, tasks, config, spec, scan_failures, backend_provenance(run_spec),
                      Path(truth_cohort) if truth_cohort is not None else None, view_table, split, index.changed,
                      survey.fitted, progress)
    if remote is not None:  # every state file is in the store now; a run cut short keeps it, the next refills it
        shutil.rmtree(out, ignore_errors=True)
    return BuildSummary(str(dest), processed, skipped, result["studies"], result["pairs"], result["failures"],
                        round(time.perf_counter() - started, 2), result["blind_choices"], result["pose_warnings"],
                        len(survey.changed), len(survey.predating), tuple(survey.predating[:NAMED_PREDATING]),
                        dict(survey.fitted) if survey.fitted and any(survey.fitted.values()) else None,
                        result["every_failed"], code_then if skipped else None, rev or None,
                        result["rejections"].get("no pairs", 0), result["first_failure"], result["failed"],
                        dict(llm_counts) if spec.structurer == "llm" else None)


#: What :meth:`~cxrground.reports.structure.LLMStructurer.warm_cache` counts besides the structurer's own counters.
_WARM_COUNTS: Final = frozenset({"reports", "answered", "failed"})


def _add_llm_counts(counts: Counter[str], warmed: Mapping[str, int] | None) -> None:
    """Add the structurer counters of a :func:`~cxrground.ils.pipeline.prestructure` pass (None: none ran) to
    ``counts``."""
    counts.update({k: v for k, v in (warmed or {}).items() if k not in _WARM_COUNTS})


def _other_revision(previous: Mapping[str, Any] | None, rev: str) -> str | None:
    """The git revision the resumed build's earlier units were made with, when it is not ``rev`` (None: no
    earlier build, the same revision, or either side unknown)."""
    then = (previous or {}).get("code_revision")
    return str(then) if then and rev and then != rev else None


def _upload_state(out: Path, remote: Store | None, names: Sequence[str] = _STATE_FILES) -> None:
    """Copy the build's state files ``names`` from the local stage ``out`` to the object-storage output ``remote``
    (nothing when the output is local)."""
    if remote is None:
        return
    for name in names:
        if (out / name).is_file():
            remote.write_bytes(name, (out / name).read_bytes())
