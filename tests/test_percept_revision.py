"""CheXpercept contour-revision planning end to end (§5.1, §6-§9 via plan_revision) on synthetic lungs."""

from __future__ import annotations

import itertools
import json
import pickle
import re

import numpy as np
import pytest

from cxrground.percept.config import DeformConfig
from cxrground.percept.deform import BuiltinDeformer, validity_problem
from cxrground.percept.deform.sampling import side_of
from cxrground.percept.revision import LungSources, RevisionFailure, RevisionPlan, plan_revision
from cxrground.percept.steps import center_point

N = 256
S = N / 256
YY, XX = np.mgrid[0:N, 0:N]
RIGHT = ((XX - 78) / 46) ** 2 + ((YY - 130) / 95) ** 2 <= 1
LEFT = ((XX - 178) / 46) ** 2 + ((YY - 130) / 95) ** 2 <= 1
LUNGS = LungSources.single(RIGHT, LEFT)
IMAGE = (np.random.default_rng(0).random((N, N)) * 255).astype(np.uint8)
SCALE = DeformConfig().scaled((N, N))


def ellipse(cx, cy, rx, ry):
    return ((XX - cx) / rx) ** 2 + ((YY - cy) / ry) ** 2 <= 1


def random_lesion(rng: np.random.Generator) -> np.ndarray:
    """One or two blobs inside the lungs, small to lobe-sized."""
    out = np.zeros((N, N), dtype=bool)
    for _ in range(int(rng.integers(1, 3))):
        side = RIGHT if rng.random() < 0.5 else LEFT
        cx = 78 + rng.uniform(-20, 20) if side is RIGHT else 178 + rng.uniform(-20, 20)
        out |= ellipse(cx, rng.uniform(60, 200), rng.uniform(12, 40), rng.uniform(12, 60)) & side
    return out


def plan(seed: int, lesion="pneumonia", candidate=None) -> RevisionPlan:
    rng = np.random.default_rng(seed)
    cand = random_lesion(rng) if candidate is None else candidate
    return plan_revision(IMAGE, lesion, cand, LUNGS, BuiltinDeformer(), rng)


@pytest.fixture(scope="module")
def plans() -> dict[int, RevisionPlan]:
    out = {}
    for seed in range(30):
        try:
            out[seed] = plan(seed)
        except RevisionFailure as exc:
            assert exc.reason.startswith(("deformation failed", "revision options"))
    return out


def test_most_random_lesions_get_a_plan(plans):
    assert len(plans) >= 24


def _steps(p: RevisionPlan):
    res = p.record["qa_deformation_results"]
    return [s for op in ("expansion", "contraction") for steps in res[op].values() for s in steps]


def test_validity_rule_on_every_kept_deformation(plans):
    for p in plans.values():
        for step in _steps(p):
            cid = int(step["suboptimal_component_id"].rsplit("_", 1)[1])
            comp_steps = [s for s in _steps(p) if s["suboptimal_component_id"] == step["suboptimal_component_id"]]
            # accumulated points: expansions of this component up to k, then contractions up to k
            exp = [pt for s in comp_steps if "exp_idx" in s and (("exp_idx" not in step) or s["exp_idx"] <= step[
                "exp_idx"]) for pt in s["points"]]
            con = [pt for s in comp_steps if "cont_idx" in s and "cont_idx" in step and s["cont_idx"] <= step[
                "cont_idx"] for pt in s["points"]]
            mask = p.masks[step["mask_path"]]
            assert validity_problem(mask, p.components[cid], exp, con) is None
            for name, pts in step["fake_mask_points"].items():
                assert validity_problem(p.masks[name], mask, pts["expansion"], pts["contraction"]) is None


