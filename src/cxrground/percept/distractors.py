"""CheXpercept distractors (CHEXPERCEPT.md §9.1-§9.3): fake points, fake masks and revision-result options.

Choices where the spec is silent:

* §9.1 a pass places its points on the external contour of the step mask dilated (eroded) by
  ``depth × iterations`` iterations of the 32 px ellipse (@1024); try 0 uses the lesion depth and 1 iteration,
  the 1st retry depth + 1, each later retry one more iteration per depth. The fallback draws region pixels
  100-300 px from the centre and ≥ 100 px from the centre, the pass's points and the opposite sequence points.
  For cardiomegaly the region is the whole image. Every point keeps the disc margin from the film's border
  (:func:`~cxrground.percept.deform.sampling.inside_film`). Pooling reads every step's expansion fakes, then every
  step's contraction fakes (step order).
* §9.2 the region is the lung union (whole image when empty); "real points of the component so far" are the
  points accumulated by the step; "earlier fakes" are the fake-mask points of the component's earlier
  fakes; depth retries are cumulative (depth, +1, +2, +3); fakes are numbered from 1.
* §9.3 ``default_keep`` renders as the whole before-revision union, ``default_{side}_lung_{chex|cxas}`` as the
  given source lung, ``default_dilated``/``default_eroded`` as the union dilated/eroded by a 5×5 square
  (@1024, scaled) 3 times. Beyond the reference, an option that looks the same as the shown mask, the answer
  or an earlier option (IoU of their masks ≥ ``DeformConfig.option_max_iou``, 0.98) is skipped and the next
  candidate drawn (groups by #defaults in increasing order, random order inside each group); fewer than 2 fakes
  fails the case.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from cxrground.percept.config import DeformConfig, ScaledDeform
from cxrground.percept.deform.base import Deformer, validity_problem
from cxrground.percept.deform.sampling import (
    CONTRACTION,
    EXPANSION,
    contour_pixels,
    inside_film,
    min_distance,
    sample_anatomy,
)
from cxrground.percept.refine import Point, lattice_points
from cxrground.percept.steps import Step, component_key
from cxrground.vocab.percept_templates import NONE_OPTION, POINT_COLORS
from cxrground.vocab.traits import traits

__all__ = [
    "DEFAULT_PREFIX",
    "OptionSet",
    "PointOptions",
    "assign_point_options",
    "combination_mask",
    "default_mask_names",
    "fake_mask_pass",
    "fake_point_pass",
    "fake_points_for_step",
    "mask_key",
    "pool_fake_points",
    "revision_options",
]

DEFAULT_PREFIX = "default_"
DEFAULT_EMPTY = "default_empty"


class OptionFailure(Exception):
    """§9.3 could not build enough distinct options; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


# --- §9.1 fake points ------------------------------------------------------------------------------

def _far(xs: np.ndarray, ys: np.ndarray, points: Sequence[Point], dist: float) -> np.ndarray:
    return min_distance(xs, ys, points) >= dist if points else np.ones(xs.shape, dtype=bool)


def _pick_spread(
    xs: np.ndarray, ys: np.ndarray, n: int, dist: float, rng: np.random.Generator
) -> list[Point]:
    chosen: list[Point] = []
    ok = np.ones(xs.shape, dtype=bool)
    while len(chosen) < n and ok.any():
        idx = np.flatnonzero(ok)
        j = int(idx[int(rng.integers(idx.size))])
        chosen.append((int(xs[j]), int(ys[j])))
        ok &= np.hypot(xs - xs[j], ys - ys[j]) >= dist
    return chosen


