"""The CheXpercept contour-revision planner: one accepted candidate mask → everything Stage 2-3 need
(CHEXPERCEPT.md §5.1, §6-§9). Entry point :func:`plan_revision`.

Flow: §6 refinement (:mod:`cxrground.percept.refine`) → §5.1 geometry lungs (lesion components merged) and
§5.6 overlap records → §7 per-component deformation pass → §8 sequential steps (raises
:class:`RevisionFailure` when no repeat succeeds) → §9.1 fake points and pooled point options → §9.2 fake
masks → §9.3 revision-result options. All randomness comes from ``rng``; the same inputs and ``rng`` state
give an identical plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cxrground.anatomy.overlap import ComponentOverlap, component_overlap
from cxrground.anatomy.percept_regions import PerceptGeometry, geometry_lungs, percept_geometry
from cxrground.errors import InputError
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.percept.config import DeformConfig
from cxrground.percept.deform.base import Deformer
from cxrground.percept.deform.sampling import CONTRACTION, EXPANSION, side_of
from cxrground.percept.distractors import (
    OptionFailure,
    assign_point_options,
    default_mask_names,
    default_masks,
    fake_mask_pass,
    fake_points_for_step,
    pool_fake_points,
    revision_options,
)
from cxrground.percept.refine import Refinement, refine_mask
from cxrground.percept.steps import StepFailure, component_key, deform_component, plan_steps
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.traits import traits

__all__ = ["LungSources", "MaskChoice", "RevisionFailure", "RevisionPlan", "plan_revision"]


class RevisionFailure(Exception):
    """The case cannot get a contour-revision plan; ``reason`` is recorded and the case dropped."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class LungSources:
    """Native-size bool lung masks: the geometry lungs before the §5.1 lesion merge and the two §9.3
    default sources (``*_chex`` = HybridGNet, ``*_cxas`` = CXAS; equal to the geometry lung when only one
    source exists)."""

    right: np.ndarray
    left: np.ndarray
    right_chex: np.ndarray
    left_chex: np.ndarray
    right_cxas: np.ndarray
    left_cxas: np.ndarray
    heart: np.ndarray | None = None

    @classmethod
    def single(cls, right: np.ndarray, left: np.ndarray, heart: np.ndarray | None = None) -> LungSources:
        """Return sources where one lung pair serves for geometry and both defaults."""
        return cls(right, left, right, left, right, left, heart)


@dataclass
class MaskChoice:
    """One revision-result option: ``type`` ``true``/``fake``, its mask names and their OR (native bool)."""

    type: str
    masks: list[str]
    mask: np.ndarray


@dataclass
class RevisionPlan:
    """Everything the Stage 2-3 questions and ``deformation_results.json`` need for one case (native pixels)."""

    lesion: str
    components: list[np.ndarray]
    optimal: np.ndarray
    overlaps: list[ComponentOverlap]
    geometry: PerceptGeometry
    deformed: bool
    shown: np.ndarray
    revision_before_masks: list[str]
    revision_after_masks: list[str]
    point_options: list[tuple[tuple[int, int] | None, str]]
    expansion_answer: list[int]
    contraction_answer: list[int]
    expansion_colors: list[str]
    contraction_colors: list[str]
    mask_options: list[MaskChoice]
    revision_answer: int
    true_masks: dict[str, list[str]]
    fake_masks: dict[str, list[str]]
    true_combination: list[str]
    fake_combinations: list[list[str]]
    record: dict
    masks: dict[str, np.ndarray] = field(default_factory=dict)  # every named mask (components, steps, fakes, defaults)
    refinement_backend: str = ""
    deformation_backend: str = ""

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support (process pools): the read-only geometry travels as its two lungs."""
        state = dict(self.__dict__)
        geo = state.pop("geometry")
        state["_geometry_lungs"] = (np.array(geo.lung("right")), np.array(geo.lung("left")))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild the geometry from the pickled lungs (deterministic)."""
        right, left = state.pop("_geometry_lungs")
        state["geometry"] = percept_geometry(right, left)
        self.__dict__.update(state)


