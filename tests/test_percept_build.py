"""CheXpercept builder: curation rules (§11), card arithmetic (§1.4), QA assembly (§3, §4, §12), path rules,
and an end-to-end build on the synthetic cohort (valid, counts follow the arithmetic, byte-identical)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cxrground.errors import ConfigError, InputError, OptionValueError
from cxrground.percept.build import BuildOptions, build_benchmark
from cxrground.percept.cases import (
    Candidate,
    balanced_sample,
    count_arithmetic,
    negative_candidates,
    positive_candidates,
    read_review,
    split_rf_rr,
)
from cxrground.percept.layout import BUILD_SETTINGS_FILE, case_folder, stable_json
from cxrground.percept.qa import CaseImages, lesion_free_case, points_answer_text, positive_case
from cxrground.percept.request import BuildRequest, parse_rf_ratio
from cxrground.percept.schema import ATTRIBUTE_KEYS, load_benchmark, parse_benchmark
from cxrground.percept.validate import validate_benchmark
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.percept_templates import (
    CONTRACTION,
    EXPANSION,
    PATH_LESION_FREE,
    REVISION_RESULT,
    YES_NO,
    contour_eval_stem,
    detection_stem,
    format_question,
    initial_context,
    mask_options,
    point_options,
)
from percept_build_helpers import synthetic_bench, synthetic_ils

LF, RF, RR = "lesion_free", "revision_free", "revision_required"


# --- §1.4 arithmetic -----------------------------------------------------------------------------------

def test_published_arithmetic() -> None:
    t = count_arithmetic((100, 100, 100))
    assert t.cxrs == 2100 and t.items == 10400
    assert t.items_per_lesion["pneumonia"] == 100 * 1 + 100 * (1 + 1 + 4) + 100 * (1 + 1 + 3 + 4) == 1600
    assert t.items_per_lesion["cardiomegaly"] == 100 + 100 * 2 + 100 * (1 + 1 + 3) == 800
    assert t.tasks == {"detection": 2100, "contour evaluation": 1400, "expansion": 700, "contraction": 700,
                       "revision result": 700, "distribution": 1200, "location": 1200, "severity": 1200,
                       "comparison": 1200}


def test_arithmetic_other_counts_and_achieved_mapping() -> None:
    t = count_arithmetic((2, 1, 3))
    # lung lesion: 2·1 + 1·6 + 3·9 = 35; cardiomegaly: 2 + 1·2 + 3·5 = 19
    assert t.items_per_lesion["edema"] == 35 and t.items_per_lesion["cardiomegaly"] == 19
    assert t.items == 6 * 35 + 19 and t.cxrs == 7 * 6
    achieved = count_arithmetic({"cardiomegaly": {RR: 1}, "opacity": {LF: 1, RF: 1}})
    assert achieved.cxrs == 3 and achieved.items == 5 + 1 + 6
    assert achieved.tasks["distribution"] == 1 and achieved.tasks["expansion"] == 1


# --- §11 curation ------------------------------------------------------------------------------------

def _pos(pid: str, target: str, kind: str, loc: list[str]) -> dict:
    return {"pair_id": pid, "target": target, "type": kind, "reported_location": loc,
            "seg_mask_path": f"{pid}.png", "instruction": "x.", "answer": "[SEG]"}


def _neg(pid: str, target: str, kind: str = "global") -> dict:
    return {"pair_id": pid, "target": target, "type": kind}


def _dataset() -> dict:
    def study(dicom: str, pos: list, neg: list) -> dict:
        return {"dicom_id": dicom, "image_path": f"{dicom}.png",
                "instruction_answer_pairs": {"positive_pairs": pos, "negative_pairs": neg}}
    return {"train": {
        "s1": study("d1", [_pos("s1_positive_0", "opacity", "basic", ["left lung base"]),
                           _pos("s1_positive_1", "opacity", "basic", ["right lung"]),
                           _pos("s1_positive_2", "edema", "global", ["right lung", "left lung"])],
                    [_neg("s1_negative_0", "effusion")]),
        "s2": study("d2", [_pos("s2_positive_0", "opacity", "global", ["left lung base"]),
                           _pos("s2_positive_1", "opacity", "basic", ["left lung base"]),
                           _pos("s2_positive_2", "opacity", "global", ["right lung base"]),
                           _pos("s2_positive_3", "cardiomegaly", "basic", ["heart"])],
                    [_neg("s2_negative_0", "effusion"), _neg("s2_negative_1", "edema")]),
        "s3": study("d3", [], [_neg("s3_negative_0", "edema"), _neg("s3_negative_1", "pneumonia", "basic"),
                               _neg("s3_negative_2", "cardiomegaly")]),
    }, "test": {"s9": study("d9", [_pos("s9_positive_0", "opacity", "global", ["right lung"])], [])}}


def test_positive_candidates_global_first_then_first_basic() -> None:
    pos = positive_candidates(_dataset())
    assert [c.pair_id for c in pos["opacity"]] == ["s2_positive_0", "s2_positive_2", "s1_positive_0"]
    assert [c.pair_type for c in pos["opacity"]] == ["global", "global", "basic"]
    assert pos["opacity"][0].key_id == "opacity_s2_positive_0"
    assert pos["opacity"][2].instruction == "Segment the opacity in the left lung base."
    assert pos["edema"][0].instruction == "Segment the edema."  # bilateral → global instruction
    assert pos["cardiomegaly"][0].instruction == "Segment the cardiomegaly."
    assert [c.pair_id for c in positive_candidates(_dataset(), max_candidates=1)["opacity"]] == ["s2_positive_0"]
    assert [c.split for c in positive_candidates(_dataset(), ("train", "test"))["opacity"]][-2:] == ["test", "train"]


def test_negative_candidates_one_cxr_across_lesions() -> None:
    neg = negative_candidates(_dataset())
    # cardiomegaly comes first in LESIONS order and claims d3; edema then may use d2 only; effusion d1 only
    assert [c.dicom_id for c in neg["cardiomegaly"]] == ["d3"]
    assert [c.dicom_id for c in neg["edema"]] == ["d2"]
    assert [c.dicom_id for c in neg["effusion"]] == ["d1"]
    assert neg["pneumonia"] == []  # a basic negative is not a candidate
    excl = negative_candidates(_dataset(), exclude_cxrs={"d1", "d2"})
    assert excl["effusion"] == [] and excl["edema"] == []
    assert len(negative_candidates(_dataset(), max_negatives=0)["cardiomegaly"]) == 0


def test_lung_lesion_free_films_name_no_lung_lesion() -> None:
    """d2's report names opacity: its 'There is no edema.' is no lesion-free edema film; its effusion one is."""
    clear = negative_candidates(_dataset(), clear_lungs=True)
    assert clear["edema"] == []  # d2 names opacity; d3 went to cardiomegaly
    assert [c.dicom_id for c in clear["effusion"]] == ["d1", "d2"]  # not a lung-opacity lesion; d2 is left to it
    assert [c.dicom_id for c in clear["cardiomegaly"]] == ["d3"]


