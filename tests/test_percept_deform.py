"""CheXpercept §7 deformation: anatomy/operation choice, point sampling, the builtin and SAM deformers."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.anatomy.overlap import ComponentOverlap, LungOverlap, RegionOverlap
from cxrground.anatomy.percept_regions import PERCEPT_ZONE_NAMES, SUBREGION_NAMES
from cxrground.errors import ConfigError
from cxrground.percept.config import DeformConfig
from cxrground.percept.deform import BuiltinDeformer, get_deformer, is_valid, validity_problem
from cxrground.percept.deform.sam import build_prompts, organic_kernel, to_lowres
from cxrground.percept.deform.sampling import (
    CONTRACTION,
    EXPANSION,
    choose_anatomies,
    draw_widths,
    operation_for,
    sample_anatomy,
)
from cxrground.percept.refine import clean_mask, disc_dilate
from percept_build_helpers import tiny_sam_folder

CFG = DeformConfig()
SHAPE = (256, 256)
SCALE = CFG.scaled(SHAPE)


def disc(shape, cx, cy, r):
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]]
    return (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r


def overlap(zones=None, regions=None, right=0.1, left=0.0) -> ComponentOverlap:
    """A hand-built §5.6 record: ``zones``/``regions`` map name → (ratio, has_overlap)."""
    zones = zones or {}
    regions = regions or {}
    return ComponentOverlap(
        lungs={"right lung": LungOverlap(right, right >= 0.01, 1), "left lung": LungOverlap(left, left >= 0.01, 1)},
        zones={z: RegionOverlap(*zones.get(z, (0.0, False))) for z in PERCEPT_ZONE_NAMES},
        lung_regions={r: RegionOverlap(*regions.get(r, (0.0, False))) for r in SUBREGION_NAMES},
    )


# --- §7.1 ------------------------------------------------------------------------------------------

def test_operation_overrides_in_order():
    assert operation_for(True, 0.75, 0.1, CFG) == CONTRACTION  # ≥ 0.75 → contraction
    assert operation_for(False, 0.5, 0.1, CFG) == EXPANSION  # ≤ 0.5 → expansion
    assert operation_for(True, 0.2, 0.7, CFG) == CONTRACTION  # lung ≥ 0.7 wins last
    assert operation_for(True, 0.6, 0.69, CFG) == EXPANSION  # the coin
    assert operation_for(False, 0.6, 0.69, CFG) == CONTRACTION


def test_choose_anatomies_per_zone_with_overrides():
    mid = "right lateral lung & right mid zone lung"
    base_med = "right medial lung & right lung base"
    rec = overlap(
        zones={"right mid zone lung": (0.3, True), "right lung base": (0.4, True)},
        regions={mid: (0.9, True), base_med: (0.3, True), "right costophrenic angle": (0.2, True),
                 "left costophrenic angle": (0.5, True)},
    )
    seen: dict[str, set[str]] = {}
    for seed in range(40):
        picks = choose_anatomies(rec, "pneumonia", np.random.default_rng(seed), CFG)
        assert len(picks) == 2
        assert picks[0].anatomy == mid and picks[0].operation == CONTRACTION  # ratio 0.9 ≥ 0.75
        assert picks[1].anatomy in (base_med, "right costophrenic angle")  # never the other side's CPA
        assert picks[1].operation == EXPANSION  # ratios ≤ 0.5
        seen.setdefault("base", set()).add(picks[1].anatomy)
    assert seen["base"] == {base_med, "right costophrenic angle"}
    reference = DeformConfig(cpa_same_side=False)
    both = {choose_anatomies(rec, "edema", np.random.default_rng(s), reference)[1].anatomy for s in range(60)}
    assert "left costophrenic angle" in both
    # the lung-ratio override
    heavy = overlap(zones={"right mid zone lung": (0.3, True)}, regions={mid: (0.3, True)}, right=0.8)
    assert choose_anatomies(heavy, "opacity", np.random.default_rng(0), CFG)[0].operation == CONTRACTION


def test_cardiomegaly_zones_and_depth_one():
    zones = {z: (0.3, True) for z in PERCEPT_ZONE_NAMES[:5]}
    rec = overlap(zones=zones)
    counts = set()
    ops = set()
    for seed in range(60):
        picks = choose_anatomies(rec, "cardiomegaly", np.random.default_rng(seed), CFG)
        counts.add(len(picks))
        assert all(p.anatomy in zones for p in picks)
        assert len({p.anatomy for p in picks}) == len(picks)
        ops |= {p.operation for p in picks}
    assert counts == {1, 2, 3} and ops == {EXPANSION, CONTRACTION}
    one = overlap(zones={"left upper zone lung": (0.3, True)})
    assert len(choose_anatomies(one, "cardiomegaly", np.random.default_rng(3), CFG)) == 1
    mask = disc(SHAPE, 128, 128, 40)
    ap = sample_anatomy(mask, np.ones(SHAPE, bool), EXPANSION, CFG.depth("cardiomegaly"),
                        np.random.default_rng(1), SCALE, CFG)
    assert ap is not None and len(ap.levels) == 1 and 2 <= len(ap.points) <= 4


# --- §7.2 ------------------------------------------------------------------------------------------

def test_widths_rule():
    for seed in range(200):
        w1, w2 = draw_widths(2, np.random.default_rng(seed), CFG.width_choices)
        assert w1 in (2, 3, 4)
        assert (w2 == 2) if w1 == 2 else (2 <= w2 <= w1 - 1)
    assert {draw_widths(1, np.random.default_rng(s), (3, 4, 5))[0] for s in range(50)} == {3, 4, 5}


@pytest.mark.parametrize("operation", [EXPANSION, CONTRACTION])
def test_contour_depths_spacing_and_region(operation):
    r = 40
    mask = disc(SHAPE, 128, 128, r)
    region = np.zeros(SHAPE, dtype=bool)
    region[:128, :] = True  # upper half only
    step = SCALE.kernel_radius  # 4 px at 256 (16 @1024)
    expected = [r + 2 * step, r + 4 * step] if operation == EXPANSION else [r - step, r - 2 * step]
    for seed in range(20):
        ap = sample_anatomy(mask, region, operation, 2, np.random.default_rng(seed), SCALE, CFG)
        assert ap is not None
        w1, w2 = ap.widths
        assert [len(lv) for lv in ap.levels] == [w1, w2]
        for level, radius in zip(ap.levels, expected, strict=True):
            for x, y in level:
                assert region[y, x]
                assert abs(np.hypot(x - 128, y - 128) - radius) <= 2.0
        first = ap.levels[0]
        for i in range(len(first)):
            for j in range(i):
                assert np.hypot(first[i][0] - first[j][0], first[i][1] - first[j][1]) >= SCALE.point_spacing
        assert len(set(ap.levels[1])) == len(ap.levels[1])


def test_candidates_keep_away_from_opposite_points():
    mask = disc(SHAPE, 128, 128, 40)
    avoid = [(128, 80), (176, 128)]
    for seed in range(20):
        ap = sample_anatomy(mask, np.ones(SHAPE, bool), EXPANSION, 2, np.random.default_rng(seed), SCALE, CFG,
                            avoid=avoid)
        assert ap is not None
        for x, y in ap.points:
            assert min(np.hypot(x - a, y - b) for a, b in avoid) >= SCALE.opposite_min_dist


def test_sampling_fails_when_the_region_is_too_small():
    mask = disc(SHAPE, 128, 128, 40)
    region = np.zeros(SHAPE, dtype=bool)
    region[128, 40:50] = True  # a few candidate pixels, closer than the spacing
    assert sample_anatomy(mask, region, EXPANSION, 2, np.random.default_rng(0), SCALE, CFG) is None


# --- validity and the builtin deformer -------------------------------------------------------------

def test_validity_rule():
    m = np.zeros((20, 20), dtype=bool)
    m[5:15, 5:15] = True
    assert is_valid(m, None, [(6, 6)], [(1, 1)])
    assert "expansion point" in validity_problem(m, None, [(1, 1)], [])
    assert "contraction point" in validity_problem(m, None, [], [(6, 6)])
    assert "empty" in validity_problem(np.zeros_like(m), None, [], [])
    assert "equals" in validity_problem(m, m, [], [])
    grey = m.astype(np.uint8) * 127  # value ≥ 128 of 255 counts as inside
    assert "expansion point" in validity_problem(grey, None, [(6, 6)], [])


def _region_for(rng):
    """A random rectangular anatomy region containing part of the lesion's surroundings."""
    region = np.zeros(SHAPE, dtype=bool)
    y0, x0 = rng.integers(40, 110, size=2)
    region[y0 : y0 + rng.integers(60, 120), x0 : x0 + rng.integers(60, 120)] = True
    return region