def test_step_naming_flow_and_shown_mask(plans):
    both = 0
    for p in plans.values():
        assert p.deformed
        by_comp: dict[str, list[dict]] = {}
        for op in ("expansion", "contraction"):
            for cid, steps in p.record["qa_deformation_results"][op].items():
                assert re.fullmatch(r"suboptimal_component_\d+", cid)
                for k, s in enumerate(steps, start=1):
                    tag = "exp" if op == "expansion" else "cont"
                    assert s["suboptimal_component_id"] == cid and s["mask_path"] == f"{cid}_{tag}{k}"
                    assert s[f"{tag}_idx"] == k
                    assert s["revision"] == ("contraction" if op == "expansion" else "expansion")
                    assert s["center_point"] == list(center_point([tuple(q) for q in s["points"]]))
                    by_comp.setdefault(cid, []).append(s)
        after = [f"optimal_component_{i}" for i in range(len(p.components))]
        for cid, steps in by_comp.items():
            i = int(cid.rsplit("_", 1)[1])
            ordered = sorted(steps, key=lambda s: ("cont" in s["mask_path"], s["mask_path"]))
            assert ordered[0]["revision_flow"]["after revision"] == f"optimal_component_{i}"
            for prev, cur in itertools.pairwise(ordered):
                assert cur["revision_flow"]["after revision"] == prev["mask_path"]  # expansions first
            last = ordered[-1]["mask_path"]
            assert p.revision_before_masks[i] == last
            both += any("exp" in s["mask_path"] for s in steps) and any("cont" in s["mask_path"] for s in steps)
        for cid, entries in p.record["qa_deformation_results"]["no_deformation"].items():
            i = int(cid.rsplit("_", 1)[1])
            # a component no step deforms: one name before and after the revision, in every field (§8, §12)
            assert entries[0] == {"suboptimal_component_id": cid, "mask_path": f"{cid}_no_contraction"}
            assert p.revision_before_masks[i] == f"{cid}_no_contraction" == p.true_masks[cid][0]
            assert p.true_combination[i] == f"{cid}_no_contraction"
            assert np.array_equal(p.masks[f"{cid}_no_contraction"], p.components[i])
            after[i] = f"{cid}_no_contraction"
        assert p.revision_after_masks == after == [names[0] for names in p.true_masks.values()]
        shown = np.zeros((N, N), dtype=bool)
        for name in p.revision_before_masks:
            shown |= p.masks[name]
        assert np.array_equal(shown, p.shown) and not np.array_equal(p.shown, p.optimal)
        anatomies = [s["anatomy"] for s in _steps(p)]
        assert len(anatomies) == len(set(anatomies)) and 1 <= len(anatomies) <= 3
    assert both >= 1


def test_point_answers_follow_section_4(plans):
    kinds = set()
    for p in plans.values():
        steps = _steps(p)
        # GT order: component order, then step order (§4, the reference's GT point lists)
        exp_centres = [tuple(s["center_point"]) for s in steps if "cont_idx" in s]  # contracted → expand
        con_centres = [tuple(s["center_point"]) for s in steps if "exp_idx" in s]
        opts = p.point_options
        assert opts[-1] == (None, "None") and len(opts) <= 9
        assert [c for _, c in opts[:-1]] == list(("red", "orange", "yellow", "green", "blue", "purple", "pink",
                                                  "brown")[: len(opts) - 1])
        none = len(opts)
        for answer, centres in ((p.expansion_answer, exp_centres), (p.contraction_answer, con_centres)):
            if centres:
                assert [tuple(opts[i - 1][0]) for i in answer] == centres
            else:
                assert answer == [none]
        assert p.expansion_colors == [opts[i - 1][1] for i in p.expansion_answer if i != none]
        pts = [q for q, _ in opts[:-1]]
        for i in range(len(pts)):
            for j in range(i):
                gap = np.hypot(pts[i][0] - pts[j][0], pts[i][1] - pts[j][1])
                assert gap >= SCALE.gt_point_min_dist
        kinds.add((p.expansion_answer == [none], p.contraction_answer == [none]))
    assert len(kinds) >= 2


def test_revision_options(plans):
    for p in plans.values():
        assert len(p.mask_options) in (3, 4)
        assert [o.type for o in p.mask_options].count("true") == 1
        ans = p.mask_options[p.revision_answer - 1]
        assert ans.type == "true" and ans.masks == p.true_combination
        assert np.array_equal(ans.mask, p.optimal)
        for i, o in enumerate(p.mask_options):
            assert not np.array_equal(o.mask, p.shown)
            assert all(not np.array_equal(o.mask, q.mask) for q in p.mask_options[:i])
        assert [o.masks for o in p.mask_options if o.type == "fake"] == p.fake_combinations
        # defaults: chex/cxas lungs only for the first component of each side
        sides_seen = set()
        assert list(p.fake_masks) == list(p.true_masks) == [f"suboptimal_component_{i}"
                                                             for i in range(len(p.components))]
        for cid in p.fake_masks:
            names = p.fake_masks[cid]
            lung_defaults = [n for n in names if n.endswith(("_chex", "_cxas"))]
            assert "default_keep" in names
            steps = [s for s in _steps(p) if s["suboptimal_component_id"] == cid]
            if steps:
                first = sorted(steps, key=lambda s: ("cont" in s["mask_path"], s["mask_path"]))[0]
                side = side_of(first["anatomy"])
            else:
                side = "left" if p.overlaps[int(cid.rsplit("_", 1)[1])].lung("left").ratio > 0 else "right"
            if side in sides_seen:
                assert lung_defaults == []
            else:
                assert lung_defaults == [f"default_{side}_lung_chex", f"default_{side}_lung_cxas"]
            sides_seen.add(side)