def test_review_explicit_values_only(tmp_path: Path) -> None:
    f = tmp_path / "review.csv"
    f.write_text("key_id,decision,reviewer\nopacity_s1_positive_0,accept,A\nedema_s1_positive_2, Reject ,B\n"
                 "opacity_s2_positive_0,,C\n")
    review = read_review(f)
    assert review.accepted("opacity_s1_positive_0")
    assert not review.accepted("edema_s1_positive_2") and review.status("edema_s1_positive_2") == "reject"
    assert not review.accepted("opacity_s2_positive_0") and review.status("opacity_s2_positive_0") == "blank"
    assert not review.accepted("never_listed")
    f.write_text("key_id,decision,reviewer\nopacity_s1_positive_0,accept,A\nopacity_s2_positive_0,n,C\n")
    with pytest.raises(InputError, match="row 3"):
        read_review(f)
    f.write_text("id,ok\nx,accept\n")
    with pytest.raises(InputError, match="header"):
        read_review(f)


def test_review_of_one_key_as_a_pair_and_as_a_case_is_combined(tmp_path: Path) -> None:
    """review export writes one row per item: a key imported as an ILS pair and as a benchmark case has two rows
    of different kinds; the case is kept only when both keep it."""
    f = tmp_path / "review.csv"
    f.write_text("key_id,decision,reviewer,kind\n"
                 "a_s1_negative_0,accept,A,ils\na_s1_negative_0,accept,B;C,bench\n"
                 "b_s2_negative_0,accept,A,ils\nb_s2_negative_0,reject,B,bench\n"
                 "c_s3_positive_0,accept,A,bench\nc_s3_positive_0,,,ils\n")
    review = read_review(f)
    assert review.status("a_s1_negative_0") == "accept" and review.decisions["a_s1_negative_0"][1] == "A;B;C"
    assert review.status("b_s2_negative_0") == "reject"
    assert review.status("c_s3_positive_0") == "blank"  # the pair is not reviewed yet
    f.write_text("key_id,decision,reviewer,kind\nx_s1_positive_0,accept,A,bench\nx_s1_positive_0,accept,B,bench\n")
    with pytest.raises(InputError, match="reviewed twice"):
        read_review(f)
    f.write_text("key_id,decision,reviewer\nx_s1_positive_0,accept,A\nx_s1_positive_0,reject,B\n")
    with pytest.raises(InputError, match="reviewed twice"):
        read_review(f)