def test_builtin_deformer_validity_and_locality_over_random_lesions():
    deformer = BuiltinDeformer()
    checked = 0
    for seed in range(30):
        rng = np.random.default_rng(seed)
        mask = disc(SHAPE, 128 + rng.integers(-20, 20), 128 + rng.integers(-20, 20), rng.integers(22, 45))
        mask &= ~disc(SHAPE, rng.integers(60, 190), rng.integers(60, 190), rng.integers(5, 25))
        mask = clean_mask(mask, SCALE)  # an optimal (already §6-clean) component
        region = _region_for(rng)
        op = EXPANSION if seed % 2 else CONTRACTION
        ap = sample_anatomy(mask, region, op, 2, rng, SCALE, CFG)
        if ap is None:
            continue
        exp = ap.points if op == EXPANSION else []
        con = ap.points if op == CONTRACTION else []
        res = deformer.deform(np.zeros(SHAPE, np.uint8), mask, region, np.ones(SHAPE, bool), exp, con, rng)
        assert res.logits is None
        assert validity_problem(res.mask, mask, exp, con) is None, seed
        changed = res.mask ^ mask
        near = disc_dilate(region, SCALE.builtin_disc + SCALE.refine_kernel)
        for x, y in ap.points:
            near |= disc(SHAPE, x, y, SCALE.builtin_disc + 40 * SCALE.longest_side / 1024)
        assert not (changed & ~near).any(), seed
        checked += 1
    assert checked >= 25


