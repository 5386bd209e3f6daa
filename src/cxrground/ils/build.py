"""The ILS build engine: per-study work units, local process pool or Ray, resumable, then assembly.

Each study is processed independently (:func:`cxrground.ils.pipeline.process_study`) with its own
seeded RNG; its mask PNGs are written first and its unit record ``units/{study}.json`` last and
atomically, so a study is done iff its unit file exists. A killed run started again with the same
command processes the remaining studies only. A study whose worker process dies (the OOM killer, SIGKILL) is
recorded as failed ("worker died") in its unit file, the pool is restarted and the rest goes on; while a study
runs in the pool, ``units/{study}.running`` marks it, which is how the dead worker's study is found. Assembly
reads the unit files in study order, so the output is byte-identical whatever the engine, the number of workers
or the interruptions.
:class:`~cxrground.ils.backend_spec.BackendSpec` and ``DATASET_FILE`` (:mod:`cxrground.ils.layout`) are
re-exported here, the build's inputs and output name.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from cxrground import __version__
from cxrground.errors import ConfigError, Failure
from cxrground.ils.backend_spec import BackendSpec
from cxrground.ils.card import read_review_summary, render_card
from cxrground.ils.cohort_normative import FITTED_FILE, resolve_spec
from cxrground.ils.config import IlsConfig
from cxrground.ils.layout import DATASET_FILE, MASK_DIR, UNITS_DIR
from cxrground.ils.pipeline import backend_provenance, process_study
from cxrground.ils.schema import SPLITS, validate_dataset
from cxrground.ils.tasks import StudyTask
from cxrground.io.files import atomic_write_text, sha256_json
from cxrground.io.image import DEFAULT_MAX_PIXELS

__all__ = ["DATASET_FILE", "BackendSpec", "BuildSummary", "assemble", "build_dataset", "check_backends", "run_units"]

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


def _unit_path(out: Path, key: str) -> Path:
    return out / UNITS_DIR / f"{key}.json"


def _running_path(out: Path, key: str) -> Path:
    return out / UNITS_DIR / f"{key}.running"


def _write_unit(out: Path, unit: dict[str, Any], config: IlsConfig, spec: BackendSpec) -> None:
    unit["config_hash"] = config.config_hash()
    unit["spec_hash"] = spec.spec_hash()
    atomic_write_text(_unit_path(out, unit["study_key"]), json.dumps(unit, sort_keys=True))


def _run_one(task: StudyTask, out: str, config: IlsConfig, spec: BackendSpec,
             max_pixels: int | None = DEFAULT_MAX_PIXELS) -> tuple[str, str]:
    """Process one study in the current process and write its outputs; returns (study, status)."""
    unit = process_study(task, Path(out), config, spec, max_pixels=max_pixels)
    _write_unit(Path(out), unit, config, spec)
    return task.study_key, unit["status"]


Runner = Callable[[StudyTask, str, IlsConfig, BackendSpec, "int | None"], tuple[str, str]]


def _run_marked(runner: Runner, task: StudyTask, out: str, config: IlsConfig, spec: BackendSpec,
                max_pixels: int | None) -> tuple[str, str]:
    """``runner`` on one study in a pool worker, with ``units/{study}.running`` present while it runs."""
    marker = _running_path(Path(out), task.study_key)
    atomic_write_text(marker, str(os.getpid()))
    result = runner(task, out, config, spec, max_pixels)
    marker.unlink(missing_ok=True)
    return result


def _record_worker_death(out: Path, task: StudyTask, config: IlsConfig, spec: BackendSpec) -> None:
    """Write the failed unit of a study whose worker process died while processing it."""
    _write_unit(out, {"study_key": task.study_key, "split": task.split, "image_path": task.image_path,
                      "status": "failed", "stage": "worker", "error": "WorkerDied",
                      "reason": "worker died (the process was killed, e.g. by the out-of-memory killer)"}, config, spec)
    _running_path(out, task.study_key).unlink(missing_ok=True)


def _pool_round(todo: Sequence[StudyTask], out: Path, config: IlsConfig, spec: BackendSpec, workers: int,
                max_pixels: int | None, runner: Runner, bar: Any) -> list[StudyTask] | None:
    """Run ``todo`` in one process pool; None when all finished, else the studies running when a worker died."""
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                             initializer=_init_worker, initargs=(worker_threads(),)) as pool:
        futures = [pool.submit(_run_marked, runner, t, str(out), config, spec, max_pixels) for t in todo]
        try:
            for fut in as_completed(futures):
                fut.result()
                bar.update()
        except BrokenProcessPool:
            return [t for t in todo if _running_path(out, t.study_key).is_file()
                    and not _unit_path(out, t.study_key).is_file()]
    return None


def _run_pool(todo: Sequence[StudyTask], out: Path, config: IlsConfig, spec: BackendSpec, workers: int,
              max_pixels: int | None, runner: Runner, bar: Any) -> None:
    """Process ``todo`` in process pools, recording a study whose worker dies and restarting the pool.

    When several studies were running as the pool broke, each is retried alone to find the one that kills its
    worker; a study is recorded as failed only after its own worker died.
    """
    for t in todo:
        _running_path(out, t.study_key).unlink(missing_ok=True)  # stale markers of a killed build
    while todo:
        suspects = _pool_round(todo, out, config, spec, workers, max_pixels, runner, bar)
        if suspects is None:
            return
        if not suspects:
            raise ConfigError("a worker process died before it started a study; rerun with --workers 1 to see why")
        if len(suspects) == 1:
            _record_worker_death(out, suspects[0], config, spec)
            bar.update()
        else:
            for t in suspects:
                _running_path(out, t.study_key).unlink(missing_ok=True)
                if _pool_round([t], out, config, spec, 1, max_pixels, runner, bar) is not None:
                    _record_worker_death(out, t, config, spec)
                    bar.update()
        todo = [t for t in todo if not _unit_path(out, t.study_key).is_file()]


def worker_threads() -> int:
    """torch threads of each local worker process: ``OMP_NUM_THREADS`` (what the CLI's ``--threads`` sets),
    else 1."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS") or 1))
    except ValueError:
        return 1