def test_rf_rr_split_first_round_n_ratio() -> None:
    assert split_rf_rr(list("abcde"), 0.5) == (["a", "b"], ["c", "d", "e"])  # round(2.5) = 2
    assert split_rf_rr(list("abc"), 0.5) == (["a", "b"], ["c"])
    assert split_rf_rr(list("abcd"), 0.0) == ([], list("abcd"))
    with pytest.raises(ValueError):
        split_rf_rr(["a"], 1.5)


def test_rf_ratio_per_lesion() -> None:
    """§11: one RF ratio per lesion; ``--rf-ratio`` takes R and LESION=R pairs."""
    assert parse_rf_ratio("0.5") == parse_rf_ratio(0.5) == (0.5, {})
    assert parse_rf_ratio("0.4, cardiomegaly=0.3,edema=1") == (0.4, {"cardiomegaly": 0.3, "edema": 1.0})
    assert parse_rf_ratio("cardiomegaly=0") == (0.5, {"cardiomegaly": 0.0})
    for bad, why in (("1.5", r"in \[0, 1\]"), ("0.5,cardiomegaly=-1", r"in \[0, 1\]"), ("half", r"in \[0, 1\]"),
                     ("0.5,heart=0.2", "unknown lesion 'heart'"), ("0.2,0.3", "one ratio"),
                     ("edema=0.1,edema=0.2", "edema given twice")):
        with pytest.raises(OptionValueError, match=why):
            parse_rf_ratio(bad)
    with pytest.raises(OptionValueError, match="--rf-ratio"):
        BuildRequest(ils_dir=Path("i"), images=Path("m"), out=Path("o"), rf_ratio="0.5,cardiomegaly=2")
    opts = BuildRequest(ils_dir=Path("i"), images=Path("m"), out=Path("o"), rf_ratio="0.5,cardiomegaly=0.3").options()
    assert (opts.rf_ratio_of("cardiomegaly"), opts.rf_ratio_of("edema")) == (0.3, 0.5)
    assert opts.rf_ratio_text() == "0.5 (cardiomegaly 0.3)"
    default = BuildRequest(ils_dir=Path("i"), images=Path("m"), out=Path("o")).options()
    assert default.rf_ratios == {} and default.rf_ratio_text() == "0.5"
    # the default build (one ratio, estimated hearts kept) has the hash builds had before either setting existed
    assert BuildOptions(ils="i", images="m").settings_hash() == "ee30ed5eb3a799af"
    assert BuildOptions(ils="i", images="m", drop_estimated_hearts=True).settings_hash() != "ee30ed5eb3a799af"
    assert default.settings_hash() == BuildOptions(ils="i", images="m").settings_hash()
    assert opts.settings_hash() != default.settings_hash()


def _cand(key: str, lesion: str, dicom: str, positive: bool = True) -> Candidate:
    return Candidate(key, lesion, key, "s", "train", dicom, f"{dicom}.png", positive, "global")


