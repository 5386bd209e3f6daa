"""The CheXpercept benchmark builder (``cxrground percept build``, CHEXPERCEPT.md §1-§12).

Flow: candidates and review (:mod:`cxrground.percept.cases`) → per accepted positive a *plan unit*
(§5-§9 via :func:`cxrground.percept.revision.plan_revision`, plus the Stage-4 answers) → RF/RR split → seeded
balanced sample → per sampled case its images and its JSON entry → ``chexpercept.json``,
``deformation_results.json``, ``failures.jsonl``, ``card.md`` and ``MANIFEST.sha256``.

* Randomness: every case draws from generators seeded by ``(seed, key_id, purpose)``
  (:func:`cxrground.percept.cases.seeded_rng`); the sample from ``(seed, lesion, path)``.
* Resumability: plan units and finished cases are written atomically under ``BENCH/.work/`` (file names are
  the neutral case ids) and reused by a rerun with the same settings; ``.work`` is deleted after a complete
  build unless ``keep_work``. A rerun into a folder holding another build's settings needs ``overwrite``.
* Workers: a spawn process pool over cases (``workers > 1``); outputs do not depend on the worker count.
* Output is byte-identical for the same inputs and seed: JSON with sorted keys, floats rounded to 6 decimals,
  PNGs without metadata, manifest sorted by path.
* Neutral names (§10.3): ``cases/c{first 12 hex of sha256(f"{seed}{key_id}")}/stage1.png``, ``stage2.png``,
  ``stage3_points.png``, ``stage3_option_{k}.png``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from tqdm.auto import tqdm

from cxrground.errors import ConfigError, InputError
from cxrground.ils.frames import to_native
from cxrground.ils.predictions import load_predictions
from cxrground.ils.schema import load_dataset
from cxrground.io.image import read_image
from cxrground.io.masks import decode_rle, encode_rle, read_mask_png
from cxrground.percept.attributes import attribute_qas
from cxrground.percept.cases import (
    SAMPLE_PATHS,
    TASKS,
    Candidate,
    Review,
    balanced_sample,
    count_arithmetic,
    negative_candidates,
    positive_candidates,
    read_review,
    seeded_rng,
    split_rf_rr,
)
from cxrground.percept.qa import CaseImages, lesion_free_case, positive_case
from cxrground.percept.render import draw_points, gray_rgb, mask_overlay, write_png
from cxrground.percept.schema import BENCHMARK_FILE
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.percept_templates import (
    PATH_ABBREVIATIONS,
    PATH_LESION_FREE,
    PATH_REVISION_FREE,
    PATH_REVISION_REQUIRED,
)

__all__ = [
    "CARD_FILE",
    "DEFORMATION_FILE",
    "FAILURES_FILE",
    "MANIFEST_FILE",
    "BuildOptions",
    "BuildSummary",
    "build_benchmark",
    "case_folder",
    "manifest_lines",
    "plan_unit",
    "stable_json",
]

DATASET_FILE: Final[str] = "mimic_ils_instruction_answer.json"
CARD_FILE: Final[str] = "card.md"
MANIFEST_FILE: Final[str] = "MANIFEST.sha256"
DEFORMATION_FILE: Final[str] = "deformation_results.json"
FAILURES_FILE: Final[str] = "failures.jsonl"
WORK_DIR: Final[str] = ".work"
CASES_DIR: Final[str] = "cases"
#: Refinement backend named in the card (§6 allows the non-SAM fallback when it is named).
REFINEMENT_BACKEND: Final[str] = "non-SAM fallback (§6: holes filled, 15 px disc closing then opening @1024)"
_FLOAT_DIGITS: Final[int] = 6


@dataclass(frozen=True)
class BuildOptions:
    """Every setting of one build (written to the card; its hash guards resumption)."""

    ils: str
    images: str
    candidates: str | None = None
    review: str | None = None
    per_lesion: tuple[int, int, int] = (100, 100, 100)
    rf_ratio: float = 0.5
    deformer: str = "builtin"
    sam_model: str | None = None
    anatomy: str | None = None
    splits: tuple[str, ...] = ("train",)
    seed: int = 0
    max_candidates: int = 3000
    max_negatives: int = 100
    exclude_positive_cxrs: bool = False
    strict_negatives: bool = False

    def settings_hash(self) -> str:
        """Hash of the settings that change the output (not paths of the output or worker counts)."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


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


