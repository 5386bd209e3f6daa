"""CheXpercept deformation: the per-component all-at-once pass (CHEXPERCEPT.md §7) and the sequential
steps and revision flow (§8).

Choices where the spec is silent:

* §7 attempt: the §7.1 anatomies are drawn, each gets its §7.2 points (an anatomy whose three tries fail is
  left out of that attempt; candidates keep 50 px from the points of the opposite operation chosen earlier
  in the attempt), then the component is deformed once with all points (mask prompt = the component's
  refinement logits) and the attempt succeeds when the validity rule holds. A component without any
  overlapping anatomy fails at once.
* §8 ``S`` is drawn from the distinct names of ``possible_deformation_anatomy`` (first-appearance order).
  A repeat also fails when two step centre points are closer than ``gt_point_min_dist`` (30 px @1024, two
  point-disc radii; §19.14 "GT points coinciding"), so that the point options never coincide, and when a step's
  centre point contradicts its answer on the shown overlay (§19.14 degenerate items): the centre of an expanded
  step (answer: contract there) must lie inside the shown masks and outside every optimal component, the centre
  of a contracted step (answer: expand there) inside an optimal component and outside the shown masks. The mean
  of points spread along a curved contour can fall back inside the mask they moved, or on another component.
* The anatomy region handed to the deformer for a step is the union of the regions of all anatomies whose
  points are accumulated in that step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cxrground.anatomy.overlap import ComponentOverlap
from cxrground.anatomy.percept_regions import PerceptGeometry
from cxrground.percept.config import DeformConfig
from cxrground.percept.deform.base import Deformer, validity_problem
from cxrground.percept.deform.sampling import (
    CONTRACTION,
    EXPANSION,
    AnatomyPoints,
    choose_anatomies,
    opposite,
    sample_anatomy,
    side_of,
)
from cxrground.percept.refine import Point, RefinedComponent

__all__ = [
    "ComponentDeformation",
    "Step",
    "StepFailure",
    "StepPlan",
    "center_point",
    "component_key",
    "deform_component",
    "plan_steps",
    "step_name",
    "unrevised_name",
]


class StepFailure(Exception):
    """§8 found no successful repeat; ``reason`` says why (the last repeat's problem)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def component_key(component_id: int) -> str:
    """Return ``suboptimal_component_{i}``: component ``i`` in the records and the mask-choice keys (§8, §12)."""
    return f"suboptimal_component_{component_id}"


def step_name(component_id: int, operation: str, k: int) -> str:
    """Return ``suboptimal_component_{i}_exp{k}`` / ``_cont{k}``."""
    return f"{component_key(component_id)}_{'exp' if operation == EXPANSION else 'cont'}{k}"


def unrevised_name(component_id: int) -> str:
    """Return ``suboptimal_component_{i}_no_contraction``: the mask name of a component no step deforms (§8), its
    optimal mask both before and after the revision."""
    return f"{component_key(component_id)}_no_contraction"


def center_point(points: list[Point]) -> Point:
    """Return ``(round(mean x), round(mean y))`` of a step's points (§4)."""
    arr = np.asarray(points, dtype=float)
    return (int(np.rint(arr[:, 0].mean())), int(np.rint(arr[:, 1].mean())))


def _to_list(points) -> list[list[int]]:
    return [[int(x), int(y)] for x, y in points]


# --- §7 per-component pass -------------------------------------------------------------------------

@dataclass
class ComponentDeformation:
    """The §7 result of one optimal component."""

    component_id: int
    anatomies: dict[str, AnatomyPoints]
    success: bool
    retry_count: int
    reason: str | None = None

    @property
    def sides(self) -> dict[str, bool]:
        """Return ``{"left": …, "right": …}``: whether an anatomy of that side was deformed."""
        names = list(self.anatomies)
        return {s: any(side_of(a) == s for a in names) for s in ("left", "right")}

    def to_record(self, overlap: ComponentOverlap) -> dict[str, Any]:
        """Return the JSON entry of ``org_deformation_results.deformation_results`` for this component."""
        return {
            "deformation_result": {
                **self.sides,
                "deformation": {a: {"operation": p.operation, "points": _to_list(p.points)} for a, p in
                                self.anatomies.items()},
            },
            "anatomy_depth_width_levels": {
                a: {"depth": p.depth, "widths": list(p.widths), "levels": [_to_list(lv) for lv in p.levels]}
                for a, p in self.anatomies.items()
            },
            "deformation_success": self.success,
            "retry_count": self.retry_count,
            "lesion_overlap": overlap.to_dict(),
            "anatomy_operations": {a: p.operation for a, p in self.anatomies.items()},
            "failure_reason": self.reason,
        }


def _union(geometry: PerceptGeometry, names) -> np.ndarray:
    out = np.zeros(geometry.shape, dtype=bool)
    for n in names:
        out |= geometry.region(n)
    return out


def deform_component(
    image: np.ndarray,
    component: RefinedComponent,
    overlap: ComponentOverlap,
    geometry: PerceptGeometry,
    lesion: str,
    lung_union: np.ndarray,
    deformer: Deformer,
    rng: np.random.Generator,
    config: DeformConfig,
    others: np.ndarray | None = None,
) -> ComponentDeformation:
    """Return the §7 deformation of one component (up to ``component_attempts`` attempts). ``others``: the other
    optimal components of the case, where no point of this one is drawn (a point there would ask to expand or
    contract the shown union where the revised union already agrees)."""
    scale = config.scaled(component.mask.shape)
    depth = config.depth(lesion)
    reason = "no attempt made"
    cache: dict = {}
    for attempt in range(config.component_attempts):
        choices = choose_anatomies(overlap, lesion, rng, config)
        if not choices:
            return ComponentDeformation(component.id, {}, False, attempt, "no overlapping anatomy")
        found: dict[str, AnatomyPoints] = {}
        pts: dict[str, list[Point]] = {EXPANSION: [], CONTRACTION: []}
        for ch in choices:
            region = geometry.region(ch.anatomy) if others is None else geometry.region(ch.anatomy) & ~others
            ap = sample_anatomy(
                component.mask, region, ch.operation, depth, rng, scale, config,
                avoid=pts[opposite(ch.operation)], anatomy=ch.anatomy, cache=cache,
            )
            if ap is not None:
                found[ch.anatomy] = ap
                pts[ch.operation].extend(ap.points)
        if not found:
            reason = "no anatomy got its deformation points"
            continue
        res = deformer.deform(
            image, component.mask, _union(geometry, found), lung_union, pts[EXPANSION], pts[CONTRACTION], rng,
            component.logits, seed_points=component.points,
        )
        problem = (validity_problem(res.mask, component.mask, pts[EXPANSION], pts[CONTRACTION])
                   or _own_centre_problem(found, component.mask if others is None else component.mask | others,
                                          res.mask))
        if problem is None:
            return ComponentDeformation(component.id, found, True, attempt)
        reason = problem
    return ComponentDeformation(component.id, {}, False, config.component_attempts, reason)


def _own_centre_problem(found: dict[str, AnatomyPoints], optimal: np.ndarray, deformed: np.ndarray) -> str | None:
    """Why an anatomy's centre point (its step's answer point) would contradict the answer on the component's
    masks, or None: an expansion centre must fall outside the optimal masks (``optimal``: this component's and the
    case's other ones) and inside the deformed one, a contraction centre the other way round (an attempt that
    fails this is drawn again)."""
    for name, ap in found.items():
        x, y = center_point(list(ap.points))
        expanded = ap.operation == EXPANSION
        if bool(optimal[y, x]) == expanded or bool(deformed[y, x]) != expanded:
            wrong = "inside an optimal mask or outside the deformed one" if expanded else \
                "outside the optimal mask or inside the deformed one"
            return f"centre point of the {ap.operation} points in {name} would contradict its answer ({wrong})"
    return None


# --- §8 sequential steps ---------------------------------------------------------------------------

@dataclass(eq=False)
class Step:
    """One §8 step: the component's optimal mask deformed with the points accumulated so far."""

    component_id: int
    operation: str  # what the pipeline did to the optimal mask
    index: int  # k, 1-based within the operation
    anatomy: str
    points: list[Point]  # this anatomy's points
    mask: np.ndarray
    logits: np.ndarray | None
    flow_after: str  # the mask this step revises back to ("after revision" of the flow)
    expansion_points: list[Point]  # accumulated points used for this step
    contraction_points: list[Point]
    fake_points_expansion: list[Point] = field(default_factory=list)
    fake_points_contraction: list[Point] = field(default_factory=list)
    fake_masks: dict[str, np.ndarray] = field(default_factory=dict)
    fake_mask_points: dict[str, tuple[list[Point], list[Point]]] = field(default_factory=dict)  # (exp, con)

    @property
    def name(self) -> str:
        """Return the step's mask name (``mask_path``)."""
        return step_name(self.component_id, self.operation, self.index)

    @property
    def center(self) -> Point:
        """Return the step's centre point."""
        return center_point(self.points)

    @property
    def revision(self) -> str:
        """Return the revision that undoes this step (the opposite operation)."""
        return opposite(self.operation)

    def to_record(self) -> dict[str, Any]:
        """Return the §8 step entry of ``deformation_results.json``."""
        key = "exp_idx" if self.operation == EXPANSION else "cont_idx"
        return {
            "suboptimal_component_id": component_key(self.component_id),
            key: self.index,
            "anatomy": self.anatomy,
            "points": _to_list(self.points),
            "mask_path": self.name,
            "center_point": list(self.center),
            "fake_masks": list(self.fake_masks),
            "fake_mask_points": {
                n: {EXPANSION: _to_list(e), CONTRACTION: _to_list(c)} for n, (e, c) in self.fake_mask_points.items()
            },
            "fake_points_expansion": _to_list(self.fake_points_expansion),
            "fake_points_contraction": _to_list(self.fake_points_contraction),
            "revision": self.revision,
            "revision_flow": {"before revision": self.name, "after revision": self.flow_after},
        }


@dataclass(eq=False)
class StepPlan:
    """The successful §8 repeat: steps in execution order, the non-deformed components and the bookkeeping."""

    steps: list[Step]
    no_deformation: dict[int, str]
    selected: list[str]
    repeats: int
    component_ids: list[int]

    def component_steps(self, component_id: int) -> list[Step]:
        """Return the steps of one component in execution order."""
        return [s for s in self.steps if s.component_id == component_id]

    def before_name(self, component: RefinedComponent) -> str:
        """Return the shown ("before revision") mask name: last contraction step, else last expansion step,
        else the optimal component (:meth:`after_name`)."""
        steps = self.component_steps(component.id)
        for op in (CONTRACTION, EXPANSION):
            mine = [s for s in steps if s.operation == op]
            if mine:
                return mine[-1].name
        return self.after_name(component)

    def after_name(self, component: RefinedComponent) -> str:
        """Return the "after revision" mask name: the optimal component, named
        ``suboptimal_component_{i}_no_contraction`` when no step deforms it (§8)."""
        return self.no_deformation.get(component.id, component.name)

    def before_mask(self, component: RefinedComponent) -> np.ndarray:
        """Return the shown mask of one component."""
        name = self.before_name(component)
        for s in self.component_steps(component.id):
            if s.name == name:
                return s.mask
        return component.mask

    def sequence_points(self, component_id: int, operation: str) -> list[Point]:
        """Return the points of the component's ``operation`` anatomies in this repeat (§9.1 "sequence")."""
        return [p for s in self.component_steps(component_id) if s.operation == operation for p in s.points]

    def to_record(self) -> dict[str, Any]:
        """Return ``qa_deformation_results`` of ``deformation_results.json``."""
        out: dict[str, Any] = {EXPANSION: {}, CONTRACTION: {}, "no_deformation": {}}
        for s in self.steps:
            out[s.operation].setdefault(component_key(s.component_id), []).append(s.to_record())
        for cid, name in self.no_deformation.items():
            out["no_deformation"][component_key(cid)] = [{"suboptimal_component_id": component_key(cid),
                                                          "mask_path": name}]
        return out


def _try_repeat(
    image, components, deformations, geometry, lung_union, deformer, rng, config, possible
) -> tuple[list[Step], dict[int, str], list[str]] | str:
    n = int(rng.integers(1, config.max_step_anatomies + 1))
    n = min(n, len(possible))
    remaining = [possible[int(i)] for i in rng.choice(len(possible), size=n, replace=False)]
    selected = list(remaining)
    steps: list[Step] = []
    no_def: dict[int, str] = {}
    for comp in components:
        dfm = deformations[comp.id]
        names = list(dfm.anatomies)
        order = [names[int(i)] for i in rng.permutation(len(names))]
        targets = {op: [a for a in order if a in remaining and dfm.anatomies[a].operation == op]
                   for op in (EXPANSION, CONTRACTION)}
        flow = comp.name
        acc: dict[str, list[Point]] = {EXPANSION: [], CONTRACTION: []}
        logits = comp.logits
        used: list[str] = []
        for op in (EXPANSION, CONTRACTION):
            for k, a in enumerate(targets[op], start=1):
                ap = dfm.anatomies[a]
                acc[op].extend(ap.points)
                used.append(a)
                res = deformer.deform(
                    image, comp.mask, _union(geometry, used), lung_union, list(acc[EXPANSION]),
                    list(acc[CONTRACTION]), rng, logits, seed_points=comp.points,
                )
                problem = validity_problem(res.mask, comp.mask, acc[EXPANSION], acc[CONTRACTION])
                name = step_name(comp.id, op, k)
                if problem is not None:
                    return f"{name} ({a}): {problem}"
                steps.append(Step(comp.id, op, k, a, list(ap.points), res.mask, res.logits, flow,
                                  list(acc[EXPANSION]), list(acc[CONTRACTION])))
                flow = name
                logits = res.logits
                remaining.remove(a)
        if not targets[EXPANSION] and not targets[CONTRACTION]:
            no_def[comp.id] = unrevised_name(comp.id)
    problem = centre_problem(steps, components)
    if problem is not None:
        return problem
    scale = config.scaled(geometry.shape)
    centers = [s.center for s in steps]
    for i in range(len(centers)):
        for j in range(i):
            if np.hypot(centers[i][0] - centers[j][0], centers[i][1] - centers[j][1]) < scale.gt_point_min_dist:
                return f"centre points of {steps[j].name} and {steps[i].name} coincide"
    return steps, no_def, selected


def centre_problem(steps: list[Step], components: list[RefinedComponent]) -> str | None:
    """Why a step's centre point contradicts its answer on the shown overlay, or None (see the module notes).
    The shown mask of a component is its last step's (expansions come first), else its optimal mask."""
    if not components:
        return None
    optimal = np.zeros(components[0].mask.shape, dtype=bool)
    shown = optimal.copy()
    for comp in components:
        mine = [s for s in steps if s.component_id == comp.id]
        optimal |= comp.mask
        shown |= mine[-1].mask if mine else comp.mask
    for s in steps:
        x, y = s.center
        expanded = s.operation == EXPANSION  # the answer: contract there (inside the shown, outside the optimal)
        answer = "contract" if expanded else "expand"
        if bool(shown[y, x]) != expanded:
            where = "outside" if expanded else "inside"
            return f"centre point of {s.name} is {where} the shown masks (its answer says {answer} there)"
        if bool(optimal[y, x]) == expanded:
            where = "inside" if expanded else "outside"
            return f"centre point of {s.name} is {where} the optimal mask (its answer says {answer} there)"
    return None


def plan_steps(
    image: np.ndarray,
    components: list[RefinedComponent],
    deformations: dict[int, ComponentDeformation],
    geometry: PerceptGeometry,
    lung_union: np.ndarray,
    deformer: Deformer,
    rng: np.random.Generator,
    config: DeformConfig,
) -> StepPlan:
    """Return the first successful §8 repeat (up to ``repeats``); raise :class:`StepFailure` otherwise."""
    failed = [d for d in deformations.values() if not d.success]
    if failed:
        d = failed[0]
        raise StepFailure(f"optimal_component_{d.component_id} could not be deformed (§7): {d.reason}")
    possible: list[str] = []
    for comp in components:
        for a in deformations[comp.id].anatomies:
            if a not in possible:
                possible.append(a)
    if not possible:
        raise StepFailure("no possible deformation anatomy")
    reason = ""
    for repeat in range(1, config.repeats + 1):
        out = _try_repeat(image, components, deformations, geometry, lung_union, deformer, rng, config, possible)
        if isinstance(out, str):
            reason = out
            continue
        steps, no_def, selected = out
        return StepPlan(steps, no_def, selected, repeat, [c.id for c in components])
    raise StepFailure(f"all {config.repeats} repeats failed; last: {reason}")