def fake_point_pass(
    mask: np.ndarray,
    operation: str,
    region: np.ndarray,
    center: Point,
    avoid: Sequence[Point],
    depth: int,
    rng: np.random.Generator,
    scale: ScaledDeform,
    config: DeformConfig,
) -> list[Point]:
    """Return one §9.1 pass (``dilated`` = expansion, ``eroded`` = contraction): up to 5 points ≥ 100 px from
    the centre, each other and ``avoid``; retries and the fallback as in the module doc."""
    dist = scale.fake_min_dist
    blocked = [center, *avoid]
    best: list[Point] = []
    for t in range(config.fake_point_retries + 1):
        d = depth + (1 if t >= 1 else 0)
        per_depth = 1 + max(0, t - 1)
        xs, ys = contour_pixels(mask, operation, d * per_depth, scale)
        inside = region[ys, xs] & inside_film(xs, ys, mask.shape, scale.point_margin)
        xs, ys = xs[inside], ys[inside]
        ok = _far(xs, ys, blocked, dist)
        got = _pick_spread(xs[ok], ys[ok], config.fake_points_per_pass, dist, rng)
        if len(got) > len(best):
            best = got
        if len(best) >= config.fake_points_min:
            return best
    ys, xs = np.nonzero(region)
    r = np.hypot(xs - center[0], ys - center[1])
    ok = (inside_film(xs, ys, region.shape, scale.point_margin) & (r >= dist) & (r <= scale.fake_fallback_max)
          & _far(xs, ys, blocked + best, dist))
    xs, ys = xs[ok], ys[ok]
    while len(best) < config.fake_points_min and xs.size:
        j = int(rng.integers(xs.size))
        best.append((int(xs[j]), int(ys[j])))
        keep = np.hypot(xs - xs[j], ys - ys[j]) >= dist
        xs, ys = xs[keep], ys[keep]
    return best


def fake_points_for_step(
    step: Step,
    region: np.ndarray,
    sequence_expansion: Sequence[Point],
    sequence_contraction: Sequence[Point],
    depth: int,
    rng: np.random.Generator,
    scale: ScaledDeform,
    config: DeformConfig,
) -> tuple[list[Point], list[Point]]:
    """Return ``(fake_points_expansion, fake_points_contraction)`` of one step (§9.1)."""
    exp = fake_point_pass(step.mask, EXPANSION, region, step.center, sequence_contraction, depth, rng, scale, config)
    con = fake_point_pass(step.mask, CONTRACTION, region, step.center, sequence_expansion, depth, rng, scale, config)
    return exp, con


def pool_fake_points(
    gt: Sequence[Point], fakes: Sequence[Point], rng: np.random.Generator, scale: ScaledDeform, config: DeformConfig
) -> list[Point]:
    """Return the pooled fakes: kept greedily when ≥ 100 px from every GT point and kept fake, then a random
    sample of ``8 − #GT`` when ``#GT + #fakes > 8`` (none when ``#GT ≥ 8``)."""
    kept: list[Point] = []
    for p in fakes:
        if all(np.hypot(p[0] - q[0], p[1] - q[1]) >= scale.fake_min_dist for q in [*gt, *kept]):
            kept.append(p)
    room = max(0, config.max_points - len(gt))
    if len(kept) > room:
        picks = sorted(int(i) for i in rng.choice(len(kept), size=room, replace=False)) if room else []
        kept = [kept[i] for i in picks]
    return kept


@dataclass(frozen=True)
class PointOptions:
    """The §3.3 point options and the §4 answers: 1-based option indices of the GT points in GT order (the order
    of the GT point lists given to :func:`assign_point_options`); ``[None index]`` if none."""

    options: list[tuple[Point | None, str]]
    expansion_answer: list[int]
    contraction_answer: list[int]

    def colors(self, answer: Sequence[int]) -> list[str]:
        """Return the colours of the answer indices (``[]`` when the answer is the None option)."""
        return [self.options[i - 1][1] for i in answer if self.options[i - 1][0] is not None]


def assign_point_options(
    expansion_gt: Sequence[Point], contraction_gt: Sequence[Point], fakes: Sequence[Point], rng: np.random.Generator
) -> PointOptions:
    """Shuffle GT + fakes, assign colours in :data:`POINT_COLORS` order and append the None option.

    ``expansion_gt`` are the centre points of the steps the pipeline contracted (they need expansion);
    ``contraction_gt`` those of the steps it expanded.
    """
    tagged = [(p, "e", k) for k, p in enumerate(expansion_gt)] + [(p, "c", k) for k, p in enumerate(contraction_gt)]
    tagged += [(p, "f", k) for k, p in enumerate(fakes)]
    if len(tagged) > len(POINT_COLORS):
        raise ValueError(f"{len(tagged)} points exceed the {len(POINT_COLORS)} colours")
    order = [tagged[int(i)] for i in rng.permutation(len(tagged))]
    options: list[tuple[Point | None, str]] = [(p, POINT_COLORS[i]) for i, (p, _, _) in enumerate(order)]
    options.append((None, NONE_OPTION))
    none_index = len(options)
    return PointOptions(options, _gt_indices(order, "e") or [none_index], _gt_indices(order, "c") or [none_index])


