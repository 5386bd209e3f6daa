"""The CheXpercept benchmark builder (``cxrground percept build``, CHEXPERCEPT.md §1-§12).

Flow: candidates and review (:mod:`cxrground.percept.cases`) → per accepted positive a *plan unit*
(§5-§9 via :func:`cxrground.percept.revision.plan_revision`, plus the Stage-4 answers) → RF/RR split → seeded
balanced sample → per sampled case its images and its JSON entry → ``chexpercept.json``,
``deformation_results.json``, ``failures.jsonl``, ``card.md`` and ``MANIFEST.sha256``.

* Randomness: every case draws from generators seeded by ``(seed, key_id, purpose)``
  (:func:`cxrground.percept.cases.seeded_rng`); the sample from ``(seed, lesion, path)``.
* Resumability: plan units and finished cases are written atomically under ``BENCH/.work/`` (file names are
  the neutral case ids) and reused by a rerun with the same settings; ``.work`` is deleted after a complete
  build unless ``keep_work``. A finished build keeps its settings in ``build_settings.json`` (written just
  before ``MANIFEST.sha256``, the last file) with the SHA-256 of the files it read (:func:`input_digests`). A rerun
  into a folder holding another build's settings (finished or not) is refused naming the changed settings unless
  ``overwrite``; the same settings and input files on a finished folder (the files perhaps named by other paths)
  is a no-op ("already built") when its films are unchanged too (``films`` of ``build_settings.json``: each film's
  SHA-256, read again to compare), and the same settings with other input files or films are refused naming them.
  An unfinished build resumes with the files as they are now: its plan units are keyed by what they are made of,
  and ``.work/films.jsonl`` (:class:`~cxrground.io.film_ledger.FilmLedger`) records each film when first read, so
  the plans and cases of a film changed since are made again.
* ``overwrite`` first deletes the old build's top-level files (``MANIFEST.sha256`` and ``chexpercept.json``
  first), then ``cases/`` and ``.work/``: a build killed after that leaves no ``chexpercept.json`` pointing at
  deleted cases, and a rerun resumes the new build.
* Workers: a spawn process pool over cases (``workers > 1``); outputs do not depend on the worker count.
* Output is byte-identical for the same inputs and seed: JSON with sorted keys, floats rounded to 6 decimals,
  PNGs without metadata, manifest sorted by path.
* Neutral names (§10.3): ``cases/c{first 12 hex of sha256(f"{seed}{key_id}")}/stage1.png``, ``stage2.png``,
  ``stage3_points.png``, ``stage3_option_{k}.png``.

This module orchestrates; the steps live in :mod:`.options` (settings), :mod:`.plans` (phase 1),
:mod:`.case_files` (phase 2), :mod:`.card`, :mod:`.manifest` and :mod:`.layout` (file names, stable JSON).
:class:`~cxrground.percept.options.BuildOptions` is re-exported here, the build's input.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from cxrground import __version__
from cxrground.errors import ConfigError, InputError
from cxrground.extras import check_needs
from cxrground.ils.layout import DATASET_FILE, MASK_DIR
from cxrground.ils.predictions import Prediction, load_predictions
from cxrground.ils.schema import SPLITS, iter_dataset, read_dataset
from cxrground.io.files import atomic_write_text, sha256_file, sha256_json
from cxrground.io.film_ledger import FilmLedger, FilmState
from cxrground.io.image import check_out_folder
from cxrground.io.output_lock import locks_output
from cxrground.io.progress import progress_bar
from cxrground.io.workers import stop_workers, worker_pool
from cxrground.percept.card import render_card
from cxrground.percept.case_files import CaseTask, case_failure, render_case
from cxrground.percept.cases import (
    SAMPLE_PATHS,
    Candidate,
    balanced_sample,
    count_arithmetic,
    negative_candidates,
    positive_candidates,
    read_review,
    split_rf_rr,
)
from cxrground.percept.deform import DEFORMERS
from cxrground.percept.layout import (
    BUILD_SETTINGS_FILE,
    CARD_FILE,
    CASES_DIR,
    DEFORMATION_FILE,
    FAILURES_FILE,
    MANIFEST_FILE,
    WORK_DIR,
    case_folder,
    stable_json,
)
from cxrground.percept.manifest import manifest_lines
from cxrground.percept.options import BuildOptions
from cxrground.percept.plans import PLAN_STAGES, PlanTask, anatomy_lookup, plan_case
from cxrground.percept.schema import BENCHMARK_FILE
from cxrground.registry import Backend, check_portable
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.percept_templates import PATH_LESION_FREE, PATH_REVISION_FREE, PATH_REVISION_REQUIRED
from cxrground.vocab.traits import traits

__all__ = ["ESTIMATED_HEART", "BuildOptions", "BuildSummary", "build_benchmark", "instruction_warnings"]

#: The drop reason of a cardiomegaly positive whose heart mask is an estimate (``heart_source`` ``estimate`` in
#: the anatomy record) with ``drop_estimated_hearts``: its mask would be shown as the "optimal" heart contour.
ESTIMATED_HEART: Final[str] = "heart mask is an estimate, not a segmented heart (--drop-estimated-hearts)"


@dataclass(frozen=True)
class BuildSummary:
    """What a build produced."""

    out_dir: str
    cases: int
    items: int
    planned: int
    reused: int
    failures: int
    seconds: float
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    already_built: bool = False
    requested: int = 0  # cases requested (§1.4), 0 when not known
    top_drops: tuple[tuple[str, int], ...] = ()  # the commonest drop reasons with their counts
    films_changed: int = 0  # films changed since an unfinished build read them (their cases made again)
    films_compared: int | None = None  # already built: films found the same (None: the build did not record them)


# --- pool -------------------------------------------------------------------------------------------

def _init_worker(deformers: Sequence[Backend[Any]] = ()) -> None:
    """A pool worker's set-up: one thread, and the deformer registrations of the build (one registered at run time
    included: a spawned worker knows only the backends registered on import)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for entry in deformers:
        DEFORMERS.add(entry, replace=True)