def test_balanced_sample_seeded_one_cxr_per_case() -> None:
    pools = {("opacity", RF): [_cand(f"o{i}", "opacity", f"d{i}") for i in range(6)],
             ("opacity", RR): [_cand(f"r{i}", "opacity", f"d{i}") for i in range(6)],
             ("edema", LF): [_cand(f"e{i}", "edema", f"d{i}", False) for i in range(3)]}
    req = {LF: 2, RF: 2, RR: 3}
    a = balanced_sample(pools, req, seed=1)
    assert a == balanced_sample(pools, req, seed=1)
    used = [c.dicom_id for cs in a.values() for c in cs]
    assert len(used) == len(set(used))
    # opacity comes before edema in LESIONS order: RF takes 2 of d0-d5, RR 3 more; edema LF (d0-d2) gets
    # at most the one CXR of d0-d5 left, and only when it is among d0-d2
    assert len(a[("opacity", RF)]) == 2 and len(a[("opacity", RR)]) == 3
    assert len(a[("edema", LF)]) <= 1
    others = [balanced_sample(pools, req, seed=s) for s in range(2, 8)]
    assert any(o != a for o in others)


# --- QA assembly -------------------------------------------------------------------------------------

def _unit() -> dict:
    return {
        "point_options": [[[10, 20], "red"], [[30, 40], "orange"], [[50, 60], "yellow"], [None, "None"]],
        "expansion_answer": [3, 1], "contraction_answer": [4],  # GT order (§4), not option order
        "expansion_colors": ["yellow", "red"], "contraction_colors": [],
        "mask_options": [{"type": "fake", "masks": ["a"]}, {"type": "true", "masks": ["optimal_component_0"]},
                         {"type": "fake", "masks": ["b"]}, {"type": "fake", "masks": ["default_keep"]}],
        "revision_answer": 2, "revision_before_masks": ["suboptimal_component_0_exp1"],
        "revision_after_masks": ["optimal_component_0"],
        "true_masks": {"suboptimal_component_0": ["optimal_component_0"]},
        "fake_masks": {"suboptimal_component_0": ["a", "b"]}, "true_combination": ["optimal_component_0"],
        "fake_combinations": [["a"], ["b"], ["default_keep"]],
    }


def _images() -> CaseImages:
    return CaseImages("cases/cx/stage1.png", "cases/cx/stage2.png", "cases/cx/stage3_points.png",
                      tuple(f"cases/cx/stage3_option_{k}.png" for k in range(1, 5)))


def test_rr_entry_questions_and_answers() -> None:
    entry = positive_case("edema", "s1_positive_0", "d1", "cx", RR, (30, 40), _unit(), {"x": 1}, _images())
    assert entry["detection_qa"]["question"] == format_question(detection_stem("edema"), YES_NO)
    assert entry["detection_qa"]["answer_index"] == 1 and entry["detection_qa"]["answer"] == "Yes"
    cq = entry["contour_qa"]
    assert cq["no_deformation"] is False and cq["initial_context"] == initial_context("edema")
    assert cq["contour_eval_qa"]["question"] == format_question(contour_eval_stem("edema"), YES_NO)
    assert cq["contour_eval_qa"]["answer_index"] == 1
    exp, con = cq["contour_revision_qa_expansion"], cq["contour_revision_qa_contraction"]
    opts = point_options(["red", "orange", "yellow"])
    assert exp["question"] == format_question(EXPANSION.format(lesion="edema"), opts)
    assert con["question"] == format_question(CONTRACTION.format(lesion="edema"), opts)
    assert exp["answer"] == "yellow point, red point" and exp["answer_index"] == [3, 1]  # kept in GT order
    assert con["answer"] == "None" and con["answer_index"] == [4]
    assert exp["answer_options"][-1] == {"point": None, "color": "None"}
    rev = cq["contour_revision_qa_revision_result"]
    assert rev["question"] == format_question(REVISION_RESULT, mask_options(4))
    assert rev["answer"] == "2nd mask" and rev["answer_options"][1]["type"] == "true"
    assert rev["answer_options"][3]["relative_path"] == "cases/cx/stage3_option_4.png"
    assert entry["attribute_extraction_qa"] == {"x": 1}
    assert (entry["qa_path"], entry["lesion"], entry["image_size"]) == (RR, "edema", [30, 40])


def test_rf_keeps_revision_qas_and_cardiomegaly_has_no_attributes() -> None:
    entry = positive_case("cardiomegaly", "s1_positive_0", "d1", "cx", RF, (30, 40), _unit(), None, _images())
    assert entry["contour_qa"]["no_deformation"] is True
    assert entry["contour_qa"]["contour_eval_qa"]["answer_index"] == 2
    assert entry["contour_qa"]["contour_revision_qa_revision_result"] is not None
    assert entry["attribute_extraction_qa"] is None
    parsed = parse_benchmark({"cardiomegaly_s1_positive_0": entry})
    assert parsed.cases["cardiomegaly_s1_positive_0"].path("cardiomegaly_s1_positive_0") == RF