def test_record_is_json_ready(plans):
    p = next(iter(plans.values()))
    text = json.dumps(p.record)
    rec = json.loads(text)
    assert rec["qa_deformation_success"] is True
    assert set(rec) >= {"org_deformation_results", "qa_deformation_results", "geometrical_mask_infos"}
    org = rec["org_deformation_results"]
    assert set(org["possible_deformation_anatomy"]) >= {s["anatomy"] for s in _steps(p)}
    assert list(org["deformation_results"]) == [f"suboptimal_component_{i}" for i in range(len(p.components))]
    infos = rec["geometrical_mask_infos"]
    assert [info["mask_component_id"] for info in infos] == list(range(len(p.components)))  # integer ids
    assert {"overlap_ratio", "has_overlap", "size"} == set(infos[0]["overlap"]["left lung"])


def test_determinism():
    a, b, c = plan(3), plan(3), plan(4)
    assert json.dumps(a.record) == json.dumps(b.record)
    assert a.point_options == b.point_options and a.revision_answer == b.revision_answer
    assert all(np.array_equal(a.masks[k], b.masks[k]) for k in a.masks) and a.masks.keys() == b.masks.keys()
    assert [o.masks for o in a.mask_options] == [o.masks for o in b.mask_options]
    assert json.dumps(a.record) != json.dumps(c.record)
    # same candidate, different seed → a different plan
    cand = random_lesion(np.random.default_rng(3))
    d = plan_revision(IMAGE, "pneumonia", cand, LUNGS, BuiltinDeformer(), np.random.default_rng(99))
    assert json.dumps(d.record) != json.dumps(a.record)


def test_plan_pickles_for_process_pools(plans):
    p = next(iter(plans.values()))
    q = pickle.loads(pickle.dumps(p))
    assert json.dumps(q.record) == json.dumps(p.record) and q.revision_answer == p.revision_answer
    assert np.array_equal(q.geometry.lung("left"), p.geometry.lung("left"))
    assert all(np.array_equal(q.geometry.subregions[k], v) for k, v in p.geometry.subregions.items())


def test_lobe_sized_lesion_gets_contractions():
    big = RIGHT & (YY > 60)  # ≥ 0.7 of the right lung → every anatomy contracts
    p = plan(1, candidate=big)
    steps = _steps(p)
    assert steps and all("cont_idx" in s for s in steps)
    assert p.contraction_answer == [len(p.point_options)]  # nothing was expanded
    assert len(p.expansion_answer) == len(steps)


def test_cardiomegaly_uses_zones_depth_one_and_its_defaults():
    heart = ellipse(128, 175, 45, 35) & ~(RIGHT & (XX < 100)) & ~(LEFT & (XX > 156))
    heart |= ellipse(128, 175, 40, 30)
    p = plan(2, lesion="cardiomegaly", candidate=heart)
    assert p.overlaps[0].lung_regions is None
    for s in _steps(p):
        assert s["anatomy"].endswith(("zone lung", "lung base"))
        assert 2 <= len(s["points"]) <= 4
    assert set(p.fake_masks["suboptimal_component_0"]) >= {"default_keep", "default_dilated", "default_eroded"}
    levels = p.record["org_deformation_results"]["deformation_results"]["suboptimal_component_0"][
        "anatomy_depth_width_levels"]
    assert all(v["depth"] == 1 for v in levels.values())


def test_failures_are_reported():
    tiny = ellipse(78, 130, 3, 3)
    with pytest.raises(RevisionFailure, match="no component"):
        plan(0, candidate=tiny)
    with pytest.raises(RevisionFailure, match="no component"):
        plan(0, candidate=np.zeros((N, N), dtype=bool))
    outside = ellipse(128, 20, 15, 10) & ~RIGHT & ~LEFT  # touches no lung: no anatomy to deform
    with pytest.raises(RevisionFailure, match="deformation failed"):
        plan(0, candidate=outside)
    with pytest.raises(Exception, match="shape"):
        plan_revision(IMAGE[:100], "pneumonia", RIGHT, LUNGS, BuiltinDeformer(), np.random.default_rng(0))
    with pytest.raises(Exception, match="unknown lesion"):
        plan_revision(IMAGE, "fracture", RIGHT, LUNGS, BuiltinDeformer(), np.random.default_rng(0))


def test_scale_rule_on_a_non_square_larger_canvas():
    h, w = 384, 512  # s = 0.5
    yy, xx = np.mgrid[0:h, 0:w]
    right = ((xx - 156) / 92) ** 2 + ((yy - 190) / 150) ** 2 <= 1
    left = ((xx - 356) / 92) ** 2 + ((yy - 190) / 150) ** 2 <= 1
    cand = (((xx - 150) / 40) ** 2 + ((yy - 150) / 50) ** 2 <= 1) & right
    img = np.zeros((h, w), np.uint8)
    p = plan_revision(img, "opacity", cand, LungSources.single(right, left), BuiltinDeformer(),
                      np.random.default_rng(5))
    assert p.shown.shape == (h, w) and all(o.mask.shape == (h, w) for o in p.mask_options)
    pts = [q for q, _ in p.point_options if q is not None]
    assert all(0 <= x < w and 0 <= y < h for x, y in pts)