def _run_pool(fn: Callable[..., Any], tasks: Sequence[Any], arg: str, workers: int, desc: str,
              progress: bool, deformers: Sequence[Backend[Any]] = ()) -> None:
    bar = progress_bar(total=len(tasks), desc=desc, unit="case", progress=progress, dynamic_ncols=True)
    if workers <= 1 or len(tasks) <= 1:
        for t in tasks:
            fn(t, arg)
            bar.update()
    else:
        with worker_pool(workers, _init_worker, (tuple(deformers),)) as pool:
            try:
                for fut in as_completed([pool.submit(fn, t, arg) for t in tasks]):
                    fut.result()
                    bar.update()
            except KeyboardInterrupt:  # the workers ignore Ctrl-C: end them
                stop_workers(pool)
                raise
    bar.close()


# --- the build --------------------------------------------------------------------------------------

#: Study fields the candidates read (:mod:`cxrground.percept.cases`); pair targets must be the 7 lesions.
_STUDY_FIELDS = ("image_path", "dicom_id")


def _dataset_file(ils: Path) -> Path:
    return ils / DATASET_FILE if ils.is_dir() else ils


def _reason_key(reason: str) -> str:
    """How the card groups a drop reason: section references and component numbers left out, a case's own details
    in parentheses shown as ``(…)``, the cause kept
    (``deformation failed: a component could not be deformed: no overlapping anatomy``)."""
    head, _, cause = reason.partition(": ") if reason.startswith("deformation failed: ") else ("", "", reason)
    cause = re.sub(r"optimal_component_\d+", "a component", cause)
    cause = re.sub(r" \(§[\d.]+\)", "", cause)
    cause = re.sub(r"\([^()]*\)", "(…)", cause)  # shapes, sizes, paths: one key for every case
    return f"{head}: {cause}" if head else cause