def test_lf_entry_detection_and_ids_only() -> None:
    entry = lesion_free_case("opacity", "s3_negative_0", "d3", "cy", (5, 6), CaseImages("cases/cy/stage1.png"))
    assert set(entry) == {"detection_qa", "pair_id", "dicom_id", "case_id", "lesion", "qa_path", "image_size"}
    assert entry["detection_qa"]["answer"] == "No" and entry["detection_qa"]["answer_index"] == 2
    assert entry["detection_qa"]["question"] == format_question(detection_stem("opacity"), YES_NO)
    assert points_answer_text(["blue"]) == "blue point"


def test_neutral_case_folder() -> None:
    name = case_folder(0, "cardiomegaly_s58956720_positive_0")
    assert name.startswith("c") and len(name) == 13 and int(name[1:], 16) >= 0
    assert case_folder(1, "cardiomegaly_s58956720_positive_0") != name


def test_stable_json_sorts_keys_but_the_attribute_questions_keep_their_asking_order() -> None:
    attrs = {k: {"z": 1, "a": 0.12345678} for k in reversed(ATTRIBUTE_KEYS)}
    text = stable_json({"k": {"pair_id": "p", "attribute_extraction_qa": attrs, "detection_qa": {}}})
    data = json.loads(text)["k"]
    assert list(data) == ["attribute_extraction_qa", "detection_qa", "pair_id"]
    assert list(data["attribute_extraction_qa"]) == list(ATTRIBUTE_KEYS)  # §13.2: as they are asked
    assert list(data["attribute_extraction_qa"]["location"]) == ["a", "z"] and '"a": 0.123457' in text
    assert stable_json({"k": {"attribute_extraction_qa": dict(reversed(attrs.items()))}}) == \
        stable_json({"k": {"attribute_extraction_qa": attrs}})


# --- end to end on the synthetic cohort ----------------------------------------------------------------

@pytest.fixture(scope="session")
def synth_ils(tmp_path_factory) -> tuple[Path, Path]:
    return synthetic_ils(tmp_path_factory)


@pytest.fixture(scope="session")
def synth_bench(tmp_path_factory) -> tuple[Path, BuildOptions]:
    return synthetic_bench(tmp_path_factory)


def test_synthetic_build_is_valid_and_counts_follow_arithmetic(synth_bench) -> None:
    out, _ = synth_bench
    assert validate_benchmark(out) == []
    bench = load_benchmark(out)
    achieved: dict[str, dict[str, int]] = {}
    for key, case in bench.cases.items():
        achieved.setdefault(case.lesion_of(key), {}).setdefault(case.path(key), 0)
        achieved[case.lesion_of(key)][case.path(key)] += 1
        assert key == f"{case.lesion}_{case.pair_id}"
    for lesion, row in achieved.items():
        assert all(n <= 1 for n in row.values()), (lesion, row)
    table = count_arithmetic(achieved)
    card = (out / "card.md").read_text()
    assert f"items: **{table.items:,}**" in card and f"Cases: **{table.cxrs:,}**" in card
    assert "| CXRs (one per case) | 7 lesions × 3 cases | **21** |" in card
    assert "| all items | 6 × 16 + 8 | **104** |" in card
    assert "No expert review was applied" in card and "non-SAM fallback" in card
    assert len({c.dicom_id for c in bench.cases.values()}) == len(bench.cases)
    assert any(c.path(k) == RR for k, c in bench.cases.items())
    assert any(c.path(k) == LF for k, c in bench.cases.items())
    deformation = json.loads((out / "deformation_results.json").read_text())
    assert set(deformation) == {k for k, c in bench.cases.items() if c.path(k) != LF}