def test_registry():
    assert get_deformer("builtin").name == "builtin"
    with pytest.raises(ConfigError):
        get_deformer("nope")
    with pytest.raises(Exception, match=r"config\.json"):
        get_deformer("sam", model_path="/nonexistent/sam")


# --- SAM prompts -----------------------------------------------------------------------------------

def test_organic_kernel_is_seeded_bounded_and_elliptic():
    k1 = organic_kernel(15, np.random.default_rng(5))
    k2 = organic_kernel(15, np.random.default_rng(5))
    assert k1.shape == (31, 31) and np.array_equal(k1, k2)
    assert k1.min() >= 0 and k1.max() <= 1
    assert k1[0, 0] == 0 and k1[0, 30] == 0  # corners beyond the largest ellipse (axes ≤ 1.5·R... clipped)
    assert not np.array_equal(k1, organic_kernel(15, np.random.default_rng(6)))
    # the noise is smooth: neighbouring values differ little compared with the range
    noise_part = k1[k1 > 0]
    assert noise_part.size > 50


def test_build_prompts_values_points_and_labels():
    n, size = 32, 64
    shape = (64, 64)
    mask = np.zeros(shape, dtype=bool)
    mask[16:48, 16:32] = True
    lung = np.zeros(shape, dtype=bool)
    lung[:, :40] = True
    seeds = [(24, 24), (60, 60)]  # the second is far outside the mask
    exp = [(36, 32)]
    con = [(18, 20)]
    p = build_prompts(mask, lung, exp, con, seeds, None, n, size, np.random.default_rng(0), CFG)
    v = p.mask_prompt
    assert v.shape == (n, n) and v.dtype == np.float32
    low = to_lowres(mask, n, size)
    assert np.isclose(v[low], np.float32(18.420680743952367)).mean() > 0.8
    assert np.isclose(v[~low & (np.arange(n)[None, :] >= 25)], -18.420680743952367).all()  # right of the lungs
    assert v[16, 18] > 0  # expansion stamp inside the lung union, next to the mask
    assert (v[:, 21:] <= -18.42).all()  # no expansion outside the lungs (x ≥ 40 native = 20 low-res)
    assert v[10, 9] < 0  # the contraction stamp lowered the inside value
    assert p.points == [(24, 24), (36, 32), (18, 20)]  # (60, 60) dropped: its logit ≤ 0
    assert p.labels == [1, 1, 0]
    # no positive point with a positive logit: keep all
    q = build_prompts(mask, None, [], [], [(60, 60)], None, n, size, np.random.default_rng(0), CFG)
    assert q.points == [(60, 60)] and q.labels == [1]
    # previous logits are the base outside the mask
    prev = np.full((n, n), -3.0, dtype=np.float32)
    r = build_prompts(mask, None, [], [], [(24, 24)], prev, n, size, np.random.default_rng(0), CFG)
    assert np.isclose(r.mask_prompt[~low], -3.0).all()
    # unconfined expansion reaches outside the lungs
    u = build_prompts(mask, None, [(46, 32)], [], [(24, 24)], None, n, size, np.random.default_rng(0), CFG)
    assert (u.mask_prompt[:, 21:] > 0).any()


