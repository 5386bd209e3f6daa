"""Phase 1 of the CheXpercept build: one *plan unit* per accepted positive (CHEXPERCEPT.md §5-§9 and Stage 4).

A plan unit is the JSON-ready summary of :func:`cxrground.percept.revision.plan_revision` (optimal and shown
masks, deformation record, points and mask options) plus the attribute QAs; it is written atomically to
``BENCH/.work/plans/{case_id}.json`` so that a rerun reuses it. Lung/heart masks come from an
:class:`AnatomySource` (the ILS dataset's ``anatomy.jsonl``, another JSONL file or a folder of PNGs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.errors import BackendError, InputError
from cxrground.ils.frames import RELEASED_SIZE, to_native
from cxrground.io.files import atomic_write_text
from cxrground.io.image import read_image
from cxrground.io.masks import decode_rle, encode_rle, read_mask_png
from cxrground.percept.attributes import attribute_qas
from cxrground.percept.cases import Candidate, seeded_rng
from cxrground.percept.layout import stable_json

__all__ = [
    "LUNG_EDGE_BAND",
    "LUNG_EDGE_MAX",
    "PLAN_STAGES",
    "REFINEMENT_BACKEND",
    "AnatomyLookup",
    "AnatomySource",
    "MissingAnatomy",
    "PlanTask",
    "anatomy_lookup",
    "lung_edge_problem",
    "make_plan",
    "plan_case",
    "plan_unit",
]

#: Refinement backend named in the card (§6 allows the non-SAM fallback when it is named).
REFINEMENT_BACKEND: Final[str] = "non-SAM fallback (§6: holes filled, 15 px disc closing then opening @1024)"


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = int((a | b).sum())
    return int((a & b).sum()) / union if union else 1.0


@dataclass(frozen=True)
class AnatomySource:
    """One study's lung/heart masks: RLE records or PNG paths (``None``: not given)."""

    right: dict | str
    left: dict | str
    heart: dict | str | None
    right_cxas: dict | str | None
    left_cxas: dict | str | None
    shape: tuple[int, int] | None
    heart_source: str | None = None
    """Where the heart mask comes from, as the ILS build recorded it (``model``, ``estimate``, ``truth``)."""


#: Mask fields of an anatomy record: required, then optional (each an RLE object or a PNG path).
_ANATOMY_MASKS = ("right_lung", "left_lung")
_ANATOMY_OPTIONAL = ("heart", "right_lung_cxas", "left_lung_cxas")


def _anatomy_problem(rec: Any) -> str | None:
    """Why the JSON value ``rec`` is no anatomy record (``anatomy.jsonl`` format), or None."""
    if not isinstance(rec, dict):
        return f"expected a JSON object, got {type(rec).__name__}"
    key = rec.get("study") or rec.get("dicom_id")
    if not isinstance(key, str) or not key:
        return "no 'study' or 'dicom_id' string"
    for name in (*_ANATOMY_MASKS, *_ANATOMY_OPTIONAL):
        if name not in rec and name in _ANATOMY_MASKS:
            return f"no {name!r} mask"
        if rec.get(name) is not None and not isinstance(rec[name], dict | str):
            return f"{name} must be an RLE object or a PNG path, got {type(rec[name]).__name__}"
    if ("height" in rec or "width" in rec) and not all(
            isinstance(rec.get(k), int) and not isinstance(rec.get(k), bool) and rec[k] > 0
            for k in ("height", "width")):
        return "height and width must be positive integers (both or neither)"
    return None


def _load_anatomy_file(path: Path) -> dict[str, AnatomySource]:
    """``study`` (or ``dicom_id``) -> masks of an ``anatomy.jsonl`` file; a file that cannot be read, or a line
    that holds no anatomy record, is an :class:`InputError` naming the file (and the line)."""
    out: dict[str, AnatomySource] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise InputError("anatomy file not found", path) from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"anatomy file is not UTF-8 ({exc})", path) from exc
    except OSError as exc:
        raise InputError(f"cannot read the anatomy file ({exc.strerror or exc})", path) from exc
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise InputError(f"line {lineno}: not valid JSON ({exc})", path) from exc
        problem = _anatomy_problem(rec)
        if problem is not None:
            raise InputError(f"line {lineno}: not an anatomy record: {problem}", path)
        shape = (rec["height"], rec["width"]) if "height" in rec else None
        out[rec.get("study") or rec["dicom_id"]] = AnatomySource(
            rec["right_lung"], rec["left_lung"], rec.get("heart"), rec.get("right_lung_cxas"),
            rec.get("left_lung_cxas"), shape, rec.get("heart_source"))
    return out


def _dir_keys(c: Candidate) -> list[str]:
    """The names a folder of anatomy masks is searched by, in order: study, dicom_id, image stem (each once)."""
    return list(dict.fromkeys([c.study, c.dicom_id, Path(c.image_path).stem]))