def test_path_rules_in_built_benchmark(synth_bench) -> None:
    out, _ = synth_bench
    bench = load_benchmark(out)
    for key, case in bench.cases.items():
        path = case.path(key)
        if path == LF:
            assert case.contour_qa is None and case.attribute_extraction_qa is None
            assert case.detection_qa.answer == "No"
            continue
        assert case.detection_qa.answer == "Yes"
        cq = case.contour_qa
        assert cq is not None and cq.no_deformation is (path == RF)
        assert cq.contour_revision_qa_expansion is not None and cq.contour_revision_qa_revision_result is not None
        assert (case.attribute_extraction_qa is None) is (case.lesion == "cardiomegaly")
        folder = out / cq.contour_eval_qa.relative_path
        assert folder.name == "stage2.png" and folder.parent.name == case.case_id
        for qa in (cq.contour_revision_qa_expansion, cq.contour_revision_qa_contraction):  # colours follow GT order
            colors = [qa.answer_options[i - 1].color for i in qa.answer_index]
            assert qa.answer == (", ".join(f"{c} point" for c in colors) if colors != ["None"] else "None")
        keys = [f"suboptimal_component_{i}" for i in range(len(cq.true_masks))]
        assert list(cq.true_masks) == list(cq.fake_masks) == keys
        assert cq.revision_after_masks == [names[0] for names in cq.true_masks.values()] == cq.true_combination
    raw = json.loads((out / "chexpercept.json").read_text())
    assert all(list(c["attribute_extraction_qa"]) == list(ATTRIBUTE_KEYS)
               for c in raw.values() if c.get("attribute_extraction_qa"))


def test_build_is_byte_identical_and_resumes(synth_bench, synth_ils, tmp_path) -> None:
    out, opts = synth_bench
    other = tmp_path / "again"
    summary = build_benchmark(opts, other, workers=1, progress=False, keep_work=True)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and ".work" not in p.parts)
    assert files == sorted(p.relative_to(other).as_posix() for p in other.rglob("*")
                           if p.is_file() and ".work" not in p.parts)
    for rel in files:
        assert (out / rel).read_bytes() == (other / rel).read_bytes(), rel
    again = build_benchmark(opts, other, workers=1, progress=False)
    assert again.planned == 0 and again.reused == summary.planned + summary.reused
    assert (out / "MANIFEST.sha256").read_bytes() == (other / "MANIFEST.sha256").read_bytes()
    assert not (other / ".work").exists()


def test_review_rejects_are_never_used(synth_bench, tmp_path) -> None:
    out, opts = synth_bench
    bench = load_benchmark(out)
    keys = sorted(bench.cases)[:4]
    review = tmp_path / "review.csv"
    review.write_text("key_id,decision,reviewer\n" + f"{keys[0]},reject,R1\n{keys[1]},,R2\n"
                      + "".join(f"{k},accept,R1\n" for k in keys[2:]))
    reviewed = build_benchmark(replace(opts, review=str(review)), tmp_path / "rev", progress=False)
    built = load_benchmark(tmp_path / "rev")
    assert set(built.cases) <= set(keys[2:]) and reviewed.cases == len(built.cases) >= 1
    card = (tmp_path / "rev" / "card.md").read_text()
    assert "Expert review applied" in card and "1 rejected, 1 blank rows" in card
    failures = (tmp_path / "rev" / "failures.jsonl").read_text()
    assert f'"key_id": "{keys[0]}"' in failures and "review reject" in failures and "review blank" in failures
    assert validate_benchmark(tmp_path / "rev") == []


def test_candidates_from_predictions_are_recorded(synth_ils, tmp_path) -> None:
    ils, images = synth_ils
    from cxrground.ils.predictions import prediction_line
    from cxrground.io.masks import read_mask_png

    data = json.loads((ils / "mimic_ils_instruction_answer.json").read_text())
    lines = []
    for study in data["train"].values():
        for p in study["instruction_answer_pairs"]["positive_pairs"]:
            if p["target"] == "opacity":
                mask = read_mask_png(ils / "lesion_mask" / p["seg_mask_path"])
                lines.append(json.dumps(prediction_line(p["pair_id"], "[SEG]", np.asarray(mask))))
    pred = tmp_path / "pred.jsonl"
    pred.write_text("\n".join(lines) + "\n")
    opts = BuildOptions(ils=str(ils), images=str(images), candidates=str(pred), per_lesion=(0, 1, 1), seed=1,
                        max_candidates=2)
    build_benchmark(opts, tmp_path / "b", progress=False)
    card = (tmp_path / "b" / "card.md").read_text()
    assert "ILS model predictions" in card
    failures = [json.loads(x) for x in (tmp_path / "b" / "failures.jsonl").read_text().splitlines()]
    assert any(f["reason"] == "no predicted mask for this pair" for f in failures)
    bench = load_benchmark(tmp_path / "b")
    assert {c.lesion for c in bench.cases.values()} <= {"opacity"}
    assert validate_benchmark(tmp_path / "b") == []