def test_sam_adapter_loads_a_local_tiny_model_and_deforms(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from cxrground.percept.deform.sam import SamDeformer

    tiny_sam_folder(tmp_path)
    deformer = get_deformer("sam", model_path=tmp_path)
    assert isinstance(deformer, SamDeformer) and deformer.lowres_size == 32
    shape = (60, 64)
    image = (np.random.default_rng(0).random(shape) * 255).astype(np.uint8)
    mask = disc(shape, 30, 30, 14)
    exp, con = [(50, 30)], [(22, 30)]
    res = deformer.deform(image, mask, np.ones(shape, bool), np.ones(shape, bool), exp, con,
                          np.random.default_rng(0))
    assert res.mask.shape == shape and res.mask.dtype == bool
    assert res.logits is not None and res.logits.shape == (32, 32)
    problem = validity_problem(res.mask, mask, exp, con)
    assert (problem is None) == is_valid(res.mask, mask, exp, con)
    # the chained call accepts the previous logits and reuses the cached image embedding
    again = deformer.deform(image, mask, np.ones(shape, bool), np.ones(shape, bool), exp, con,
                            np.random.default_rng(0), prev_logits=res.logits)
    assert again.mask.shape == shape


def _box(shape: tuple[int, int], y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
    out = np.zeros(shape, dtype=bool)
    out[y0:y1, x0:x1] = True
    return out


def test_a_step_centre_that_contradicts_its_answer_fails_the_repeat():
    from cxrground.percept.refine import RefinedComponent
    from cxrground.percept.steps import Step, centre_problem

    shape = (100, 100)
    comp0 = RefinedComponent(0, _box(shape, 20, 40, 10, 40), ((20, 30),), (1,))
    comp1 = RefinedComponent(1, _box(shape, 50, 70, 45, 60), ((50, 60),), (1,))

    def expanded(points: list[tuple[int, int]]) -> Step:  # component 0 grown over x 10..70
        return Step(0, "expansion", 1, "a", points, _box(shape, 20, 75, 10, 70), None, "optimal_component_0",
                    points, [])

    # answer "contract at the centre": inside the shown masks, outside every optimal mask -> fine
    assert centre_problem([expanded([(62, 30), (66, 34)])], [comp0, comp1]) is None
    # the points' mean lands on the other component's optimal mask -> contradicts "contract there"
    problem = centre_problem([expanded([(42, 60), (62, 60)])], [comp0, comp1])
    assert problem is not None and "inside the optimal mask" in problem
    # a contracted step whose centre is still covered by the shown masks -> contradicts "expand there"
    shrunk = _box(shape, 20, 40, 10, 40)
    shrunk[30:40, 30:40] = False
    step = Step(0, "contraction", 1, "a", [(22, 22), (32, 32)], shrunk, None, "optimal_component_0", [],
                [(22, 22), (32, 32)])  # centre (27, 27): the shown mask still covers it
    problem = centre_problem([step], [comp0, comp1])
    assert problem is not None and "inside the shown masks" in problem
    ok = Step(0, "contraction", 1, "a", [(33, 33), (37, 37)], shrunk, None, "optimal_component_0", [],
              [(33, 33), (37, 37)])
    assert centre_problem([ok], [comp0, comp1]) is None


@pytest.mark.parametrize("operation", [EXPANSION, CONTRACTION])
def test_points_keep_their_whole_disc_on_the_film(operation):
    """A mask that runs off the bottom and right edges gets points only where the whole point disc (radius plus
    half the ring) is drawn on the film."""
    mask = disc(SHAPE, 236, 236, 60)
    margin = SCALE.point_margin
    assert margin == 5  # 15 px disc + 1 px of ring @1024, at 256
    near = 0
    for seed in range(30):
        ap = sample_anatomy(mask, np.ones(SHAPE, bool), operation, 2, np.random.default_rng(seed), SCALE, CFG)
        if ap is None:
            continue
        for x, y in ap.points:
            assert margin <= x <= SHAPE[1] - 1 - margin and margin <= y <= SHAPE[0] - 1 - margin
            near += max(x, y) >= SHAPE[0] - 1 - 2 * margin
    assert near  # the contour does reach the border band: the margin is what keeps the points off it