# --- small helpers ---------------------------------------------------------------------------------

def _stable(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        return round(float(value), _FLOAT_DIGITS)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, Mapping):
        return {str(k): _stable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_stable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _stable(value.tolist())
    return value


def stable_json(value: Any, indent: int | None = 1) -> str:
    """JSON with sorted keys and floats rounded to 6 decimals (byte-stable across runs)."""
    return json.dumps(_stable(value), sort_keys=True, indent=indent, ensure_ascii=False) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def case_folder(seed: int, key: str) -> str:
    """Neutral case folder name ``c{first 12 hex of sha256(f"{seed}{key_id}")}`` (§10.3)."""
    return "c" + hashlib.sha256(f"{seed}{key}".encode()).hexdigest()[:12]


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = int((a | b).sum())
    return int((a & b).sum()) / union if union else 1.0


# --- anatomy ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Anatomy:
    right: dict | str
    left: dict | str
    heart: dict | str | None
    right_cxas: dict | str | None
    left_cxas: dict | str | None
    shape: tuple[int, int] | None


def _load_anatomy_file(path: Path) -> dict[str, _Anatomy]:
    out: dict[str, _Anatomy] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise InputError("anatomy file not found", path) from exc
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            key = rec.get("study") or rec["dicom_id"]
            shape = (int(rec["height"]), int(rec["width"])) if "height" in rec else None
            out[key] = _Anatomy(rec["right_lung"], rec["left_lung"], rec.get("heart"), rec.get("right_lung_cxas"),
                                rec.get("left_lung_cxas"), shape)
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InputError(f"line {lineno}: not an anatomy record ({exc!r})", path) from exc
    return out


def _anatomy_from_dir(folder: Path, keys: Sequence[str]) -> _Anatomy | None:
    for key in keys:
        right, left = folder / f"{key}_right_lung.png", folder / f"{key}_left_lung.png"
        if right.is_file() and left.is_file():
            extra = [folder / f"{key}_{name}.png" for name in ("heart", "right_lung_cxas", "left_lung_cxas")]
            heart, rc, lc = (str(p) if p.is_file() else None for p in extra)
            return _Anatomy(str(right), str(left), heart, rc, lc, None)
    return None


def _mask(ref: dict | str | None, shape: tuple[int, int]) -> np.ndarray | None:
    if ref is None:
        return None
    if isinstance(ref, str):
        return read_mask_png(ref, shape)
    return decode_rle(ref, shape)


# --- plan units (phase 1) ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _PlanTask:
    cand: Candidate
    case_id: str
    image: str
    mask_source: str
    mask_ref: str | dict | None
    anatomy: _Anatomy | None
    seed: int
    deformer: str
    deformer_kwargs: dict[str, Any]
    strict_negatives: bool


def _read_candidate(task: _PlanTask, shape: tuple[int, int]) -> np.ndarray:
    if task.mask_ref is None:
        raise InputError(f"no candidate mask for pair {task.cand.pair_id}")
    if isinstance(task.mask_ref, dict):
        return decode_rle(task.mask_ref, shape)
    mask = read_mask_png(task.mask_ref)
    if mask.shape != shape:  # released-frame masks (512² stretched): the recorded inverse transform, ils.frames
        mask = to_native(mask, shape)
    return mask


def plan_unit(plan: Any, candidate: np.ndarray) -> dict[str, Any]:
    """The JSON-ready summary of a ``RevisionPlan`` that the QA assembly and rendering need."""
    return {
        "status": "ok",
        "shape": list(plan.optimal.shape),
        "optimal": encode_rle(plan.optimal),
        "shown": encode_rle(plan.shown),
        "candidate_iou": _iou(np.asarray(candidate, bool), np.asarray(plan.optimal, bool)),
        "deformed": bool(plan.deformed),
        "revision_before_masks": list(plan.revision_before_masks),
        "revision_after_masks": list(plan.revision_after_masks),
        "point_options": [[None if p is None else [int(p[0]), int(p[1])], c] for p, c in plan.point_options],
        "expansion_answer": [int(i) for i in plan.expansion_answer],
        "contraction_answer": [int(i) for i in plan.contraction_answer],
        "expansion_colors": list(plan.expansion_colors),
        "contraction_colors": list(plan.contraction_colors),
        "mask_options": [{"type": o.type, "masks": list(o.masks), "mask": encode_rle(np.asarray(o.mask, bool))}
                         for o in plan.mask_options],
        "revision_answer": int(plan.revision_answer),
        "true_masks": {str(k): list(v) for k, v in plan.true_masks.items()},
        "fake_masks": {str(k): list(v) for k, v in plan.fake_masks.items()},
        "true_combination": list(plan.true_combination),
        "fake_combinations": [list(c) for c in plan.fake_combinations],
        "overlaps": [o.to_dict() for o in plan.overlaps],
        "record": plan.record,
        "refinement_backend": str(getattr(plan, "refinement_backend", "") or REFINEMENT_BACKEND),
        "deformation_backend": str(getattr(plan, "deformation_backend", "") or ""),
    }


def _make_plan(task: _PlanTask) -> dict[str, Any]:
    from cxrground.anatomy.overlap import ComponentOverlap
    from cxrground.percept.deform.registry import get_deformer
    from cxrground.percept.revision import LungSources, RevisionFailure, plan_revision

    try:
        image = read_image(task.image).pixels
        shape = (int(image.shape[0]), int(image.shape[1]))
        if task.anatomy is None:
            raise InputError(f"no anatomy masks for study {task.cand.study}")
        if task.anatomy.shape is not None and task.anatomy.shape != shape:
            raise InputError(f"anatomy size {task.anatomy.shape} differs from the image size {shape}", task.image)
        right, left = _mask(task.anatomy.right, shape), _mask(task.anatomy.left, shape)
        rc, lc = _mask(task.anatomy.right_cxas, shape), _mask(task.anatomy.left_cxas, shape)
        assert right is not None and left is not None
        lungs = LungSources(right=right & rc if rc is not None else right, left=left & lc if lc is not None else left,
                            right_chex=right, left_chex=left, right_cxas=rc if rc is not None else right,
                            left_cxas=lc if lc is not None else left, heart=_mask(task.anatomy.heart, shape))
        candidate = _read_candidate(task, shape)
        deformer = get_deformer(task.deformer, **task.deformer_kwargs)
        plan = plan_revision(image, task.cand.lesion, candidate, lungs, deformer,
                             seeded_rng(task.seed, task.cand.key_id, "plan"))
        if not plan.deformed:
            raise RevisionFailure("deformation failed: no deformation step was made")
    except (InputError, RevisionFailure) as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        return {"status": "failed", "reason": str(reason), "stage": type(exc).__name__}
    unit = plan_unit(plan, candidate)
    records = [ComponentOverlap.from_dict(o) for o in unit["overlaps"]]
    attrs = attribute_qas(records, task.cand.lesion, seeded_rng(task.seed, task.cand.key_id, "attributes"),
                          task.strict_negatives)
    unit["attributes"] = None if attrs is None else attrs.qa
    unit["max_negative_coverage"] = None if attrs is None else attrs.max_negative_coverage
    unit["mask_source"] = task.mask_source
    return unit


def _plan_one(task: _PlanTask, work: str) -> tuple[str, str]:
    unit = _make_plan(task)
    unit["key_id"] = task.cand.key_id
    _write_atomic(Path(work) / "plans" / f"{task.case_id}.json", stable_json(unit, indent=None))
    return task.case_id, unit["status"]


# --- case rendering (phase 2) -------------------------------------------------------------------------

@dataclass(frozen=True)
class _CaseTask:
    cand: Candidate
    case_id: str
    path: str
    image: str


def _render_one(task: _CaseTask, out: str) -> tuple[str, str]:
    root = Path(out)
    folder = root / CASES_DIR / task.case_id
    rel = f"{CASES_DIR}/{task.case_id}"
    image = read_image(task.image).pixels
    shape = (int(image.shape[0]), int(image.shape[1]))
    write_png(folder / "stage1.png", gray_rgb(image))
    c = task.cand
    if task.path == PATH_LESION_FREE:
        entry = lesion_free_case(c.lesion, c.pair_id, c.dicom_id, task.case_id, shape,
                                 CaseImages(stage1=f"{rel}/stage1.png"))
    else:
        unit = json.loads((root / WORK_DIR / "plans" / f"{task.case_id}.json").read_text(encoding="utf-8"))
        rr = task.path == PATH_REVISION_REQUIRED
        shown = decode_rle(unit["shown"], shape)
        write_png(folder / "stage2.png", mask_overlay(image, shown if rr else decode_rle(unit["optimal"], shape)))
        points = [(p, col) for p, col in unit["point_options"] if p is not None]
        write_png(folder / "stage3_points.png", draw_points(mask_overlay(image, shown), points))
        options = []
        for k, opt in enumerate(unit["mask_options"], start=1):
            write_png(folder / f"stage3_option_{k}.png", mask_overlay(image, decode_rle(opt["mask"], shape)))
            options.append(f"{rel}/stage3_option_{k}.png")
        images = CaseImages(stage1=f"{rel}/stage1.png", stage2=f"{rel}/stage2.png",
                            stage3_points=f"{rel}/stage3_points.png", options=tuple(options))
        entry = positive_case(c.lesion, c.pair_id, c.dicom_id, task.case_id, task.path, shape, unit,
                              unit.get("attributes"), images)
    _write_atomic(root / WORK_DIR / "cases" / f"{task.case_id}.json", stable_json(entry, indent=None))
    return task.case_id, task.path


# --- pool -------------------------------------------------------------------------------------------

def _init_worker() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _run_pool(fn: Callable[..., Any], tasks: Sequence[Any], arg: str, workers: int, desc: str,
              progress: bool) -> None:
    bar = tqdm(total=len(tasks), desc=desc, unit="case", disable=not progress, dynamic_ncols=True)
    if workers <= 1 or len(tasks) <= 1:
        for t in tasks:
            fn(t, arg)
            bar.update()
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                 initializer=_init_worker) as pool:
            for fut in as_completed([pool.submit(fn, t, arg) for t in tasks]):
                fut.result()
                bar.update()
    bar.close()


