"""CheXpercept §9 distractors: fake points and pooling, point options, defaults and revision options."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.percept.config import DeformConfig
from cxrground.percept.deform.sampling import CONTRACTION, EXPANSION
from cxrground.percept.distractors import (
    OptionFailure,
    assign_point_options,
    combination_mask,
    default_mask_names,
    default_masks,
    fake_point_pass,
    pool_fake_points,
    revision_options,
)
from cxrground.vocab.percept_templates import POINT_COLORS

CFG = DeformConfig()
SHAPE = (256, 256)
SCALE = CFG.scaled(SHAPE)  # fake_min_dist = 25 px, fallback up to 75 px


def disc(cx, cy, r, shape=SHAPE):
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]]
    return (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r


def dist(a, b):
    return float(np.hypot(a[0] - b[0], a[1] - b[1]))


@pytest.mark.parametrize("operation", [EXPANSION, CONTRACTION])
def test_fake_point_pass_spacing(operation):
    mask = disc(128, 128, 50)
    center = (128, 70)
    avoid = [(180, 128)]
    for seed in range(10):
        pts = fake_point_pass(mask, operation, np.ones(SHAPE, bool), center, avoid, 2, np.random.default_rng(seed),
                              SCALE, CFG)
        assert 2 <= len(pts) <= CFG.fake_points_per_pass
        for i, p in enumerate(pts):
            assert dist(p, center) >= SCALE.fake_min_dist
            assert dist(p, avoid[0]) >= SCALE.fake_min_dist
            assert all(dist(p, q) >= SCALE.fake_min_dist for q in pts[:i])
            r = dist(p, (128, 128))
            # dilated by 2 iterations of the 8 px ellipse (+8 px), eroded by 2 (−8 px)
            assert abs(r - (58 if operation == EXPANSION else 42)) <= 2.0


def test_fake_point_fallback_uses_region_pixels_in_the_ring():
    mask = disc(128, 128, 10)
    region = np.zeros(SHAPE, dtype=bool)
    region[20:40, :] = True  # no contour pixel of any pass lies here
    pts = fake_point_pass(mask, EXPANSION, region, (128, 100), [], 2, np.random.default_rng(0), SCALE, CFG)
    assert len(pts) == 2
    for p in pts:
        assert region[p[1], p[0]]
        assert SCALE.fake_min_dist <= dist(p, (128, 100)) <= SCALE.fake_fallback_max
    assert dist(pts[0], pts[1]) >= SCALE.fake_min_dist


def test_pooling_keeps_gt_spacing_and_limit():
    gt = [(10, 10), (200, 200)]
    fakes = [(12, 12), (100, 100), (110, 100), (10, 100), (100, 10), (200, 100), (100, 200), (10, 200), (200, 10),
             (150, 150)]
    kept = pool_fake_points(gt, fakes, np.random.default_rng(0), SCALE, CFG)
    assert (12, 12) not in kept and (110, 100) not in kept  # too close to a GT point / a kept fake
    assert len(gt) + len(kept) == 8
    for i, p in enumerate(kept):
        assert all(dist(p, q) >= SCALE.fake_min_dist for q in [*gt, *kept[:i]])
    many = [(20 * i, 0) for i in range(9)]
    assert pool_fake_points(many, [(100, 100)], np.random.default_rng(0), SCALE, CFG) == []


def test_point_options_colours_and_answers():
    exp_gt = [(1, 1)]
    con_gt = [(2, 2), (3, 3)]
    fakes = [(4, 4), (5, 5)]
    po = assign_point_options(exp_gt, con_gt, fakes, np.random.default_rng(1))
    assert [c for _, c in po.options] == [*POINT_COLORS[:5], "None"]
    assert po.options[-1] == (None, "None")
    assert [po.options[i - 1][0] for i in po.expansion_answer] == exp_gt
    assert [po.options[i - 1][0] for i in po.contraction_answer] == con_gt  # GT order, not option order
    assert po.colors(po.expansion_answer) == [po.options[po.expansion_answer[0] - 1][1]]
    none_only = assign_point_options([], [(1, 1)], [], np.random.default_rng(0))
    assert none_only.expansion_answer == [2] and none_only.colors([2]) == []
    orders = {tuple(p for p, _ in assign_point_options(exp_gt, con_gt, fakes, np.random.default_rng(s)).options)
              for s in range(10)}
    assert len(orders) > 1  # shuffled


def test_point_answers_keep_gt_order_when_the_shuffle_reverses_it():
    """§4: the answer lists the GT points in GT order (as the reference stores it), not in option order."""
    gt = [(1, 1), (2, 2), (3, 3)]
    seen_unsorted = False
    for seed in range(20):
        po = assign_point_options(gt, [], [(9, 9)], np.random.default_rng(seed))
        assert [po.options[i - 1][0] for i in po.expansion_answer] == gt
        assert po.colors(po.expansion_answer) == [po.options[i - 1][1] for i in po.expansion_answer]
        seen_unsorted |= po.expansion_answer != sorted(po.expansion_answer)
    assert seen_unsorted


def test_default_names_per_lesion_and_side():
    assert default_mask_names("pneumonia", "right", True) == [
        "default_keep", "default_right_lung_chex", "default_right_lung_cxas"]
    assert default_mask_names("pneumonia", "right", False) == ["default_keep"]
    assert default_mask_names("cardiomegaly", "left", True) == ["default_keep", "default_dilated", "default_eroded"]
    shown = disc(128, 128, 30)
    scale = CFG.scaled((1024, 1024))
    big = np.zeros((1024, 1024), dtype=bool)
    big[400:600, 400:600] = True
    d = default_masks("cardiomegaly", big, {}, scale)
    assert d["default_dilated"].sum() == 212 * 212 and d["default_eroded"].sum() == 188 * 188  # 5×5, 3 iterations
    lungs = {"right_chex": shown, "left_cxas": ~shown}
    d = default_masks("edema", shown, lungs, SCALE)
    assert set(d) == {"default_keep", "default_right_lung_chex", "default_left_lung_cxas"}


def _masks():
    names = {
        "optimal_component_0": disc(80, 80, 20),
        "optimal_component_1": disc(180, 180, 20),
        "suboptimal_component_0_exp1": disc(80, 80, 26),
        "suboptimal_component_0_exp1_fake_contraction_1": disc(80, 80, 20) & ~disc(95, 80, 8),
        "suboptimal_component_0_exp1_fake_expansion_1": disc(80, 80, 20) | disc(100, 80, 8),
        "dup": disc(80, 80, 20) | disc(100, 80, 8),
    }
    shown = names["suboptimal_component_0_exp1"] | names["optimal_component_1"]
    names["default_keep"] = shown
    names["default_right_lung_chex"] = disc(80, 120, 60)
    names["default_right_lung_cxas"] = disc(80, 120, 62)
    names["default_left_lung_chex"] = disc(180, 120, 60)
    return names, shown


def test_revision_options_rules():
    masks, shown = _masks()
    fakes0 = ["suboptimal_component_0_exp1_fake_contraction_1", "suboptimal_component_0_exp1_fake_expansion_1",
              "dup", "suboptimal_component_0_exp1", "default_keep", "default_right_lung_chex",
              "default_right_lung_cxas"]
    fakes1 = ["default_keep", "default_left_lung_chex"]
    true = ["optimal_component_0", "optimal_component_1"]
    before = ["suboptimal_component_0_exp1", "optimal_component_1"]
    for seed in range(15):
        opts = revision_options([fakes0, fakes1], true, before, masks, shown, np.random.default_rng(seed), CFG)
        assert len(opts.options) == 4
        assert [t for t, _, _ in opts.options].count("true") == 1
        assert opts.options[opts.answer - 1][0] == "true" and opts.options[opts.answer - 1][1] == true
        rendered = [m for _, _, m in opts.options]
        for i, m in enumerate(rendered):
            assert not np.array_equal(m, shown)
            assert all(not np.array_equal(m, o) for o in rendered[:i])
            assert np.array_equal(m, combination_mask(opts.options[i][1], masks, SHAPE))
        # the 3 fakes come from the group without defaults (2 distinct renderings there: dup ≡ fake_expansion_1)
        n_defaults = sorted(sum(n.startswith("default_") for n in c) for c in opts.fake_combinations)
        assert n_defaults[:2] == [0, 0] and n_defaults[2] == 1
        assert opts.true_masks == {"suboptimal_component_0": ["optimal_component_0"],
                                   "suboptimal_component_1": ["optimal_component_1"]}
        assert opts.fake_masks == {"suboptimal_component_0": fakes0, "suboptimal_component_1": fakes1}
        assert set(map(tuple, opts.fake_combinations)).isdisjoint({tuple(before), tuple(true)})
    answers = {revision_options([fakes0, fakes1], true, before, masks, shown, np.random.default_rng(s), CFG).answer
               for s in range(20)}
    assert len(answers) > 1
    keyed = revision_options([fakes0, fakes1], true, before, masks, shown, np.random.default_rng(0), CFG,
                             component_ids=[3, 5])
    assert list(keyed.true_masks) == list(keyed.fake_masks) == ["suboptimal_component_3", "suboptimal_component_5"]


def test_revision_options_fail_without_enough_distinct_fakes():
    masks, _ = _masks()
    with pytest.raises(OptionFailure, match="distinct"):
        revision_options([["default_keep"]], ["optimal_component_0"], ["suboptimal_component_0_exp1"],
                         {**masks, "default_keep": masks["suboptimal_component_0_exp1"]},
                         masks["suboptimal_component_0_exp1"], np.random.default_rng(0), CFG)
    with pytest.raises(OptionFailure, match="answer mask equals"):
        revision_options([["dup"]], ["optimal_component_0"], ["optimal_component_0"], masks,
                         masks["optimal_component_0"], np.random.default_rng(0), CFG)
    three = revision_options(
        [["suboptimal_component_0_exp1_fake_contraction_1", "suboptimal_component_0_exp1_fake_expansion_1"]],
        ["optimal_component_0"], ["suboptimal_component_0_exp1"], masks, masks["suboptimal_component_0_exp1"],
        np.random.default_rng(0), CFG)
    assert len(three.options) == 3


def test_revision_options_that_would_look_the_same_are_not_distractors():
    """A fake differing from another option by a few pixels (IoU ≥ option_max_iou) is not a distinct option."""
    from cxrground.percept.distractors import mask_iou

    masks, _ = _masks()
    lung = disc(128, 128, 100)
    nudge = lung.copy()
    nudge[128, 20:40] = ~nudge[128, 20:40]  # ~20 pixels of ~31,000: the same picture
    masks = {**masks, "whole": lung, "whole_nudged": nudge, "shown": disc(128, 128, 30)}
    assert 0.98 <= mask_iou(lung, nudge) < 1.0
    fakes = ["whole", "whole_nudged", "suboptimal_component_0_exp1_fake_expansion_1"]
    for seed in range(5):
        opts = revision_options([fakes], ["optimal_component_0"], ["shown"], masks, masks["shown"],
                                np.random.default_rng(seed), CFG)
        chosen = [tuple(c) for c in opts.fake_combinations]
        assert not {("whole",), ("whole_nudged",)} <= set(chosen), chosen
        rendered = [m for _, _, m in opts.options] + [masks["shown"]]
        assert all(mask_iou(a, b) < CFG.option_max_iou for i, a in enumerate(rendered) for b in rendered[:i])


@pytest.mark.parametrize("operation", [EXPANSION, CONTRACTION])
def test_fake_points_keep_their_whole_disc_on_the_film(operation):
    """Distractor points, contour and fallback alike, keep the point-disc margin from every border."""
    margin = SCALE.point_margin
    mask = disc(236, 128, 60)  # runs off the right edge
    for seed in range(20):
        pts = fake_point_pass(mask, operation, np.ones(SHAPE, bool), (236, 128), [], 2, np.random.default_rng(seed),
                              SCALE, CFG)
        assert pts
        for x, y in pts:
            assert margin <= x <= SHAPE[1] - 1 - margin and margin <= y <= SHAPE[0] - 1 - margin
    region = np.zeros(SHAPE, dtype=bool)
    region[:, -8:] = True  # only a strip along the right edge: the fallback may use its inner pixels only
    for seed in range(10):
        pts = fake_point_pass(disc(128, 128, 10), EXPANSION, region, (200, 128), [], 2,
                              np.random.default_rng(seed), SCALE, CFG)
        assert pts and all(x <= SHAPE[1] - 1 - margin for x, _ in pts)