def _gt_indices(order: Sequence[tuple[Point, str, int]], tag: str) -> list[int]:
    """The 1-based option indices of the points tagged ``tag``, in the order of their GT list."""
    return [i for _, i in sorted((k, i + 1) for i, (_, t, k) in enumerate(order) if t == tag)]


# --- §9.2 fake masks -------------------------------------------------------------------------------

def fake_mask_pass(
    image: np.ndarray,
    step: Step,
    operation: str,
    region: np.ndarray,
    real_points: Sequence[Point],
    earlier_fakes: list[Point],
    deformer: Deformer,
    depth: int,
    rng: np.random.Generator,
    scale: ScaledDeform,
    config: DeformConfig,
) -> dict[str, np.ndarray]:
    """Return up to 4 valid fakes ``{step}_fake_{operation}_{n}`` of one operation (≤ 10 consecutive
    failures); ``earlier_fakes`` is extended with the points of every fake kept and ``step.fake_mask_points``
    records each fake's points."""
    out: dict[str, np.ndarray] = {}
    seeds = lattice_points(step.mask, scale.grid_step)
    unconfined = np.ones(step.mask.shape, dtype=bool)
    failures = 0
    cache: dict = {}
    while len(out) < config.fake_masks_per_pass and failures < config.fake_mask_max_failures:
        ap = None
        for t in range(config.fake_mask_depth_retries + 1):
            d = depth + t
            choices = config.deep_width_choices if d > 2 else config.width_choices
            ap = sample_anatomy(
                step.mask, region, operation, d, rng, scale, config,
                avoid=[*real_points, *earlier_fakes], avoid_dist=scale.fake_min_dist, width_choices=choices,
                cache=cache,
            )
            if ap is not None:
                break
        if ap is None:
            failures += 1
            continue
        exp = ap.points if operation == EXPANSION else []
        con = ap.points if operation == CONTRACTION else []
        res = deformer.deform(image, step.mask, region, unconfined, exp, con, rng, step.logits, seed_points=seeds)
        if validity_problem(res.mask, step.mask, exp, con) is not None:
            failures += 1
            continue
        failures = 0
        name = f"{step.name}_fake_{operation}_{len(out) + 1}"
        out[name] = res.mask
        step.fake_mask_points[name] = (list(exp), list(con))
        earlier_fakes.extend(ap.points)
    return out


# --- §9.3 revision-result options ------------------------------------------------------------------