def test_sam_deformer_build_from_the_command_line(synth_ils, tmp_path) -> None:
    """``--deformer sam`` with a local (random, tiny) SAM folder: the build finishes, every positive whose
    deformation breaks the validity rule is dropped with its reason, and the card names the backend."""
    pytest.importorskip("transformers")
    from click.testing import CliRunner

    from cxrground.cli import main
    from percept_build_helpers import tiny_sam_folder

    ils, images = synth_ils
    sam = tiny_sam_folder(tmp_path / "sam")
    out = tmp_path / "b"
    res = CliRunner().invoke(main, ["percept", "build", "--ils", str(ils), "--images", str(images), "--out",
                                    str(out), "--per-lesion", "1,1,1", "--split", "train", "--deformer", "sam",
                                    "--sam-model", str(sam), "--max-candidates", "1", "--seed", "0",
                                    "--deformer-opt", "device=cpu"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / BUILD_SETTINGS_FILE).read_text())["settings"]["deformer_opt"] == {"device": "cpu"}
    for opt, said in (("nope=1", "does not accept option 'nope'"), ("model_path=x", "give the SAM folder as")):
        bad = CliRunner().invoke(main, ["percept", "build", "--ils", str(ils), "--images", str(images), "--out",
                                        str(tmp_path / "c"), "--deformer", "sam", "--sam-model", str(sam),
                                        "--deformer-opt", opt])
        assert bad.exit_code != 0 and said in bad.output and "Traceback" not in bad.output, bad.output
    card = (out / "card.md").read_text()
    assert "sam" in card.lower()
    failures = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines() if x.strip()]
    bench = load_benchmark(out)
    positives = [c for c in bench.cases.values() if c.qa_path != "lesion_free"]
    assert failures or positives  # every planned positive is either used or listed with a reason
    assert all(f.get("reason") for f in failures)
    assert validate_benchmark(out) == []


def test_anatomy_from_a_mask_folder(synth_ils, tmp_path) -> None:
    """``--anatomy DIR`` reads ``{study}_right_lung.png`` / ``_left_lung.png`` / ``_heart.png`` (here the cohort's
    exact masks) instead of the dataset's anatomy.jsonl; a study without masks there is dropped with a reason."""
    import shutil

    ils, images = synth_ils
    folder = tmp_path / "anatomy"
    folder.mkdir()
    studies = sorted(p.name for p in (images.parent / "masks").iterdir())
    for study in studies[1:]:  # the first study has no masks in the folder
        for name in ("right_lung", "left_lung", "heart"):
            shutil.copy(images.parent / "masks" / study / f"{name}.png", folder / f"{study}_{name}.png")
    opts = BuildOptions(ils=str(ils), images=str(images), anatomy=str(folder), per_lesion=(1, 1, 1),
                        splits=("train", "val", "test"), seed=0, max_candidates=2)
    build_benchmark(opts, tmp_path / "b", progress=False)
    assert validate_benchmark(tmp_path / "b") == []
    assert f"`{folder}` (given with --anatomy)" in (tmp_path / "b" / "card.md").read_text()
    bench = load_benchmark(tmp_path / "b")
    assert studies[0] not in {c.pair_id.split("_")[0] for c in bench.cases.values()
                              if c.qa_path != "lesion_free"}


def test_unreadable_lesion_free_image_is_recorded_and_the_build_goes_on(synth_bench, synth_ils, tmp_path) -> None:
    import shutil

    out, opts = synth_bench
    ils, images = synth_ils
    bench = load_benchmark(out)
    lf_key = sorted(k for k, c in bench.cases.items() if c.path(k) == PATH_LESION_FREE)[0]
    data = json.loads((ils / "mimic_ils_instruction_answer.json").read_text())
    rel = next(s["image_path"] for split in data.values() for s in split.values()
               if s["dicom_id"] == bench.cases[lf_key].dicom_id)
    copy = tmp_path / "files"
    shutil.copytree(images, copy)
    (copy / rel).write_bytes(b"not an image at all")
    summary = build_benchmark(replace(opts, images=str(copy)), tmp_path / "b", progress=False)
    built = load_benchmark(tmp_path / "b")
    assert set(built.cases) == set(bench.cases) - {lf_key} and summary.cases == len(built.cases)
    failures = [json.loads(x) for x in (tmp_path / "b" / "failures.jsonl").read_text().splitlines()]
    [failure] = [f for f in failures if f["key_id"] == lf_key]
    assert failure["path"] == str(copy / rel) and "not a recognised image format" in failure["reason"]
    assert validate_benchmark(tmp_path / "b") == []


