"""ILS §10: grounded location GL, the GL == RL test and empty locations EL on hand-built masks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cxrground.anatomy import ils_location_masks
from cxrground.ils.config import IlsConfig
from cxrground.ils.spatial.base import Box
from cxrground.ils.verify import REFINEMENT_ZONES, empty_locations, verify_location
from cxrground.reports.findings import Finding
from cxrground.vocab import ILS_LOCATION_LABELS
from masks_helpers import rect

SHAPE = (100, 100)
# both lungs span rows 10..88 (h = 78): upper y <= 36, mid 36 < y <= 62, base y > 62; apical y <= 27.16
RIGHT = rect(SHAPE, (10, 88), (5, 45))
LEFT = rect(SHAPE, (10, 88), (55, 95))
LOC = ils_location_masks(RIGHT, LEFT)


def _f(labels, lesion="pneumonia", assertion="present"):
    return Finding(entity=lesion or "nodule", sent_idx=1, assertion=assertion, lesion=lesion,
                   reported_location=tuple(labels))


def test_geometry_of_the_hand_built_zones():
    rows = lambda m: (int(np.flatnonzero(m.any(1))[0]), int(np.flatnonzero(m.any(1))[-1]))  # noqa: E731
    assert rows(LOC["left upper zone lung"]) == (10, 36)
    assert rows(LOC["left mid zone lung"]) == (37, 62)
    assert rows(LOC["left lung base"]) == (63, 88)


def test_gl_keeps_grounded_labels_and_discards_the_rest():
    box = Box(10, 70, 40, 85, 0.9)  # right base only
    check = verify_location(["right lung base", "left lung base"], LOC, [box])
    assert check.grounded == ("right lung base",) and check.discarded == ("left lung base",)
    assert not check.complete
    both = verify_location(["right lung base", "left lung base"], LOC, [box, Box(60, 70, 90, 85, 0.9)])
    assert both.grounded == ("right lung base", "left lung base") and both.complete
    none = verify_location(["left upper zone lung"], LOC, [box])
    assert none.grounded == () and not none.complete


def test_whole_lung_refinement_matches_the_published_example():
    box = Box(60, 70, 90, 85, 0.9)  # left base only
    check = verify_location(["left lung", "right lung base"], LOC, [box])
    assert check.grounded == ("left lung base",)
    assert check.refined == {"left lung": ("left lung base",)}
    assert check.discarded == ("right lung base",) and not check.complete


def test_whole_lung_refinement_switch_and_zone_order():
    box = Box(60, 50, 90, 80, 0.9)  # left mid zone and base
    on = verify_location(["left lung"], LOC, [box], IlsConfig())
    assert on.grounded == ("left mid zone lung", "left lung base") and on.complete
    off = verify_location(["left lung"], LOC, [box], replace(IlsConfig(), refine_whole_lung_grounding=False))
    assert off.grounded == ("left lung",) and off.complete
    assert verify_location(["left lung"], LOC, [box], refine_whole_lung=False).grounded == ("left lung",)
    apex = verify_location(["right lung"], LOC, [Box(10, 10, 40, 20, 0.9)])
    assert apex.grounded == ("right upper zone lung",)  # apical ⊂ upper: never produced by refinement
    assert "apical zone lung" not in REFINEMENT_ZONES
    # a zone already reported is not repeated
    dup = verify_location(["left lung", "left lung base"], LOC, [Box(60, 70, 90, 85, 0.9)])
    assert dup.grounded == ("left lung base",) and dup.complete


def test_gl_unknown_labels_are_never_grounded():
    check = verify_location(["heart", "right lung"], LOC, [Box(10, 70, 40, 85, 0.9)], refine_whole_lung=False)
    assert check.unknown_labels == ("heart",) and check.grounded == ("right lung",) and not check.complete
    assert check.to_dict()["complete"] is False


def test_el_excludes_every_overlapping_label():
    el = empty_locations([_f(["right lung base"])], LOC)
    assert "right lung base" not in el and "right lung" not in el  # the whole lung overlaps its base
    assert set(el) == set(ILS_LOCATION_LABELS) - {"right lung base", "right lung"}
    assert el.blocked_by == {"right lung": (0,), "right lung base": (0,)}
    assert list(el) == [lab for lab in ILS_LOCATION_LABELS if lab in el.labels]  # §3.1 order
    assert len(el) == 8


def test_el_non_target_finding_blocks_its_location():
    lesion_only = empty_locations([_f(["right lung base"])], LOC)
    assert "left upper zone lung" in lesion_only and "left apical zone lung" in lesion_only
    nodule = _f(["left upper zone lung"], lesion=None)  # a finding outside the seven lesions
    el = empty_locations([_f(["right lung base"]), nodule], LOC)
    for lab in ("left upper zone lung", "left apical zone lung", "left lung"):  # apical ⊂ upper overlaps
        assert lab not in el
        assert el.blocked_by[lab] == (1,)
    assert "left mid zone lung" in el and "left lung base" in el and "right apical zone lung" in el


def test_el_special_labels_unlocated_and_negated_findings():
    assert list(empty_locations([_f(["lung"])], LOC)) == []
    el = empty_locations([_f(["heart"], lesion="cardiomegaly"), _f([], lesion=None)], LOC)
    assert list(el) == list(ILS_LOCATION_LABELS)
    assert el.unknown_labels == ("heart",) and el.unlocated == (1,)
    negated = _f(["left lung base"], assertion="absent")
    assert "left lung base" not in empty_locations([negated], LOC)  # default: every mentioned finding
    assert "left lung base" in empty_locations([negated], LOC, include_absent=False)
    uncertain = _f(["left lung base"], assertion="uncertain")
    assert "left lung base" not in empty_locations([uncertain], LOC, include_absent=False)


def test_el_skips_labels_without_pixels_and_checks_shapes():
    loc = ils_location_masks(RIGHT, np.zeros(SHAPE, bool))
    el = empty_locations([], loc)
    assert not any(lab.startswith("left") for lab in el)
    bad = dict(LOC)
    bad["left lung"] = np.zeros((10, 10), bool)
    with pytest.raises(Exception, match="shape"):
        empty_locations([_f(["left lung"])], bad)


def test_widen_to_lungs_blocks_the_whole_lung_of_a_reported_finding():
    from cxrground.ils.verify import widen_to_lungs

    found = [_f(["right lung base"]), _f(["lung"], lesion="edema"), _f(["left upper zone lung"], assertion="absent"),
             _f([], lesion="opacity"), _f(["heart"], lesion="cardiomegaly")]
    wide = widen_to_lungs(found)
    assert [w.reported_location for w in wide] == [("right lung",), ("right lung", "left lung"),
                                                   ("left upper zone lung",), (), ("heart",)]
    # the ILS EL keeps the right upper zone free; the widened findings block the whole right lung
    ils = empty_locations([found[0]], LOC)
    lung = empty_locations(widen_to_lungs([found[0]]), LOC)
    assert "right upper zone lung" in ils.labels and "right lung" not in ils.labels
    assert set(lung.labels) == {"left apical zone lung", "left upper zone lung", "left mid zone lung",
                                "left lung base", "left lung"}
    assert empty_locations(widen_to_lungs(found[:2]), LOC).labels == ()


def test_unknown_negative_exclusion_is_refused():
    from cxrground.errors import ConfigError

    with pytest.raises(ConfigError, match="negative exclusion 'side'"):
        IlsConfig(negative_exclusion="side")


def test_ils_build_offers_the_negative_exclusion():
    from click.testing import CliRunner

    from cxrground.cli import main
    from cxrground.ils.request import BuildRequest

    runner = CliRunner()
    assert "--negative-exclusion" in runner.invoke(main, ["ils", "build", "--help"]).output
    bad = runner.invoke(main, ["ils", "build", "--images", ".", "--out", "x", "--negative-exclusion", "side"])
    assert bad.exit_code != 0 and "negative-exclusion" in bad.output
    assert BuildRequest.__dataclass_fields__["negative_exclusion"].default == "location"


def test_build_request_hands_the_exclusion_to_the_build(tmp_path, monkeypatch):
    import cxrground.ils.build as build
    import cxrground.ils.tasks as tasks
    from cxrground.ils.request import BuildRequest, run_build

    seen = {}
    monkeypatch.setattr(build, "check_backends", lambda *a, **k: None)
    monkeypatch.setattr(tasks, "build_tasks", lambda *a, **k: (["one study"], []))
    monkeypatch.setattr(tasks, "studies_without_subject", lambda found: 0)  # the placeholder study names none
    monkeypatch.setattr(build, "build_dataset", lambda tasks, out, config, *a, **k: seen.setdefault("config", config))
    (tmp_path / "images").mkdir()
    run_build(BuildRequest(images=tmp_path / "images", out=tmp_path / "out", negative_exclusion="lung"),
              progress=False)
    assert seen["config"].negative_exclusion == "lung"