def _check_settings(opts: BuildOptions, dataset: Any, ils_file: Path) -> None:
    """Raise :class:`ConfigError` for settings the build cannot use: a ratio outside [0, 1] or of an unknown lesion,
    a negative count, a split without studies (``--split all`` takes the splits the dataset has; a split named
    otherwise must hold studies)."""
    for ratio in (opts.rf_ratio, *opts.rf_ratios.values()):
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"--rf-ratio must be in [0, 1], got {ratio}")
    unknown_lesions = sorted(set(opts.rf_ratios) - set(LESIONS))
    if unknown_lesions:
        raise ConfigError(f"--rf-ratio: unknown lesion(s) {', '.join(unknown_lesions)}")
    if opts.deformer == "sam" and not opts.sam_model:
        raise ConfigError("--deformer sam needs --sam-model PATH (a local SAM checkpoint folder)")
    if "model_path" in opts.deformer_opt:
        raise ConfigError("--deformer-opt model_path: give the SAM folder as --sam-model")
    DEFORMERS.check(opts.deformer, [*opts.deformer_opt, *(["model_path"] if opts.deformer == "sam" else [])])
    check_needs([DEFORMERS.need(opts.deformer)], "percept build")  # before any case is made
    for name, value in (("--max-candidates", opts.max_candidates), ("--max-negatives", opts.max_negatives)):
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
    if not isinstance(dataset, dict):
        raise InputError("not an ILS dataset: expected a JSON object of splits", ils_file)
    sizes = {split: len(studies) for split, studies in dataset.items() if isinstance(studies, dict) and studies}
    every = tuple(opts.splits) == tuple(SPLITS)  # --split all: the splits the dataset has
    unknown = [split for split in opts.splits if split not in sizes and not (every and split in SPLITS)]
    if not opts.splits or unknown:
        counted = Counter(split for split, _key, _study in iter_dataset(ils_file, ()))
        have = ", ".join(f"{split} ({n} stud{'y' if n == 1 else 'ies'})" for split, n in counted.items()) or "none"
        raise ConfigError(f"--split {','.join(unknown) or '(none)'}: no study of {ils_file} is in this split; "
                          f"its splits: {have}")


def _asked(preds: Mapping[str, Prediction], positives: Sequence[Candidate]) -> tuple[list[Candidate], int, int]:
    """Of the positives with a predicted mask: those asked another instruction than their §2 candidate instruction,
    how many record none, and how many there are."""
    have = [(c, preds[c.pair_id]) for c in positives if c.pair_id in preds and preds[c.pair_id].has_mask]
    other = [c for c, p in have if p.instruction is not None and p.instruction != c.instruction]
    return other, sum(p.instruction is None for _c, p in have), len(have)


def instruction_warnings(path: Path, preds: Mapping[str, Prediction], positives: Sequence[Candidate]) -> list[str]:
    """A warning when candidate masks of ``path`` were predicted for another instruction than the candidate's
    CheXpercept instruction (§2), or do not record theirs (empty when every predicted mask records it)."""
    other, unknown, n = _asked(preds, positives)
    if not other and not unknown:
        return []
    example = (f" (e.g. {other[0].key_id}: {preds[other[0].pair_id].instruction!r}, §2: {other[0].instruction!r})"
               if other else "")
    return [f"--candidates {path}: {len(other)} of {n} candidate masks were predicted for another "
            f"instruction than the CheXpercept candidate instruction (§2){example} and {unknown} do not record "
            "theirs; `ils predict` asks each pair's own instruction, `percept candidates` asks §2's"]


def _asked_candidate_instruction(preds: Mapping[str, Prediction], positives: Sequence[Candidate]) -> str:
    """How many predicted candidate masks were asked the §2 candidate instruction, for the card."""
    other, unknown, n = _asked(preds, positives)
    return f"{n - len(other) - unknown} of {n} predicted for the §2 candidate instruction"


#: The build's top-level outputs, deleted by ``overwrite`` in this order (the manifest and the benchmark file first).
_TOP_FILES = (MANIFEST_FILE, BENCHMARK_FILE, BUILD_SETTINGS_FILE, CARD_FILE, DEFORMATION_FILE, FAILURES_FILE)


def _settings_record(opts: BuildOptions, ils_file: Path) -> dict[str, Any]:
    """The build's settings, their hash, the SHA-256 of the files it reads (``inputs``) and the hash of both with
    the fingerprinted files' paths left out and the image folder resolved (``content_hash``: the same dataset named
    by another path is the same build; another image folder is another build)."""
    settings = json.loads(json.dumps(asdict(opts)))
    inputs = input_digests(opts, ils_file)
    # the films are compared by their SHA-256 (``films`` of the finished record); their folder counts too
    content = {**{k: v for k, v in settings.items() if k not in _PATH_SETTINGS},
               "images": str(Path(opts.images).resolve())}
    return {"settings_hash": opts.settings_hash(), "settings": settings, "inputs": inputs,
            "content_hash": sha256_json({"settings": content, "inputs": inputs})[:16]}


#: Settings that are paths: where an input is, not what it holds (:func:`input_digests` fingerprints the files;
#: the image folder is compared resolved).
_PATH_SETTINGS: Final[frozenset[str]] = frozenset({"ils", "images", "candidates", "review", "anatomy"})