def _init_worker(threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass


def run_units(
    tasks: Sequence[StudyTask],
    out: Path,
    config: IlsConfig,
    spec: BackendSpec,
    engine: str = "local",
    workers: int = 1,
    progress: bool = True,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    runner: Runner = _run_one,
) -> tuple[int, int]:
    """Process every task whose unit file is missing; returns (processed, skipped).

    ``max_pixels``: images whose header states more pixels fail without being decoded. ``runner``: the per-study
    function of the local engine (picklable; it writes the unit file), ``_run_one`` unless a test injects faults.
    """
    todo = [t for t in tasks if not _unit_path(out, t.study_key).is_file()]
    skipped = len(tasks) - len(todo)
    bar = tqdm(total=len(todo), desc="ils build", unit="study", disable=not progress, dynamic_ncols=True)
    if engine == "local" and workers <= 1:
        for t in todo:
            runner(t, str(out), config, spec, max_pixels)
            bar.update()
    elif engine == "local":
        _run_pool(todo, out, config, spec, workers, max_pixels, runner, bar)
    elif engine == "ray":
        _run_ray(todo, out, config, spec, workers, bar, max_pixels)
    else:
        raise ConfigError(f"unknown engine {engine!r}; use 'local' or 'ray'")
    bar.close()
    return len(todo), skipped


def _run_ray(todo: Sequence[StudyTask], out: Path, config: IlsConfig, spec: BackendSpec, workers: int,
             bar: Any, max_pixels: int | None) -> None:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--engine ray needs the 'ray' package: pip install 'cxrground[ray]'") from exc
    started = not ray.is_initialized()
    if started:
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        remote = ray.remote(num_cpus=1)(_run_one)
        pending = [remote.remote(t, str(out), config, spec, max_pixels) for t in todo]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
            bar.update(len(done))
    finally:
        if started:
            ray.shutdown()


def _code_version() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"{__version__}+g{rev}" if rev else __version__


def _read_units(out: Path, tasks: Iterable[StudyTask]) -> list[dict[str, Any]]:
    units = []
    for t in tasks:
        path = _unit_path(out, t.study_key)
        if path.is_file():
            units.append(json.loads(path.read_text(encoding="utf-8")))
    return units


def assemble(out: Path, tasks: Sequence[StudyTask], config: IlsConfig, spec: BackendSpec,
             scan_failures: Sequence[Failure], backend_provenance: dict[str, Any],
             truth_cohort: Path | None = None) -> dict[str, Any]:
    """Write the JSON, mask index, findings, anatomy, failures, provenance and card from the unit files."""
    units = _read_units(out, sorted(tasks, key=lambda t: t.study_key))
    dataset: dict[str, dict[str, Any]] = {s: {} for s in SPLITS}
    reported: list[tuple[str, bool]] = []
    rejections: Counter = Counter()
    grounding_reasons: Counter = Counter()
    dropped_pairs: Counter = Counter()
    failures = [f.to_dict() for f in scan_failures]
    for f in scan_failures:
        rejections[f"input: {f.reason.split(' (')[0]}"] += 1
    findings_lines, mask_lines, anatomy_lines = [], [], []
    for u in units:
        key = u["study_key"]
        for finding in u.get("findings", []):
            findings_lines.append(json.dumps({"study": key, **finding}, sort_keys=True))
        for m in u.get("masks", []):
            mask_lines.append(json.dumps({"study": key, **m}, sort_keys=True))
        if u.get("anatomy"):
            anatomy_lines.append(json.dumps({"study": key, **u["anatomy"]}, sort_keys=True))
        reported.extend((lesion, bool(got)) for lesion, got in u.get("reported", []))
        for g in u.get("grounding", []):
            if g.get("status") != "grounded":
                grounding_reasons[f"{g.get('lesion')}: {g.get('reason') or g.get('status')}"] += 1
        if u.get("heart_note"):
            grounding_reasons["cardiomegaly: heart estimate implausible"] += 1
        dropped_pairs.update(u.get("dropped_pairs", {}))
        if u["status"] != "ok":
            rejections[u["reason"]] += 1
            failures.append({"path": u.get("image_path", key), "stage": u.get("stage", "build"),
                             "reason": u["reason"], "error": u.get("error", u["status"]), "study": key,
                             **({"file": u["file"]} if u.get("file") else {})})
            continue
        study = u["study"]
        pairs = study["instruction_answer_pairs"]
        if not pairs["positive_pairs"] and not pairs["negative_pairs"]:
            rejections["no pairs"] += 1
            continue
        dataset[u["split"]][key] = study
    problems = validate_dataset(dataset, out / MASK_DIR)
    if problems:
        raise ConfigError("generated dataset fails its own schema check: " + "; ".join(problems[:5]))
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
    }
    atomic_write_text(out / DATASET_FILE, json.dumps(dataset, ensure_ascii=False))
    atomic_write_text(out / "findings.jsonl", "".join(line + "\n" for line in findings_lines))
    atomic_write_text(out / "masks.jsonl", "".join(line + "\n" for line in mask_lines))
    atomic_write_text(out / "anatomy.jsonl", "".join(line + "\n" for line in anatomy_lines))
    atomic_write_text(out / "failures.jsonl", "".join(json.dumps(f, sort_keys=True) + "\n" for f in failures))
    atomic_write_text(out / "provenance.json", json.dumps(provenance, indent=2, sort_keys=True))
    extra: list[str] = []
    if truth_cohort is not None:
        from cxrground.ils.quality import format_findings_quality, format_quality, score_against_truth, score_findings

        extra = ["## Quality against the synthetic cohort's exact truth (test data)", "",
                 f"Cohort: `{truth_cohort}`. Masks vs the drawn lesions, negatives vs lesion-free truth:", "",
                 format_quality(score_against_truth(out, truth_cohort)), "",
                 "Structured findings vs the report truth (present/uncertain findings per study and lesion):", "",
                 format_findings_quality(score_findings(out, truth_cohort)), ""]
    atomic_write_text(out / "card.md", render_card(dataset, reported, rejections, provenance, extra,
                                                   dict(grounding_reasons), read_review_summary(out),
                                                   dict(dropped_pairs)))
    return {"dataset": dataset, "failures": failures, "reported": reported, "rejections": dict(rejections)}