# --- manifest ---------------------------------------------------------------------------------------

def _files(root: Path) -> list[str]:
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel != MANIFEST_FILE and not rel.startswith(WORK_DIR + "/"):
            out.append(rel)
    return sorted(out)


def manifest_lines(root: str | Path) -> list[str]:
    """``{sha256}  {path}`` for every file of the benchmark except the manifest itself and ``.work/``."""
    root = Path(root)
    return [f"{hashlib.sha256((root / rel).read_bytes()).hexdigest()}  {rel}" for rel in _files(root)]


# --- card -------------------------------------------------------------------------------------------

def _arith_table(per_lesion: Sequence[int]) -> list[str]:
    lf, rf, rr = per_lesion
    table = count_arithmetic(per_lesion)
    lung = table.items_per_lesion["pneumonia"]
    card = table.items_per_lesion["cardiomegaly"]
    return [
        "| quantity | arithmetic | total |", "|---|---|---|",
        f"| CXRs (one per case) | {len(LESIONS)} lesions × {lf + rf + rr:,} cases | **{table.cxrs:,}** |",
        f"| items, each lung lesion | {lf}×1 (LF) + {rf}×(1+1+4) (RF) + {rr}×(1+1+3+4) (RR) | {lung:,} |",
        f"| items, cardiomegaly | {lf}×1 + {rf}×2 + {rr}×(1+1+3) | {card:,} |",
        f"| all items | {len(LESIONS) - 1} × {lung:,} + {card:,} | **{table.items:,}** |", "",
        "| task | count |", "|---|---|",
        *(f"| {t} | {n:,} |" for t, n in table.tasks.items()), ""]