def input_digests(opts: BuildOptions, ils_file: Path) -> dict[str, str | None]:
    """SHA-256 of the files a build reads besides the films: the ILS dataset file, its ``anatomy.jsonl`` (or the
    ``--anatomy`` file), the ``--candidates`` and ``--review`` files (None: not given; a folder of anatomy masks is
    not fingerprinted)."""
    anatomy = Path(opts.anatomy) if opts.anatomy else ils_file.parent / "anatomy.jsonl"
    return {"ils": sha256_file(ils_file),
            "anatomy": sha256_file(anatomy) if anatomy.is_file() else None,
            "candidates": sha256_file(opts.candidates) if opts.candidates else None,
            "review": sha256_file(opts.review) if opts.review else None}


def _same_build(prior: dict[str, Any] | None, now: dict[str, Any]) -> bool:
    """Whether the recorded build ``prior`` is the one ``now`` asks for: the same settings and inputs (a build made
    before inputs were recorded: the same settings), or the same settings and inputs named by other paths."""
    if prior is None:
        return False
    if prior.get("content_hash") == now["content_hash"]:
        return True
    return prior["settings_hash"] == now["settings_hash"] and "inputs" not in prior


def _changed_inputs(prior: dict[str, Any] | None, now: dict[str, Any]) -> str | None:
    """Which input files changed since the build ``prior`` with the same settings but for paths (None when none or
    not known)."""
    if prior is None or not isinstance(prior.get("inputs"), dict) or not isinstance(prior.get("settings"), dict):
        return None
    if any(prior["settings"].get(k) != v for k, v in now["settings"].items() if k not in _PATH_SETTINGS):
        return None
    old = prior["inputs"]
    keys = [k for k in now["inputs"] if old.get(k) != now["inputs"][k]]
    return ", ".join(f"{k} {str(old.get(k))[:12]} -> {str(now['inputs'][k])[:12]}" for k in keys) or None