def backends_identity(spec: BackendSpec) -> str:
    """Short hash of what the backends of ``spec`` actually are (:func:`backend_provenance`: settings with their
    defaults, weights' sha256, methods); file-system paths are left out, so a moved folder or install keeps it."""
    return sha256_json(_without_paths(backend_provenance(spec)), default=str)[:12]


def _without_paths(value: Any) -> Any:
    """``value`` with every absolute file-system path string removed (recursively)."""
    if isinstance(value, dict):
        return {k: _without_paths(v) for k, v in value.items() if not _is_abs_path(v)}
    if isinstance(value, list | tuple):
        return [_without_paths(v) for v in value if not _is_abs_path(v)]
    return value


def _is_abs_path(value: Any) -> bool:
    return isinstance(value, str) and Path(value).is_absolute()


def _clear_build(out: Path, stamp: Path, overwrite: bool, what: str = "settings") -> None:
    """Remove a previous build's units, masks, fitted model and settings stamp from ``out`` (only with
    ``overwrite``; else an error naming the folder and the stored settings)."""
    if not overwrite:
        raise ConfigError(f"{out} holds a build with other {what} ({stamp.read_text().strip()}); "
                          "use another folder or --overwrite")
    import shutil

    for folder in (out / UNITS_DIR, out / MASK_DIR):
        shutil.rmtree(folder, ignore_errors=True)
    for stale in (out / FITTED_FILE, (out / FITTED_FILE).with_suffix(".json"), stamp):
        stale.unlink(missing_ok=True)