def _anatomy_from_dir(folder: Path, keys: Sequence[str]) -> AnatomySource | None:
    for key in keys:
        right, left = folder / f"{key}_right_lung.png", folder / f"{key}_left_lung.png"
        if right.is_file() and left.is_file():
            extra = [folder / f"{key}_{name}.png" for name in ("heart", "right_lung_cxas", "left_lung_cxas")]
            heart, rc, lc = (str(p) if p.is_file() else None for p in extra)
            return AnatomySource(str(right), str(left), heart, rc, lc, None)
    return None


@dataclass(frozen=True)
class MissingAnatomy:
    """Why a study has no lung masks: ``reason`` names the file(s) looked for and the missing side, ``path`` the
    file (or folder) at fault."""

    reason: str
    path: str


def _missing_in_dir(folder: Path, keys: Sequence[str], study: str) -> MissingAnatomy:
    for key in keys:  # a study with one lung of a pair: name the missing side and its file
        right, left = folder / f"{key}_right_lung.png", folder / f"{key}_left_lung.png"
        if right.is_file() != left.is_file():
            gone, there = (left, right) if right.is_file() else (right, left)
            side = "left" if gone is left else "right"
            return MissingAnatomy(f"no {side} lung mask for study {study}: {gone} is missing (its other lung "
                                  f"{there.name} is there)", str(gone))
    tried = ", ".join(f"{key}_right_lung.png / {key}_left_lung.png" for key in keys)
    return MissingAnatomy(f"no lung masks for study {study} in {folder}: tried {tried}", str(folder))


class AnatomyLookup:
    """Study → lung/heart masks (:class:`AnatomySource`, None when there are none) of a folder of PNGs or an
    ``anatomy.jsonl`` file; :meth:`missing` says why a study has none."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self._table = None if source.is_dir() else _load_anatomy_file(source)

    def __call__(self, c: Candidate) -> AnatomySource | None:
        if self._table is None:
            return _anatomy_from_dir(self.source, _dir_keys(c))
        return self._table.get(c.study) or self._table.get(c.dicom_id)

    def missing(self, c: Candidate) -> MissingAnatomy:
        """Why ``c``'s study has no masks here: the files tried and the missing side, or the record not found."""
        if self._table is None:
            return _missing_in_dir(self.source, _dir_keys(c), c.study)
        return MissingAnatomy(f"no anatomy record for study {c.study} (nor for dicom_id {c.dicom_id}) in "
                              f"{self.source}", str(self.source))


def _mask(ref: dict | str | None, shape: tuple[int, int]) -> np.ndarray | None:
    if ref is None:
        return None
    if isinstance(ref, str):
        return read_mask_png(ref, shape)
    return decode_rle(ref, shape)


def anatomy_lookup(anatomy: str | None, ils_dir: Path) -> AnatomyLookup:
    """Study → masks from ``anatomy`` (a folder of ``{key}_right_lung.png`` ... or a JSONL file), default the
    ILS dataset's ``anatomy.jsonl``."""
    source = Path(anatomy) if anatomy else ils_dir / "anatomy.jsonl"
    if not anatomy and not source.exists():
        raise InputError("the ILS dataset has no anatomy.jsonl (an export made before it was copied, or a downloaded "
                         "MIMIC-ILS): pass --anatomy, e.g. the anatomy.jsonl of the dataset `ils build` wrote",
                         source)
    return AnatomyLookup(source)


#: Width of the border band a lung mask is looked for in, as a share of the film's longest side (at least 1 px).
LUNG_EDGE_BAND: Final[float] = 0.01
#: A lung mask that reaches into the band of the bottom, left or right edge along more than this share of that
#: edge is not trusted (a lung running into the abdomen or off a cropped film); the top edge is not checked.
LUNG_EDGE_MAX: Final[float] = 0.05


def lung_edge_problem(lungs: np.ndarray) -> str | None:
    """Why the lung mask ``lungs`` (both lungs, the film's size) cannot be trusted because it reaches the film's
    bottom, left or right edge along more than :data:`LUNG_EDGE_MAX` of it (within :data:`LUNG_EDGE_BAND` of the
    border), or None."""
    h, w = lungs.shape
    band = max(1, round(LUNG_EDGE_BAND * max(h, w)))
    shares = {"bottom": float(lungs[h - band:, :].any(axis=0).mean()),
              "left": float(lungs[:, :band].any(axis=1).mean()),
              "right": float(lungs[:, w - band:].any(axis=1).mean())}
    over = [f"{edge} edge along {share:.1%} of it" for edge, share in shares.items() if share > LUNG_EDGE_MAX]
    if not over:
        return None
    return (f"lung mask reaches the film edge ({'; '.join(over)}, within {band} px; more than "
            f"{LUNG_EDGE_MAX:.0%} is not trusted)")


@dataclass(frozen=True)
class PlanTask:
    """One accepted positive to plan (§5-§9) and where its inputs are."""

    cand: Candidate
    case_id: str
    image: str
    mask_source: str
    mask_ref: str | dict | None
    anatomy: AnatomySource | None
    seed: int
    deformer: str
    deformer_kwargs: dict[str, Any]
    strict_negatives: bool
    cpa_either_side: bool = False  # §19.8: the reference's either-side CPA rule (DeformConfig.cpa_same_side=False)
    anatomy_missing: MissingAnatomy | None = None  # why ``anatomy`` is None (the files looked for)