def _read_settings(path: Path) -> dict[str, Any] | None:
    """The settings record at ``path``, or None when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("settings_hash"), str) else None


def _changed(prior: dict[str, Any] | None, now: dict[str, Any]) -> str:
    """Which settings differ, for the refusal message."""
    if prior is None:
        return "its settings are not recorded"
    old = prior.get("settings")
    if not isinstance(old, dict):
        return f"settings hash {prior['settings_hash']} vs {now['settings_hash']}"
    keys = sorted(k for k in set(old) | set(now["settings"]) if old.get(k) != now["settings"].get(k))
    if not keys:
        return f"settings hash {prior['settings_hash']} vs {now['settings_hash']}"
    return "changed: " + ", ".join(f"{k} {old.get(k)!r} -> {now['settings'].get(k)!r}" for k in keys)


def _clear_build(out: Path) -> None:
    """Delete the build in ``out`` (``overwrite``): the top-level files first, then ``cases/`` and ``.work/``."""
    for name in _TOP_FILES:
        (out / name).unlink(missing_ok=True)
    for name in (CASES_DIR, WORK_DIR):
        if (out / name).exists():
            shutil.rmtree(out / name)


#: The build's film ledger under ``.work`` (:class:`~cxrground.io.film_ledger.FilmLedger`, paths relative to the
#: image folder): what each film was when the build first read it.
FILMS_LEDGER: Final[str] = "films.jsonl"


def _refresh_films(work: Path, ledger: FilmLedger, images_root: Path, tasks: Sequence[PlanTask | CaseTask],
                   progress: bool, recorded: bool) -> int:
    """Record in the build's film ``ledger`` the films ``tasks`` read, and remove the plan and case results (under
    ``work``) of the candidates on a film that changed, went or appeared since the build read it, so they are made
    again; returns how many films changed, went or appeared. ``recorded``: whether the ledger was kept from the
    start of the build (a build begun by a version that kept none has its films recorded as they are now)."""
    by_film: dict[str, list[str]] = {}
    for t in tasks:
        by_film.setdefault(t.cand.image_path, []).append(t.case_id)
    changed = 0
    for rel, case_ids in progress_bar(by_film.items(), desc="percept films", unit="film", progress=progress,
                                      dynamic_ncols=True):
        verdict = ledger.compare(rel, images_root / rel)
        made = [work / kind / f"{case_id}.json" for case_id in case_ids for kind in ("plans", "cases")]
        # unrecorded with results: the film could not be found when its case was made (it is back now)
        if verdict in ("changed", "missing") or (verdict == "unrecorded" and recorded and (images_root / rel).is_file()
                                                 and any(p.is_file() for p in made)):
            changed += 1
            for path in made:
                path.unlink(missing_ok=True)
        if verdict == "missing":
            ledger.forget(rel)  # made again as a failure; found again later, it is made again from the film
        elif verdict != "same":
            with contextlib.suppress(OSError):  # a film that cannot be read: its task records the failure
                ledger.record(rel, FilmState.of(images_root / rel))
    return changed


def _same_films(out: Path, prior: dict[str, Any] | None, images_root: Path, progress: bool) -> int | None:
    """How many films the finished build ``prior`` recorded, all found unchanged under ``images_root`` (None: it
    recorded none); a :class:`ConfigError` naming the first film that differs or is gone."""
    films = (prior or {}).get("films")
    if not isinstance(films, dict):
        return None
    differ = []
    for rel, digest in progress_bar(films.items(), desc="compare films", unit="film", progress=progress,
                                    dynamic_ncols=True):
        try:
            now = sha256_file(images_root / rel)
        except OSError:
            now = None
        if now != digest:
            differ.append(rel)
    if differ:
        raise ConfigError(f"{out} holds a benchmark built with these settings from other films ({len(differ)} of "
                          f"{len(films)} differ or are gone under {images_root}, e.g. {differ[0]}); --overwrite "
                          "rebuilds it from the films as they are now")
    return len(films)


def _already_built(out: Path, started: float, films: int | None) -> BuildSummary:
    """The summary of a finished benchmark rebuilt with its own settings: nothing is recomputed."""
    from cxrground.percept.schema import load_benchmark

    achieved: dict[str, dict[str, int]] = {lesion: dict.fromkeys(SAMPLE_PATHS, 0) for lesion in LESIONS}
    for key, case in load_benchmark(out).cases.items():
        achieved[case.lesion_of(key)][case.path(key)] += 1
    failures = (out / FAILURES_FILE).read_text(encoding="utf-8").splitlines() if (out / FAILURES_FILE).is_file() \
        else []
    table = count_arithmetic(achieved)
    return BuildSummary(str(out), table.cxrs, table.items, 0, 0, len(failures),
                        round(time.perf_counter() - started, 2), achieved, already_built=True, films_compared=films)


#: Names only a CheXpercept build writes (one of them is left by any build, even one killed by ``--overwrite``).
_BUILD_MARKS: Final[tuple[str, ...]] = (BENCHMARK_FILE, BUILD_SETTINGS_FILE, WORK_DIR, CASES_DIR, DEFORMATION_FILE,
                                        MANIFEST_FILE)


def _check_out(out: Path, ils_dir: Path, images_root: Path) -> None:
    """A :class:`ConfigError` for an output folder that is the ILS dataset's folder, lies inside the image folder
    (its case images would be read as films), or holds files but no CheXpercept build (a build would replace its
    ``card.md`` and ``failures.jsonl``)."""
    if out.resolve() == ils_dir.resolve():
        raise ConfigError(f"--out {out} is the ILS dataset's folder (--ils); write the benchmark to another folder")
    check_out_folder(out, images_root)
    if out.is_dir() and any(out.iterdir()) and not any((out / name).exists() for name in _BUILD_MARKS):
        raise ConfigError(f"--out {out} is not empty and holds no CheXpercept build; write the benchmark to a new "
                          "or empty folder")


#: How many candidates' images :func:`_check_images_root` looks for.
IMAGES_PROBED = 20


def _check_images_root(images_root: Path, candidates: Sequence[Candidate]) -> None:
    """Raise a :class:`ConfigError` when none of the first :data:`IMAGES_PROBED` candidates' images is under
    ``images_root`` (a wrong --images would otherwise drop every case as "file not found")."""
    probe = candidates[:IMAGES_PROBED]
    if probe and not any((images_root / c.image_path).is_file() for c in probe):
        raise ConfigError(f"--images {images_root}: none of the first {len(probe)} candidates' images is there "
                          f"(e.g. {images_root / probe[0].image_path}); --images must be the folder the dataset's "
                          "image_path values are relative to")


def _check_candidates(path: Path, preds: dict[str, Any], positives: Sequence[Candidate]) -> None:
    """Raise a :class:`ConfigError` when the ``--candidates`` file ``path`` has a mask for none of the dataset's
    positive candidates (every positive case would be dropped)."""
    if positives and not any((p := preds.get(c.pair_id)) is not None and p.has_mask for c in positives):
        raise ConfigError(f"--candidates {path} has a mask for none of the {len(positives)} positive candidates "
                          f"(e.g. pair {positives[0].pair_id}; the file has {len(preds)} pair(s)): every positive "
                          "case would be dropped. It must hold masks for this dataset's pairs: `ils predict` "
                          "output, or the candidates.jsonl of `review export --masks` from a review that imported "
                          "this dataset's positive pairs")


@locks_output("percept build", "out_dir")
def build_benchmark(opts: BuildOptions, out_dir: str | Path, workers: int = 1, progress: bool = True,
                    overwrite: bool = False, keep_work: bool = False) -> BuildSummary:
    """Build (or resume) the benchmark in ``out_dir``; see the module docstring."""
    started = time.perf_counter()
    out = Path(out_dir)
    work = out / WORK_DIR
    ils_file = _dataset_file(Path(opts.ils))
    ils_dir = ils_file.parent
    dataset = read_dataset(ils_file, _STUDY_FIELDS, LESIONS, splits=opts.splits)  # only the splits it draws from
    _check_settings(opts, dataset, ils_file)
    positives = positive_candidates(dataset, opts.splits, opts.max_candidates)
    every_positive = [c for cs in positives.values() for c in cs]
    pos_cxrs = {c.dicom_id for c in every_positive} if opts.exclude_positive_cxrs else set()
    negatives = negative_candidates(dataset, opts.splits, opts.max_negatives, pos_cxrs,
                                    clear_lungs=not opts.lf_any_film)
    images_root = Path(opts.images)
    _check_out(out, ils_dir, images_root)
    _check_images_root(images_root, every_positive + [c for cs in negatives.values() for c in cs])
    preds = load_predictions(opts.candidates) if opts.candidates else None
    warnings: list[str] = []
    if preds is not None:
        _check_candidates(Path(opts.candidates), preds, every_positive)
        warnings.extend(instruction_warnings(Path(opts.candidates), preds, every_positive))
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    deformers = (DEFORMERS.get(opts.deformer),) if workers > 1 else ()
    for entry in deformers:  # before any case: one the worker processes cannot import is refused here
        check_portable("deformer", entry)
    review = read_review(opts.review) if opts.review else None
    anatomy_of = anatomy_lookup(opts.anatomy, ils_dir)  # inputs checked before the settings stamp is written
    stamp = work / "settings.json"
    settings = _settings_record(opts, ils_file)
    finished = out / BUILD_SETTINGS_FILE
    if not stamp.is_file() and ((out / BENCHMARK_FILE).is_file() or finished.is_file()):
        prior = _read_settings(finished)
        if not overwrite:
            if _same_build(prior, settings) and (out / MANIFEST_FILE).is_file():
                return _already_built(out, started, _same_films(out, prior, images_root, progress))
            changed = _changed_inputs(prior, settings)
            if changed:
                raise ConfigError(f"{out} holds a benchmark built with these settings from other input files (SHA-256 "
                                  f"changed: {changed}); --overwrite rebuilds it from the files as they are now")
            raise ConfigError(f"{out} holds a finished benchmark built with other settings "
                              f"({_changed(prior, settings)}); use another folder or --overwrite")
        _clear_build(out)
    elif stamp.is_file():
        prior = _read_settings(stamp)
        if prior is None or not (_same_build(prior, settings) or prior["settings_hash"] == settings["settings_hash"]):
            if not overwrite:
                raise ConfigError(f"{out} holds an unfinished build with other settings "
                                  f"({_changed(prior, settings)}); rerun it with its settings to finish it, use "
                                  "another folder or --overwrite")
            _clear_build(out)
        elif prior.get("code") != __version__:  # its plans and cases may differ from this version's
            if not overwrite:
                raise ConfigError(f"{out} holds an unfinished build of cxrground version {prior.get('code', 'unknown')}"
                                  f" (this is {__version__}); finish it with that version, use another folder or "
                                  "--overwrite")
            _clear_build(out)
    elif overwrite:
        _clear_build(out)
    atomic_write_text(stamp, json.dumps({**settings, "code": __version__}, sort_keys=True))

    mask_source = (f"ILS model predictions `{opts.candidates}` (pair_id → mask; "
                   f"{_asked_candidate_instruction(preds, every_positive)})" if preds is not None
                   else f"the dataset's own masks (`seg_mask_path` under `{ils_dir / MASK_DIR}`)")
    if not any(positives.values()) and not any(negatives.values()):
        warnings.append(f"no candidate (positive or negative pair) in split(s) {', '.join(opts.splits)} of "
                        f"{ils_file}: the benchmark is empty")
    failures: list[dict[str, Any]] = []
    dropped: Counter = Counter()

    def drop(c: Candidate, stage: str, reason: str) -> None:
        failures.append({"key_id": c.key_id, "lesion": c.lesion, "stage": stage, "reason": reason})
        dropped[f"{stage}: {_reason_key(reason)}"] += 1

    def reviewed(cands: Iterable[Candidate]) -> list[Candidate]:
        kept = []
        for c in cands:
            if review is None or review.accepted(c.key_id):
                kept.append(c)
            else:
                drop(c, "review", f"review {review.status(c.key_id)}")
        return kept

    plan_tasks: list[PlanTask] = []
    accepted_pos: dict[str, list[Candidate]] = {}
    kwargs = {**opts.deformer_opt, **({"model_path": opts.sam_model} if opts.deformer == "sam" else {})}
    for lesion in LESIONS:
        accepted_pos[lesion] = []
        for c in reviewed(positives[lesion]):
            if preds is not None:
                pred = preds.get(c.pair_id)
                if pred is None or not pred.has_mask:
                    drop(c, "candidate", "no predicted mask for this pair")
                    continue
                ref: Any = pred.rle if pred.rle is not None else str(pred.mask_path)
                src = "predictions"
            else:
                ref = str(ils_dir / MASK_DIR / c.seg_mask_path) if c.seg_mask_path else None
                src = "dataset"
            anatomy = anatomy_of(c)
            if (anatomy is not None and anatomy.heart_source == "estimate" and opts.drop_estimated_hearts
                    and traits(lesion).percept.deform == "organ"):
                drop(c, "anatomy", ESTIMATED_HEART)
                continue
            accepted_pos[lesion].append(c)
            plan_tasks.append(PlanTask(c, case_folder(opts.seed, c.key_id), str(images_root / c.image_path), src,
                                        ref, anatomy, opts.seed, opts.deformer, kwargs, opts.strict_negatives,
                                        opts.cpa_either_side, None if anatomy is not None else anatomy_of.missing(c)))
    recorded = (work / FILMS_LEDGER).is_file() or not any((work / "plans").glob("*.json"))
    if recorded:  # from here on the ledger is kept (even before a film could be read)
        (work / FILMS_LEDGER).parent.mkdir(parents=True, exist_ok=True)
        (work / FILMS_LEDGER).touch()
    ledger = FilmLedger(work / FILMS_LEDGER)
    films_changed = _refresh_films(work, ledger, images_root, plan_tasks, progress, recorded)
    todo = [t for t in plan_tasks if not (work / "plans" / f"{t.case_id}.json").is_file()]
    _run_pool(plan_case, todo, str(work), workers, "percept plan", progress, deformers)

    units: dict[str, dict[str, Any]] = {}
    pools: dict[tuple[str, str], list[Candidate]] = {}
    for t in plan_tasks:
        units[t.cand.key_id] = json.loads((work / "plans" / f"{t.case_id}.json").read_text(encoding="utf-8"))
    for lesion in LESIONS:
        ok = []
        for c in accepted_pos[lesion]:
            u = units[c.key_id]
            if u["status"] == "ok":
                ok.append(c)
            else:
                drop(c, u["stage"] if u.get("stage") in PLAN_STAGES else "deformation", u["reason"])
                if u.get("path"):
                    failures[-1]["path"] = u["path"]
        rf, rr = split_rf_rr(ok, opts.rf_ratio_of(lesion))
        pools[(lesion, PATH_REVISION_FREE)] = rf
        pools[(lesion, PATH_REVISION_REQUIRED)] = rr
        pools[(lesion, PATH_LESION_FREE)] = reviewed(negatives[lesion])
    requested = dict(zip(SAMPLE_PATHS, opts.per_lesion, strict=True))
    sample = balanced_sample(pools, requested, opts.seed)

    used_cxrs = {c.dicom_id for cands in sample.values() for c in cands}
    chosen = {key: {c.key_id for c in cands} for key, cands in sample.items()}
    taken = {lesion: {p: sum(1 for c in pools[(lesion, p)] if c.dicom_id in used_cxrs
                             and c.key_id not in chosen[(lesion, p)]) for p in SAMPLE_PATHS}
             for lesion in LESIONS}
    sampled = {lesion: {p: len(sample[(lesion, p)]) for p in SAMPLE_PATHS} for lesion in LESIONS}
    case_tasks = [CaseTask(c, case_folder(opts.seed, c.key_id), path, str(images_root / c.image_path))
                  for (lesion, path), cands in sample.items() for c in cands]
    films_changed += _refresh_films(work, ledger, images_root, case_tasks, progress, recorded)
    ctodo = [t for t in case_tasks if not (work / "cases" / f"{t.case_id}.json").is_file()]
    _run_pool(render_case, ctodo, str(out), workers, "percept cases", progress)

    entries = {t.case_id: json.loads((work / "cases" / f"{t.case_id}.json").read_text(encoding="utf-8"))
               for t in case_tasks}
    for t in case_tasks:
        failure = case_failure(entries[t.case_id])
        if failure is not None:
            drop(t.cand, failure["stage"], failure["reason"])
            failures[-1]["path"] = failure["path"]
    case_tasks = [t for t in case_tasks if case_failure(entries[t.case_id]) is None]
    keep = {t.case_id for t in case_tasks}
    if (out / CASES_DIR).is_dir():
        for folder in (out / CASES_DIR).iterdir():
            if folder.name not in keep:
                shutil.rmtree(folder)
    bench: dict[str, Any] = {}
    deformation: dict[str, Any] = {}
    achieved: dict[str, dict[str, int]] = {lesion: dict.fromkeys(SAMPLE_PATHS, 0) for lesion in LESIONS}
    ious: list[float] = []
    covers: list[float] = []
    mask_sources: set[str] = set()
    for t in case_tasks:
        bench[t.cand.key_id] = entries[t.case_id]
        achieved[t.cand.lesion][t.path] += 1
        if t.path != PATH_LESION_FREE:
            u = units[t.cand.key_id]
            deformation[t.cand.key_id] = u["record"]
            ious.append(float(u["candidate_iou"]))
            mask_sources.add(u.get("mask_source", ""))
            if u.get("max_negative_coverage") is not None:
                covers.append(float(u["max_negative_coverage"]))
    split_of = Counter(t.cand.split for t in case_tasks)
    hearts = Counter((a.heart_source or "not recorded") if (a := anatomy_of(t.cand)) is not None else "none given"
                     for t in case_tasks if t.path != PATH_LESION_FREE)
    pool_sizes = {lesion: {p: len(pools[(lesion, p)]) for p in SAMPLE_PATHS} for lesion in LESIONS}
    atomic_write_text(out / BENCHMARK_FILE, stable_json(bench))
    atomic_write_text(out / DEFORMATION_FILE, stable_json(deformation))
    atomic_write_text(out / FAILURES_FILE, "".join(stable_json(f, indent=None) for f in
                                                   sorted(failures, key=lambda f: (f["lesion"], f["key_id"]))))
    atomic_write_text(out / CARD_FILE, render_card(opts, achieved, dropped, review, ious,
                                                   max(covers) if covers else None, mask_source, split_of,
                                                   pool_sizes, taken, sampled, hearts,
                                                   [tuple(e["image_size"]) for e in bench.values()],
                                                   bench.values()))
    films = {t.cand.image_path: state.sha256 for t in [*plan_tasks, *case_tasks]
             if (state := ledger.get(t.cand.image_path)) is not None}
    atomic_write_text(out / BUILD_SETTINGS_FILE, stable_json({**settings, "films": dict(sorted(films.items()))}))
    atomic_write_text(out / MANIFEST_FILE, "".join(line + "\n" for line in manifest_lines(out)))
    reused = len(plan_tasks) - len(todo)
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    table = count_arithmetic(achieved)
    return BuildSummary(str(out), table.cxrs, table.items, len(todo), reused, len(failures),
                        round(time.perf_counter() - started, 2), achieved, tuple(warnings),
                        requested=len(LESIONS) * sum(opts.per_lesion), top_drops=tuple(dropped.most_common(3)),
                        films_changed=films_changed)