def check_backends(spec: BackendSpec) -> None:
    """Raise :class:`ConfigError` for an unknown segmenter, synthesizer or detector, or an option it does not take."""
    from cxrground.anatomy.segment import SEGMENTERS
    from cxrground.ils.spatial import DETECTORS, SYNTHESIZERS

    SEGMENTERS.check(spec.segmenter, spec.segmenter_kwargs)
    SYNTHESIZERS.check(spec.synthesizer, spec.synthesizer_kwargs)
    DETECTORS.check(spec.detector, spec.detector_kwargs)
    if spec.qc_segmenter is not None:
        SEGMENTERS.check(spec.qc_segmenter, spec.qc_segmenter_kwargs)


def build_dataset(
    tasks: Sequence[StudyTask],
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
) -> BuildSummary:
    """Process all studies (resuming) and assemble the dataset in ``out_dir``.

    What the backends need from the whole cohort is prepared once, before the workers start
    (:func:`~cxrground.ils.cohort_normative.resolve_spec`: the ``normative`` synthesizer's model fitted on the
    build's report-normal studies, kept in ``out_dir`` for a resumed run).

    A resume needs the same settings and the same effective backends (``settings.json``: config and spec hashes
    and :func:`backends_identity`, which changes with new defaults or weights after an upgrade); otherwise a
    :class:`ConfigError`, or with ``overwrite`` a fresh build in the same folder.

    ``max_pixels``: images whose header states more pixels are recorded as failures without being decoded.

    ``truth_cohort``: the synthetic cohort the inputs come from; its exact truth then scores the dataset
    in the card.
    """
    config = config or IlsConfig()
    spec = spec or BackendSpec()
    check_backends(spec)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    settings = {"config_hash": config.config_hash(), "spec_hash": spec.spec_hash()}
    stamp = out / "settings.json"
    previous = json.loads(stamp.read_text()) if stamp.is_file() else None
    if previous is not None and {k: previous.get(k) for k in settings} != settings:
        _clear_build(out, stamp, overwrite)
        previous = None
    # once, before the workers: e.g. the cohort normative model
    run_spec = resolve_spec(spec, tasks, out, config, progress)
    settings["backends_hash"] = backends_identity(run_spec)
    if previous is not None and previous.get("backends_hash") != settings["backends_hash"]:
        # same options, other effective backends (new defaults or weights after an upgrade): never mix the two
        _clear_build(out, stamp, overwrite, "backends")
        run_spec = resolve_spec(spec, tasks, out, config, progress)
        settings["backends_hash"] = backends_identity(run_spec)
    atomic_write_text(stamp, json.dumps(settings, sort_keys=True))
    processed, skipped = run_units(tasks, out, config, run_spec, engine, workers, progress, max_pixels)
    result = assemble(out, tasks, config, spec, scan_failures, backend_provenance(run_spec),
                      Path(truth_cohort) if truth_cohort is not None else None)
    n_pairs = sum(len(s["instruction_answer_pairs"]["positive_pairs"]) + len(s["instruction_answer_pairs"]
                  ["negative_pairs"]) for split in result["dataset"].values() for s in split.values())
    return BuildSummary(str(out), processed, skipped, sum(len(v) for v in result["dataset"].values()), n_pairs,
                        len(result["failures"]), round(time.perf_counter() - started, 2))