def _read_candidate(task: PlanTask, shape: tuple[int, int]) -> np.ndarray:
    if task.mask_ref is None:
        raise InputError(f"no candidate mask for pair {task.cand.pair_id}")
    if isinstance(task.mask_ref, dict):
        return decode_rle(task.mask_ref, shape)
    mask = read_mask_png(task.mask_ref)
    if mask.shape == shape:
        return mask
    if mask.shape == (RELEASED_SIZE, RELEASED_SIZE):  # a released-frame mask: the recorded inverse stretch
        return to_native(mask, shape)
    raise InputError(f"lesion mask is {mask.shape[0]}x{mask.shape[1]} (HxW) but its image is {shape[0]}x{shape[1]}; "
                     f"only native-size or released {RELEASED_SIZE}x{RELEASED_SIZE} masks are accepted", task.mask_ref)


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


#: The stages a plan unit fails at (``stage`` of its failure record and of the card's drop reasons).
PLAN_STAGES: Final[tuple[str, ...]] = ("images", "anatomy", "deformation")


def _failed(reason: str, stage: str, path: str | None = None) -> dict[str, Any]:
    """A failed plan unit: ``stage`` one of :data:`PLAN_STAGES`, ``path`` the file at fault when known."""
    return {"status": "failed", "reason": reason, "stage": stage, **({"path": path} if path else {})}


def make_plan(task: PlanTask) -> dict[str, Any]:
    """The plan unit of one positive, or ``{"status": "failed", "reason", "stage"[, "path"]}`` when it cannot be
    planned: ``stage`` is ``images`` (the film cannot be read), ``anatomy`` (no usable lung masks: missing, of
    another size, or reaching the film edge, :func:`lung_edge_problem`) or ``deformation`` (§6-§9)."""
    from cxrground.anatomy.overlap import ComponentOverlap
    from cxrground.percept.config import DeformConfig
    from cxrground.percept.deform.base import CheckedDeformer
    from cxrground.percept.deform.registry import get_deformer
    from cxrground.percept.revision import LungSources, RevisionFailure, plan_revision

    try:
        image = read_image(task.image).pixels
    except InputError as exc:
        return _failed(exc.reason, "images", exc.path)
    shape = (int(image.shape[0]), int(image.shape[1]))
    try:
        if task.anatomy is None:
            missing = task.anatomy_missing
            if missing is None:
                raise InputError(f"no anatomy masks for study {task.cand.study}")
            raise InputError(missing.reason, missing.path)
        if task.anatomy.shape is not None and task.anatomy.shape != shape:
            raise InputError(f"anatomy size {task.anatomy.shape} differs from the image size {shape}", task.image)
        right, left = _mask(task.anatomy.right, shape), _mask(task.anatomy.left, shape)
        rc, lc = _mask(task.anatomy.right_cxas, shape), _mask(task.anatomy.left_cxas, shape)
        assert right is not None and left is not None
        lungs = LungSources(right=right & rc if rc is not None else right, left=left & lc if lc is not None else left,
                            right_chex=right, left_chex=left, right_cxas=rc if rc is not None else right,
                            left_cxas=lc if lc is not None else left, heart=_mask(task.anatomy.heart, shape))
        edge = lung_edge_problem(lungs.right | lungs.left)
        if edge is not None:
            raise InputError(edge)
    except InputError as exc:
        return _failed(exc.reason, "anatomy", exc.path)
    try:
        candidate = _read_candidate(task, shape)
        deformer = CheckedDeformer(get_deformer(task.deformer, **task.deformer_kwargs))
        plan = plan_revision(image, task.cand.lesion, candidate, lungs, deformer,
                             seeded_rng(task.seed, task.cand.key_id, "plan"),
                             DeformConfig(cpa_same_side=not task.cpa_either_side))
        if not plan.deformed:
            raise RevisionFailure("deformation failed: no deformation step was made")
    except (InputError, RevisionFailure, BackendError) as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        return _failed(str(reason), "deformation", getattr(exc, "path", None))
    unit = plan_unit(plan, candidate)
    records = [ComponentOverlap.from_dict(o) for o in unit["overlaps"]]
    attrs = attribute_qas(records, task.cand.lesion, seeded_rng(task.seed, task.cand.key_id, "attributes"),
                          task.strict_negatives)
    unit["attributes"] = None if attrs is None else attrs.qa
    unit["max_negative_coverage"] = None if attrs is None else attrs.max_negative_coverage
    unit["mask_source"] = task.mask_source
    return unit


def plan_case(task: PlanTask, work: str) -> tuple[str, str]:
    """Plan one positive and write its unit to ``{work}/plans/{case_id}.json``; returns (case id, status)."""
    unit = make_plan(task)
    unit["key_id"] = task.cand.key_id
    atomic_write_text(Path(work) / "plans" / f"{task.case_id}.json", stable_json(unit, indent=None))
    return task.case_id, unit["status"]