def _check_inputs(image: np.ndarray, lesion: str, candidate: np.ndarray, lungs: LungSources) -> np.ndarray:
    if lesion not in LESIONS:
        raise InputError(f"unknown lesion {lesion!r}; expected one of {', '.join(LESIONS)}")
    img = np.asarray(image)
    if img.ndim != 2:
        raise InputError(f"image must be a 2-D grey array, got shape {img.shape}")
    named = [("candidate mask", as_mask(candidate, "candidate mask"))]
    for key in ("right", "left", "right_chex", "left_chex", "right_cxas", "left_cxas"):
        named.append((f"{key} lung mask", as_mask(getattr(lungs, key), f"{key} lung mask")))
    shape = check_same_shape(*named)
    if tuple(img.shape) != shape:
        raise InputError(f"image shape {tuple(img.shape)} differs from the mask shape {shape}")
    return named[0][1]


def _component_side(steps, overlap: ComponentOverlap) -> str:
    if steps:
        return side_of(steps[0].anatomy)
    return "left" if overlap.lung("left").ratio > 0 else "right"


def plan_revision(
    image: np.ndarray,
    lesion: str,
    candidate: np.ndarray,
    lungs: LungSources,
    deformer: Deformer,
    rng: np.random.Generator,
    config: DeformConfig | None = None,
) -> RevisionPlan:
    """Return the contour-revision plan of one accepted candidate; raise :class:`RevisionFailure` when the
    candidate has no component ≥ 1000 px (@1024), cannot be deformed (§8) or lacks distinct options (§9.3)."""
    cfg = config or DeformConfig()
    cand = _check_inputs(image, lesion, candidate, lungs)
    scale = cfg.scaled(cand.shape)
    refinement: Refinement = refine_mask(cand, cfg)
    comps = list(refinement.components)
    if not comps:
        raise RevisionFailure(f"candidate mask has no component of ≥ {scale.min_area:.0f} px after refinement (§6)")
    right, left = geometry_lungs(lungs.right, lungs.left, lesion=refinement.optimal)
    geometry = percept_geometry(right, left)
    organ = traits(lesion).percept.deform == "organ"  # cardiomegaly: zones only, points anywhere
    overlaps = [component_overlap(c.mask, geometry, cardiomegaly=organ) for c in comps]
    lung_union = right | left
    union = np.zeros(cand.shape, dtype=bool)
    for c in comps:
        union |= c.mask
    deformations = {
        c.id: deform_component(image, c, ov, geometry, lesion, lung_union, deformer, rng, cfg,
                               others=(union & ~c.mask) if len(comps) > 1 else None)
        for c, ov in zip(comps, overlaps, strict=True)
    }
    try:
        plan = plan_steps(image, comps, deformations, geometry, lung_union, deformer, rng, cfg)
    except StepFailure as exc:
        raise RevisionFailure(f"deformation failed: {exc.reason}") from exc

    depth = cfg.depth(lesion)
    point_region = np.ones(cand.shape, dtype=bool) if organ or not lung_union.any() else lung_union
    mask_region = lung_union if lung_union.any() else np.ones(cand.shape, dtype=bool)
    for comp in comps:
        earlier: list = []
        seq_exp = plan.sequence_points(comp.id, EXPANSION)
        seq_con = plan.sequence_points(comp.id, CONTRACTION)
        for step in plan.component_steps(comp.id):
            step.fake_points_expansion, step.fake_points_contraction = fake_points_for_step(
                step, point_region, seq_exp, seq_con, depth, rng, scale, cfg
            )
            real = [*step.expansion_points, *step.contraction_points]
            for op in (CONTRACTION, EXPANSION):
                step.fake_masks.update(
                    fake_mask_pass(image, step, op, mask_region, real, earlier, deformer, depth, rng, scale, cfg)
                )

    # point options (§9.1 pooling, §3.3 colours, §4 answers)
    exp_gt = [s.center for s in plan.steps if s.operation == CONTRACTION]
    con_gt = [s.center for s in plan.steps if s.operation == EXPANSION]
    all_fakes = [p for s in plan.steps for p in s.fake_points_expansion]
    all_fakes += [p for s in plan.steps for p in s.fake_points_contraction]
    pooled = pool_fake_points([*exp_gt, *con_gt], all_fakes, rng, scale, cfg)
    points = assign_point_options(exp_gt, con_gt, pooled, rng)

    # masks by name and §9.3 options
    before_names = [plan.before_name(c) for c in comps]
    after_names = [plan.after_name(c) for c in comps]
    shown = np.zeros(cand.shape, dtype=bool)
    for c in comps:
        shown |= plan.before_mask(c)
    masks: dict[str, np.ndarray] = {c.name: c.mask for c in comps}
    masks.update({name: c.mask for c, name in zip(comps, after_names, strict=True)})
    for s in plan.steps:
        masks[s.name] = s.mask
        masks.update(s.fake_masks)
    sources = {"right_chex": lungs.right_chex, "right_cxas": lungs.right_cxas,
               "left_chex": lungs.left_chex, "left_cxas": lungs.left_cxas}
    masks.update(default_masks(lesion, shown, {k: as_mask(v) for k, v in sources.items()}, scale))
    per_fakes: list[list[str]] = []
    sides_done: set[str] = set()
    for c, ov in zip(comps, overlaps, strict=True):
        steps = plan.component_steps(c.id)
        side = _component_side(steps, ov)
        names = [n for s in steps for n in s.fake_masks] + [s.name for s in steps]
        names += default_mask_names(lesion, side, side not in sides_done)
        sides_done.add(side)
        per_fakes.append(names)
    try:
        opts = revision_options(per_fakes, after_names, before_names, masks, shown, rng, cfg,
                                component_ids=[c.id for c in comps])
    except OptionFailure as exc:
        raise RevisionFailure(f"revision options: {exc.reason}") from exc

    record: dict[str, Any] = {
        "org_deformation_results": {
            "possible_deformation_anatomy": [a for c in comps for a in deformations[c.id].anatomies],
            "deformation_results": {
                component_key(c.id): deformations[c.id].to_record(ov)
                for c, ov in zip(comps, overlaps, strict=True)
            },
        },
        "qa_deformation_results": plan.to_record(),
        "geometrical_mask_infos": [
            {"mask_component_id": c.id, "overlap": ov.to_dict()}
            for c, ov in zip(comps, overlaps, strict=True)
        ],
        "qa_deformation_success": True,
        "selected_anatomies": plan.selected,
        "repeats": plan.repeats,
        "refinement_backend": refinement.backend,
        "deformation_backend": getattr(deformer, "name", type(deformer).__name__),
        "refinement_points": {c.name: [[int(x), int(y)] for x, y in c.points] for c in comps},
    }
    return RevisionPlan(
        lesion=lesion,
        components=[c.mask for c in comps],
        optimal=refinement.optimal,
        overlaps=overlaps,
        geometry=geometry,
        deformed=bool(plan.steps),
        shown=shown,
        revision_before_masks=before_names,
        revision_after_masks=after_names,
        point_options=points.options,
        expansion_answer=points.expansion_answer,
        contraction_answer=points.contraction_answer,
        expansion_colors=points.colors(points.expansion_answer),
        contraction_colors=points.colors(points.contraction_answer),
        mask_options=[MaskChoice(t, names, m) for t, names, m in opts.options],
        revision_answer=opts.answer,
        true_masks=opts.true_masks,
        fake_masks=opts.fake_masks,
        true_combination=opts.true_combination,
        fake_combinations=opts.fake_combinations,
        record=record,
        masks=masks,
        refinement_backend=refinement.backend,
        deformation_backend=str(getattr(deformer, "name", type(deformer).__name__)),
    )
