"""What ``percept build`` refuses to make a case of, and how it says so: lung masks that reach the film edge,
estimated hearts for cardiomegaly, missing ``--anatomy`` masks, unreadable films; and the card's answer balance."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from cxrground.io.masks import encode_rle
from cxrground.percept import plans
from cxrground.percept.build import ESTIMATED_HEART, BuildOptions, build_benchmark
from cxrground.percept.card import answer_balance, answer_lines
from cxrground.percept.cases import Candidate
from cxrground.percept.validate import validate_benchmark
from percept_build_helpers import synthetic_ils

SHAPE = (512, 512)


def _lungs(bottom: int = 440, right_col: int = 470) -> np.ndarray:
    lungs = np.zeros(SHAPE, bool)
    lungs[80:bottom, 60:230] = True
    lungs[80:bottom, 280:right_col] = True
    return lungs


def test_a_lung_mask_along_the_film_edge_is_not_trusted() -> None:
    assert plans.lung_edge_problem(_lungs()) is None
    # the left lung runs down into the abdomen, ending 2 rows above the bottom (the audit's film): within the band
    low = _lungs()
    low[440:510, 300:400] = True
    problem = plans.lung_edge_problem(low)
    assert problem is not None and problem.startswith("lung mask reaches the film edge")
    assert "bottom edge along 19.5% of it" in problem and "within 5 px" in problem
    # a lung that runs off the right side over a fifth of its height
    side = plans.lung_edge_problem(_lungs(right_col=512))
    assert side is not None and "right edge along 70.3% of it" in side
    # a costophrenic tip grazing the edge (under 5 % of it) is trusted
    tip = _lungs()
    tip[440:512, 100:120] = True
    assert plans.lung_edge_problem(tip) is None
    # the top edge is not checked (an apex cut off by the collimation)
    top = _lungs()
    top[0:80, 60:230] = True
    assert plans.lung_edge_problem(top) is None


def _cand(lesion: str = "edema") -> Candidate:
    return Candidate(key_id=f"{lesion}_p", lesion=lesion, pair_id="p", study="s1", split="train", dicom_id="d1",
                     image_path="d1.png", positive=True, pair_type="global")


def _task(anatomy, image: str = "d1.png", missing=None) -> plans.PlanTask:
    lesion = np.zeros(SHAPE, bool)
    lesion[200:300, 100:200] = True
    return plans.PlanTask(_cand(), "c", image, "dataset", encode_rle(lesion), anatomy, 0, "builtin", {}, False,
                          anatomy_missing=missing)


def test_plan_failures_name_their_stage(monkeypatch, tmp_path) -> None:
    bad = tmp_path / "d1.png"
    bad.write_bytes(b"not an image")
    anatomy = plans.AnatomySource(encode_rle(_lungs()[:, :256]), encode_rle(_lungs()[:, 256:]), None, None, None,
                                  None)
    unit = plans.make_plan(_task(anatomy, str(bad)))
    assert (unit["status"], unit["stage"], unit["path"]) == ("failed", "images", str(bad))
    assert "not a recognised image format" in unit["reason"]

    monkeypatch.setattr(plans, "read_image", lambda path: SimpleNamespace(pixels=np.zeros(SHAPE, np.uint8)))
    missing = plans.MissingAnatomy("no left lung mask for study s1: anat/s1_left_lung.png is missing",
                                   "anat/s1_left_lung.png")
    unit = plans.make_plan(_task(None, missing=missing))
    assert (unit["stage"], unit["reason"], unit["path"]) == ("anatomy", missing.reason, missing.path)

    low = _lungs()
    low[440:512, 300:400] = True
    edge = plans.AnatomySource(encode_rle(low & (np.arange(512) < 256)), encode_rle(low & (np.arange(512) >= 256)),
                               None, None, None, SHAPE)
    unit = plans.make_plan(_task(edge))
    assert unit["stage"] == "anatomy" and unit["reason"].startswith("lung mask reaches the film edge (bottom edge")


def _png(path: Path) -> None:
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(path)


def test_a_missing_anatomy_mask_is_named_with_its_side(tmp_path) -> None:
    folder = tmp_path / "anat"
    folder.mkdir()
    _png(folder / "d1_right_lung.png")  # found by dicom_id; its left lung is missing
    lookup = plans.anatomy_lookup(str(folder), tmp_path)
    cand = _cand()
    assert lookup(cand) is None
    missing = lookup.missing(cand)
    assert missing.path == str(folder / "d1_left_lung.png")
    assert missing.reason == (f"no left lung mask for study s1: {folder / 'd1_left_lung.png'} is missing (its other "
                              "lung d1_right_lung.png is there)")
    (folder / "d1_right_lung.png").unlink()
    missing = lookup.missing(cand)
    assert missing.path == str(folder) and "tried s1_right_lung.png / s1_left_lung.png, d1_right_lung.png" in \
        missing.reason
    jsonl = tmp_path / "anatomy.jsonl"
    jsonl.write_text(json.dumps({"study": "other", "right_lung": "r.png", "left_lung": "l.png"}) + "\n")
    missing = plans.anatomy_lookup(str(jsonl), tmp_path).missing(cand)
    assert missing.path == str(jsonl) and "no anatomy record for study s1 (nor for dicom_id d1)" in missing.reason


def _case(path: str, det: int, exp: list[int] | None = None, n_points: int = 3, dist: int | None = None) -> dict:
    case: dict = {"qa_path": path, "detection_qa": {"answer_index": det, "answer_options": ["Yes", "No"]}}
    if exp is not None:
        options = [{"color": "red"}] * n_points + [{"color": "None"}]
        case["contour_qa"] = {"contour_eval_qa": {"answer_index": 1, "answer_options": ["Yes", "No"]},
                              "contour_revision_qa_expansion": {"answer_index": exp, "answer_options": options}}
    if dist is not None:
        case["attribute_extraction_qa"] = {"distribution": {"answer_index": dist, "answer_options": ["a"] * 4}}
    return case


def test_the_card_shows_the_answer_balance() -> None:
    rr, rf, lf = "revision_required", "revision_free", "lesion_free"
    cases = [_case(rr, 1, [4], dist=4), _case(rr, 1, [4], dist=4), _case(rr, 1, [1, 3], dist=2),
             _case(rf, 1, [2], dist=4), _case(lf, 2)]
    balance = answer_balance(cases)
    assert balance["detection"] == ({"1": 4, "2": 1}, {"1": 4, "2": 1})
    assert balance["expansion"] == ({"None": 2, "1": 1, "3": 1}, {"None": 2, "1,3": 1})  # RR only: RF's is unasked
    assert balance["distribution"][1] == {"4": 3, "2": 1}
    lines = answer_lines(cases)
    assert "### Answer balance" in lines
    assert "| detection | 5 | 1: 4, 2: 1 | 1 | 80% |" in lines
    assert "| expansion | 3 | 1: 1, 3: 1, None: 2 | None | 67% |" in lines
    assert "| distribution | 4 | 2: 1, 4: 3 | 4 | 75% |" in lines
    assert answer_lines([]) == []


@pytest.fixture(scope="module")
def synth_ils(tmp_path_factory) -> tuple[Path, Path]:
    return synthetic_ils(tmp_path_factory)


def test_estimated_hearts_and_unreadable_positive_films(synth_ils, tmp_path) -> None:
    """With ``drop_estimated_hearts`` a cardiomegaly positive whose heart is an estimate (the built-in anatomy's, as
    in the synthetic cohort) is dropped at stage ``anatomy`` and counted on the card; by default they are kept. A
    positive whose film cannot be read is a failure of stage ``images``. The card shows the answer balance."""
    ils, images = synth_ils
    records = [json.loads(x) for x in (ils / "anatomy.jsonl").read_text().splitlines()]
    assert {r["heart_source"] for r in records} == {"estimate"}
    data = json.loads((ils / "mimic_ils_instruction_answer.json").read_text())
    positive = next(s for split in data.values() for s in split.values()
                    if any(p["target"] == "edema" for p in s["instruction_answer_pairs"]["positive_pairs"]))
    copy = tmp_path / "files"
    shutil.copytree(images, copy)
    (copy / positive["image_path"]).write_bytes(b"not an image at all")
    opts = BuildOptions(ils=str(ils), images=str(copy), per_lesion=(1, 1, 1), max_candidates=2,
                        splits=("train", "val", "test"), seed=0, drop_estimated_hearts=True)
    summary = build_benchmark(opts, tmp_path / "b", progress=False)
    out = tmp_path / "b"
    assert validate_benchmark(out) == []
    bench = json.loads((out / "chexpercept.json").read_text())
    assert not [c for c in bench.values() if c["lesion"] == "cardiomegaly" and c["qa_path"] != "lesion_free"]
    failures = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    hearts = [f for f in failures if f["reason"] == ESTIMATED_HEART]
    assert hearts and all(f["lesion"] == "cardiomegaly" and f["stage"] == "anatomy" for f in hearts)
    unread = [f for f in failures if f.get("path") == str(copy / positive["image_path"])]
    assert unread and {f["stage"] for f in unread} == {"images"}
    card = (out / "card.md").read_text()
    assert f"| anatomy: {ESTIMATED_HEART.split(' (')[0]} (…) | {len(hearts)} |" in card
    assert "*heart mask is an estimate*" in card and "### Answer balance" in card
    assert "| detection | " in card and summary.failures == len(failures)

    build_benchmark(replace(opts, drop_estimated_hearts=False), tmp_path / "k", progress=False)
    bench = json.loads((tmp_path / "k" / "chexpercept.json").read_text())
    assert [c for c in bench.values() if c["lesion"] == "cardiomegaly" and c["qa_path"] != "lesion_free"]
    assert ESTIMATED_HEART not in (tmp_path / "k" / "failures.jsonl").read_text()