def _card(opts: BuildOptions, achieved: Mapping[str, Mapping[str, int]], dropped: Mapping[str, int],
          review: Review | None, ious: Sequence[float], max_cover: float | None, mask_source: str,
          split_of: Mapping[str, int], pools: Mapping[str, Mapping[str, int]]) -> str:
    table = count_arithmetic(achieved)
    req = dict(zip(SAMPLE_PATHS, opts.per_lesion, strict=True))
    lines = ["# CheXpercept benchmark card", "",
             "Built by `cxrground percept build` following CHEXPERCEPT.md. Seed "
             f"{opts.seed}; settings hash `{opts.settings_hash()}`.", "",
             f"## Requested arithmetic (§1.4) for (LF, RF, RR) = {tuple(opts.per_lesion)} per lesion", ""]
    lines += _arith_table(opts.per_lesion)
    lines += ["## Achieved counts", "",
              f"Cases: **{table.cxrs:,}** (one CXR per case, no CXR reused); items: **{table.items:,}**.", "",
              "| lesion | LF requested | LF achieved | RF requested | RF achieved | RR requested | RR achieved "
              "| eligible LF / RF / RR | items |", "|---|---|---|---|---|---|---|---|---|"]
    for lesion in LESIONS:
        row = achieved.get(lesion, {})
        pool = pools.get(lesion, {})
        cells = " | ".join(f"{req[p]:,} | {row.get(p, 0):,}" for p in SAMPLE_PATHS)
        elig = " / ".join(f"{pool.get(p, 0):,}" for p in SAMPLE_PATHS)
        lines.append(f"| {lesion} | {cells} | {elig} | {table.items_per_lesion[lesion]:,} |")
    lines += ["", "### Items per lesion, path and task (achieved)", "",
              "| lesion | path | cases | " + " | ".join(TASKS) + " |", "|---|---|---|" + "---|" * len(TASKS)]
    for lesion in LESIONS:
        for path in SAMPLE_PATHS:
            n = achieved.get(lesion, {}).get(path, 0)
            one = count_arithmetic({lesion: {path: n}}).tasks
            lines.append(f"| {lesion} | {PATH_ABBREVIATIONS[path]} | {n:,} | "
                         + " | ".join(f"{one[t]:,}" for t in TASKS) + " |")
    lines += ["", "| task | count (achieved) |", "|---|---|", *(f"| {t} | {n:,} |" for t, n in table.tasks.items())]
    iou_text = ("no positive case" if not ious else
                f"mean {statistics.fmean(ious):.3f}, median {statistics.median(ious):.3f}, "
                f"min {min(ious):.3f}, max {max(ious):.3f} over {len(ious)} positive cases")
    review_text = ("**No expert review was applied**: every candidate mask and every negative was taken as is."
                   if review is None else
                   f"Expert review applied from `{review.source}`: only items with an explicit `accept` are used; "
                   f"{sum(1 for d, _ in review.decisions.values() if d == 'accept')} accepted, "
                   f"{sum(1 for d, _ in review.decisions.values() if d == 'reject')} rejected, "
                   f"{sum(1 for d, _ in review.decisions.values() if not d)} blank rows; reviewers: "
                   f"{', '.join(sorted({r for _, r in review.decisions.values() if r})) or '(none named)'}.")
    lines += ["", "## Provenance and backends", "",
              f"- Source splits read: {', '.join(opts.splits)} (candidates per split: "
              f"{', '.join(f'{k}: {v}' for k, v in sorted(split_of.items())) or 'none'}). The reference drew "
              "from MIMIC-ILS train, on which its candidate model was trained.",
              f"- Candidate masks: {mask_source}.",
              "- Lung/heart masks for the geometry (§5.1): "
              + (f"`{opts.anatomy}` (given with --anatomy)." if opts.anatomy else
                 "the ILS dataset's `anatomy.jsonl` (the backends that built it)."),
              f"- Refinement: {REFINEMENT_BACKEND}.",
              f"- Deformer: `{opts.deformer}`" + (f" (SAM weights `{opts.sam_model}`)" if opts.sam_model else "") + ".",
              f"- RF ratio {opts.rf_ratio}; candidates per lesion ≤ {opts.max_candidates}; negatives per lesion ≤ "
              f"{opts.max_negatives}; exclude CXRs of positives from negatives: {opts.exclude_positive_cxrs}.",
              "- Final sample: seeded uniform sample per lesion and path (shuffle seeded by (seed, lesion, path), "
              "taken in order skipping CXRs already used), one CXR per case, no CXR reused across cases.",
              f"- Seed: {opts.seed}.", "",
              "## Review status", "", review_text, "",
              "## Optimal vs candidate mask (§19.6)", "",
              f"IoU between the refined (optimal) mask and the candidate mask: {iou_text}.", "",
              "## Location distractors (§9.4)", "",
              "Maximum coverage of any negative location option used: "
              + ("n/a" if max_cover is None else f"{max_cover:.3f}")
              + f" (strict switch ≤ 0.05: {'on' if opts.strict_negatives else 'off'}).", "",
              "## Dropped candidates, by reason", "", "| reason | cases |", "|---|---|"]
    for reason, n in sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| {reason} | {n:,} |")
    if not dropped:
        lines.append("| (none) | 0 |")
    lines += ["", "Per-case reasons are in `failures.jsonl`.", ""]
    return "\n".join(lines)