def mask_key(mask: np.ndarray) -> bytes:
    """Return a digest identifying a bool mask pixel-wise."""
    return hashlib.sha1(np.packbits(mask, axis=None).tobytes() + str(mask.shape).encode()).digest()


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two bool masks (1.0 for two empty masks)."""
    union = int(np.count_nonzero(a | b))
    return 1.0 if union == 0 else int(np.count_nonzero(a & b)) / union


def combination_mask(names: Sequence[str], masks: Mapping[str, np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    """Return the OR of the named masks (``default_empty`` is ignored)."""
    out = np.zeros(shape, dtype=bool)
    for n in names:
        if n != DEFAULT_EMPTY:
            out |= masks[n]
    return out


def default_mask_names(lesion: str, side: str | None, first_on_side: bool) -> list[str]:
    """Return the §9.3 default choices of one component."""
    if traits(lesion).percept.deform == "organ":
        return ["default_keep", "default_dilated", "default_eroded"]
    names = ["default_keep"]
    if side is not None and first_on_side:
        names += [f"default_{side}_lung_chex", f"default_{side}_lung_cxas"]
    return names


def default_masks(lesion: str, shown: np.ndarray, lung_sources: Mapping[str, np.ndarray], scale: ScaledDeform):
    """Return the rendered default masks (see the module doc); ``lung_sources`` maps ``{side}_{chex|cxas}``."""
    out = {"default_keep": shown}
    if traits(lesion).percept.deform == "organ":
        square = np.ones((scale.default_kernel, scale.default_kernel), dtype=bool)
        out["default_dilated"] = ndimage.binary_dilation(shown, structure=square, iterations=3)
        out["default_eroded"] = ndimage.binary_erosion(shown, structure=square, iterations=3)
    else:
        for key, mask in lung_sources.items():
            out[f"default_{key.split('_')[0]}_lung_{key.split('_')[1]}"] = mask
    return out


@dataclass(frozen=True)
class OptionSet:
    """The §9.3 result: per-component choices (keyed ``suboptimal_component_{i}``), the chosen fakes and the
    shuffled options."""

    true_masks: dict[str, list[str]]
    fake_masks: dict[str, list[str]]
    true_combination: list[str]
    fake_combinations: list[list[str]]
    options: list[tuple[str, list[str], np.ndarray]]  # (type, names, mask) in option order
    answer: int  # 1-based


def revision_options(
    per_component_fakes: Sequence[list[str]],
    true_names: Sequence[str],
    before_names: Sequence[str],
    masks: Mapping[str, np.ndarray],
    shown: np.ndarray,
    rng: np.random.Generator,
    config: DeformConfig,
    component_ids: Sequence[int] | None = None,
) -> OptionSet:
    """Return the §9.3 options; raise :class:`OptionFailure` when fewer than ``min_fake_options`` distinct
    fakes exist. Distinct: no option's mask (nor the shown mask) reaches IoU ``config.option_max_iou`` with
    another's, so that no two options look the same. ``component_ids``: the ids of the components in the order of
    ``true_names`` (default ``0, 1, …``)."""
    shape = shown.shape
    answer_mask = combination_mask(true_names, masks, shape)
    if np.array_equal(answer_mask, shown):
        raise OptionFailure("the answer mask equals the shown mask")
    choices = [[t, *f] for t, f in zip(true_names, per_component_fakes, strict=True)]
    before = set(before_names)
    groups: dict[int, list[tuple[str, ...]]] = {}
    for combo in itertools.product(*choices):
        if list(combo) == list(true_names) or set(combo) == before:
            continue
        groups.setdefault(sum(n.startswith(DEFAULT_PREFIX) for n in combo), []).append(combo)
    if mask_iou(answer_mask, shown) >= config.option_max_iou:
        raise OptionFailure(f"the answer mask hardly differs from the shown mask (IoU ≥ {config.option_max_iou:g})")
    seen = {mask_key(shown), mask_key(answer_mask)}
    kept = [shown, answer_mask]  # what every further option must differ from visibly
    chosen: list[tuple[tuple[str, ...], np.ndarray]] = []
    tried = 0
    for g in sorted(groups):
        members = groups[g]
        for i in rng.permutation(len(members)):
            if len(chosen) >= config.max_fake_options or tried >= config.option_redraws:
                break
            tried += 1
            combo = members[int(i)]
            m = combination_mask(combo, masks, shape)
            key = mask_key(m)
            if key in seen or any(mask_iou(m, other) >= config.option_max_iou for other in kept):
                continue
            seen.add(key)
            kept.append(m)
            chosen.append((combo, m))
    if len(chosen) < config.min_fake_options:
        raise OptionFailure(
            f"only {len(chosen)} distinct revision-result distractor(s) (need {config.min_fake_options})"
        )
    entries = [("true", list(true_names), answer_mask)] + [("fake", list(c), m) for c, m in chosen]
    order = [int(i) for i in rng.permutation(len(entries))]
    options = [entries[i] for i in order]
    keys = [component_key(i) for i in (range(len(true_names)) if component_ids is None else component_ids)]
    return OptionSet(
        true_masks={k: [n] for k, n in zip(keys, true_names, strict=True)},
        fake_masks={k: list(f) for k, f in zip(keys, per_component_fakes, strict=True)},
        true_combination=list(true_names),
        fake_combinations=[names for t, names, _ in options if t == "fake"],
        options=options,
        answer=order.index(0) + 1,
    )