def test_a_wrong_size_lesion_mask_is_an_error_naming_both_shapes(tmp_path) -> None:
    from types import SimpleNamespace

    from cxrground.io.masks import write_mask_png
    from cxrground.percept.plans import _read_candidate

    path = write_mask_png(tmp_path / "m.png", np.ones((40, 30), bool))
    with pytest.raises(InputError, match=r"m\.png.*40x30.*100x80"):
        _read_candidate(SimpleNamespace(mask_ref=str(path), cand=None), (100, 80))
    assert _read_candidate(SimpleNamespace(mask_ref=str(path), cand=None), (40, 30)).shape == (40, 30)


def test_a_wrong_images_root_or_an_empty_candidates_file_is_refused_before_anything_is_written(synth_ils,
                                                                                             tmp_path) -> None:
    ils, images = synth_ils
    out = tmp_path / "b"
    with pytest.raises(ConfigError, match=r"none of the first .* candidates' images is there"):
        build_benchmark(BuildOptions(ils=str(ils), images=str(images.parent)), out, progress=False)
    empty = tmp_path / "candidates.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"has a mask for none of the .* positive candidates"):
        build_benchmark(BuildOptions(ils=str(ils), images=str(images), candidates=str(empty)), out, progress=False)
    assert not out.exists()


def test_an_out_folder_that_is_the_dataset_inside_the_images_or_foreign_is_refused(synth_ils, tmp_path) -> None:
    """The dataset's own card.md and failures.jsonl are never replaced, case images never land among the films, and
    a folder holding other files is not written into."""
    ils, images = synth_ils
    card = (ils / "card.md").read_bytes()
    opts = BuildOptions(ils=str(ils), images=str(images), per_lesion=(1, 1, 1), max_candidates=1)
    with pytest.raises(ConfigError, match=r"is the ILS dataset's folder"):
        build_benchmark(opts, ils, progress=False)
    assert (ils / "card.md").read_bytes() == card
    with pytest.raises(ConfigError, match=r"lies inside the image folder"):
        build_benchmark(opts, images / "bench", progress=False)
    assert not (images / "bench").exists()
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "failures.jsonl").write_text("mine\n")
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match=r"is not empty and holds no CheXpercept build"):
            build_benchmark(opts, foreign, progress=False, overwrite=overwrite)
    assert (foreign / "failures.jsonl").read_text() == "mine\n"


def test_the_card_says_why_counts_fall_short(synth_bench) -> None:
    out, _ = synth_bench
    card = (out / "card.md").read_text()
    achieved = {(c.lesion_of(k), c.path(k)) for k, c in load_benchmark(out).cases.items()}
    short = [(lesion, p) for lesion in LESIONS for p in (LF, RF, RR) if (lesion, p) not in achieved]
    assert short, "the synthetic benchmark meets every request: the test needs a shortfall"
    assert "### Why some counts fall short" in card
    section = card.split("### Why some counts fall short", 1)[1].split("\n## ", 1)[0]
    assert len([line for line in section.splitlines() if line.startswith("- ")]) == len(short)
    assert all(" eligible candidate" in line for line in section.splitlines() if line.startswith("- "))


def test_eval_refuses_a_run_folder_or_cache_inside_the_benchmark(synth_bench, tmp_path) -> None:
    from cxrground.evaluation.percept.runner import EvalSettings, run_eval

    out, _ = synth_bench
    with pytest.raises(ConfigError, match="is inside the benchmark folder"):
        run_eval(EvalSettings(bench=out, model="oracle"), out / "runs" / "oracle", progress=False)
    with pytest.raises(ConfigError, match=r"--cache .* is inside the benchmark folder"):
        run_eval(EvalSettings(bench=out, model="oracle"), tmp_path / "run", cache=out / "c.sqlite", progress=False)
    assert validate_benchmark(out) == []