# --- the build --------------------------------------------------------------------------------------

def _dataset_file(ils: Path) -> Path:
    return ils / DATASET_FILE if ils.is_dir() else ils


def _anatomy_lookup(opts: BuildOptions, ils_dir: Path) -> Callable[[Candidate], _Anatomy | None]:
    source = Path(opts.anatomy) if opts.anatomy else ils_dir / "anatomy.jsonl"
    if source.is_dir():
        return lambda c: _anatomy_from_dir(source, [c.study, c.dicom_id, Path(c.image_path).stem])
    table = _load_anatomy_file(source)
    return lambda c: table.get(c.study) or table.get(c.dicom_id)


def _reason_key(reason: str) -> str:
    return reason.split(" (")[0]


def build_benchmark(opts: BuildOptions, out_dir: str | Path, workers: int = 1, progress: bool = True,
                    overwrite: bool = False, keep_work: bool = False) -> BuildSummary:
    """Build (or resume) the benchmark in ``out_dir``; see the module docstring."""
    started = time.perf_counter()
    out = Path(out_dir)
    work = out / WORK_DIR
    ils_file = _dataset_file(Path(opts.ils))
    ils_dir = ils_file.parent
    dataset = load_dataset(ils_file)
    if not 0.0 <= opts.rf_ratio <= 1.0:
        raise ConfigError(f"--rf-ratio must be in [0, 1], got {opts.rf_ratio}")
    if opts.deformer == "sam" and not opts.sam_model:
        raise ConfigError("--deformer sam needs --sam-model PATH (a local SAM checkpoint folder)")
    stamp = work / "settings.json"
    settings = {"settings_hash": opts.settings_hash()}
    if stamp.is_file() and json.loads(stamp.read_text()) != settings:
        if not overwrite:
            raise ConfigError(f"{out} holds a build with other settings; use another folder or --overwrite")
        shutil.rmtree(work)
    if overwrite and (out / CASES_DIR).exists() and not stamp.is_file():
        shutil.rmtree(out / CASES_DIR)
    _write_atomic(stamp, json.dumps(settings, sort_keys=True))

    review = read_review(opts.review) if opts.review else None
    preds = load_predictions(opts.candidates) if opts.candidates else None
    mask_source = (f"ILS model predictions `{opts.candidates}` (pair_id → mask)" if preds is not None
                   else f"the dataset's own masks (`seg_mask_path` under `{ils_dir / 'lesion_mask'}`)")
    anatomy_of = _anatomy_lookup(opts, ils_dir)
    positives = positive_candidates(dataset, opts.splits, opts.max_candidates)
    pos_cxrs = {c.dicom_id for cs in positives.values() for c in cs} if opts.exclude_positive_cxrs else set()
    negatives = negative_candidates(dataset, opts.splits, opts.max_negatives, pos_cxrs)
    images_root = Path(opts.images)
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

    plan_tasks: list[_PlanTask] = []
    accepted_pos: dict[str, list[Candidate]] = {}
    kwargs = {"model_path": opts.sam_model} if opts.deformer == "sam" else {}
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
                ref = str(ils_dir / "lesion_mask" / c.seg_mask_path) if c.seg_mask_path else None
                src = "dataset"
            accepted_pos[lesion].append(c)
            plan_tasks.append(_PlanTask(c, case_folder(opts.seed, c.key_id), str(images_root / c.image_path), src,
                                        ref, anatomy_of(c), opts.seed, opts.deformer, kwargs, opts.strict_negatives))
    todo = [t for t in plan_tasks if not (work / "plans" / f"{t.case_id}.json").is_file()]
    _run_pool(_plan_one, todo, str(work), workers, "percept plan", progress)

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
                drop(c, "deformation", u["reason"])
        rf, rr = split_rf_rr(ok, opts.rf_ratio)
        pools[(lesion, PATH_REVISION_FREE)] = rf
        pools[(lesion, PATH_REVISION_REQUIRED)] = rr
        pools[(lesion, PATH_LESION_FREE)] = reviewed(negatives[lesion])
    requested = dict(zip(SAMPLE_PATHS, opts.per_lesion, strict=True))
    sample = balanced_sample(pools, requested, opts.seed)

    case_tasks = [_CaseTask(c, case_folder(opts.seed, c.key_id), path, str(images_root / c.image_path))
                  for (lesion, path), cands in sample.items() for c in cands]
    ctodo = [t for t in case_tasks if not (work / "cases" / f"{t.case_id}.json").is_file()]
    _run_pool(_render_one, ctodo, str(out), workers, "percept cases", progress)

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
        bench[t.cand.key_id] = json.loads((work / "cases" / f"{t.case_id}.json").read_text(encoding="utf-8"))
        achieved[t.cand.lesion][t.path] += 1
        if t.path != PATH_LESION_FREE:
            u = units[t.cand.key_id]
            deformation[t.cand.key_id] = u["record"]
            ious.append(float(u["candidate_iou"]))
            mask_sources.add(u.get("mask_source", ""))
            if u.get("max_negative_coverage") is not None:
                covers.append(float(u["max_negative_coverage"]))
    split_of = Counter(c.split for cs in sample.values() for c in cs)
    pool_sizes = {lesion: {p: len(pools[(lesion, p)]) for p in SAMPLE_PATHS} for lesion in LESIONS}
    _write_atomic(out / BENCHMARK_FILE, stable_json(bench))
    _write_atomic(out / DEFORMATION_FILE, stable_json(deformation))
    _write_atomic(out / FAILURES_FILE, "".join(stable_json(f, indent=None) for f in
                                               sorted(failures, key=lambda f: (f["lesion"], f["key_id"]))))
    _write_atomic(out / CARD_FILE, _card(opts, achieved, dropped, review, ious, max(covers) if covers else None,
                                         mask_source, split_of, pool_sizes))
    _write_atomic(out / MANIFEST_FILE, "".join(line + "\n" for line in manifest_lines(out)))
    reused = len(plan_tasks) - len(todo)
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    table = count_arithmetic(achieved)
    return BuildSummary(str(out), table.cxrs, table.items, len(todo), reused, len(failures),
                        round(time.perf_counter() - started, 2), achieved)
