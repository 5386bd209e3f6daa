"""``percept export --layout reference`` and reading a benchmark in the reference repository's layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ConfigError
from cxrground.evaluation.percept.conversation import plan_benchmark
from cxrground.percept.export import export_benchmark
from cxrground.percept.schema import load_benchmark, parse_benchmark
from cxrground.percept.validate import validate_benchmark
from percept_build_helpers import synthetic_bench


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Path:
    out, _ = synthetic_bench(tmp_path_factory)
    return out


@pytest.fixture(scope="module")
def exported(native, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "ref"
    res = CliRunner().invoke(main, ["percept", "export", "--layout", "reference", str(native), str(out)])
    assert res.exit_code == 0, res.output
    return out


def reference_reads(bench: Path, key: str, qa: dict) -> list[Path]:
    """The image files the reference evaluator opens for one case, by its documented reading rules: the CXR
    at ``chexpercept/<key>/detection_qa/xray.png``; Stage 2 at ``contour_qa/`` + ``contour_eval_qa.relative_path``;
    RR: ``contour_qa/contour_revision_qa/xray_with_mask_and_points.png`` and each option's ``relative_path`` there.
    """
    case_dir = bench / "chexpercept" / key
    files = [case_dir / "detection_qa" / "xray.png"]
    if qa["detection_qa"]["answer"] != "Yes":
        return files
    contour = qa["contour_qa"]
    files.append(case_dir / "contour_qa" / contour["contour_eval_qa"]["relative_path"])
    if not contour["no_deformation"]:
        revision = case_dir / "contour_qa" / "contour_revision_qa"
        files.append(revision / "xray_with_mask_and_points.png")
        options = contour["contour_revision_qa_revision_result"]["answer_options"]
        files += [revision / o["relative_path"] for o in options]
    return files


def test_export_has_the_reference_layout_and_the_same_images(native, exported):
    src = load_benchmark(native)
    data = json.loads((exported / "chexpercept.json").read_text())
    assert list(data) == list(src.cases)
    paths = set()
    for key, qa in data.items():
        assert "relative_path" not in qa["detection_qa"]
        reads = reference_reads(exported, key, qa)
        assert all(p.is_file() for p in reads), [p for p in reads if not p.is_file()]
        case = src.cases[key]
        assert reads[0].read_bytes() == src.image(case.detection_qa.relative_path).read_bytes()
        if case.contour_qa is not None:
            assert qa["contour_qa"]["contour_eval_qa"]["relative_path"] == "contour_eval_qa/xray_with_mask.png"
            assert reads[1].read_bytes() == src.image(case.contour_qa.contour_eval_qa.relative_path).read_bytes()
            options = qa["contour_qa"]["contour_revision_qa_revision_result"]["answer_options"]
            if case.contour_qa.no_deformation:  # RF: the revision is not asked, its options are not rendered
                assert [o["relative_path"] for o in options] == [None] * len(options)
            else:
                assert [o["relative_path"] for o in options] == [f"option_{k}.png" for k in range(1, len(options) + 1)]
            if case.attribute_extraction_qa is not None:
                assert list(qa["attribute_extraction_qa"]) == ["distribution", "location", "severity/measurement",
                                                               "comparison"]
        else:
            assert "contour_qa" not in qa and "attribute_extraction_qa" not in qa
        paths.update(p.relative_to(exported).as_posix() for p in reads)
    assert any("contour_revision_qa/option_" in p for p in paths)  # the sample has RR cases


def test_the_export_reads_back_like_the_original(native, exported):
    a, b = load_benchmark(native), load_benchmark(exported)
    plans_a, plans_b = plan_benchmark(a), plan_benchmark(b)
    assert [(p.case_id, p.path, [(q.qid, q.gt, q.options) for q in p.questions]) for p in plans_a] == \
        [(p.case_id, p.path, [(q.qid, q.gt, q.options) for q in p.questions]) for p in plans_b]
    for pa, pb in zip(plans_a, plans_b, strict=True):
        for qa, qb in zip(pa.questions, pb.questions, strict=True):
            assert [a.image(i).read_bytes() for i in qa.images] == [b.image(i).read_bytes() for i in qb.images]
    problems = validate_benchmark(exported)
    assert problems and all("leaking name" in p for p in problems), problems  # key_ids hold positive / negative


def test_neutral_keys_export_validates_cleanly(native, tmp_path):
    out = tmp_path / "neutral"
    summary = export_benchmark(native, out, neutral_keys=True)
    assert validate_benchmark(out) == []
    data = json.loads((out / "chexpercept.json").read_text())
    src = load_benchmark(native)
    assert summary.cases == len(data) == len(src.cases)
    for key, qa in data.items():
        lesion, case_id = key.split("_", 1)
        assert lesion == qa["lesion"] and case_id == qa["case_id"]
    with pytest.raises(ConfigError, match="not empty"):
        export_benchmark(native, out)
    export_benchmark(native, out, neutral_keys=True, overwrite=True)
    assert validate_benchmark(out) == []


def test_percept_eval_runs_on_the_reference_layout(native, exported, tmp_path):
    runner = CliRunner()
    scores = {}
    for name, bench in (("native", native), ("reference", exported)):
        run = tmp_path / name
        res = runner.invoke(main, ["percept", "eval", "--bench", str(bench), "--model", "oracle", "--out", str(run),
                                   "--oracle", "none", "--no-progress", "--concurrency", "2"])
        assert res.exit_code == 0, res.output
        res = runner.invoke(main, ["percept", "score", str(run), "--bootstrap", "20"])
        assert res.exit_code == 0, res.output
        scores[name] = json.loads((run / "score.json").read_text())
    ref = scores["reference"]
    assert ref["failed_cases"] == [] and ref["missing_cases"] == []
    assert ref["paths"] == scores["native"]["paths"]
    assert all(b["end_to_end"][f"stage{s}"]["acc"] in (1.0, None) for b in ref["paths"].values() for s in (1, 2, 3, 4))


def test_a_reference_case_is_resolved_under_its_key_folder():
    yes = {"question": "q", "answer_options": ["Yes", "No"], "answer": "Yes", "answer_index": 1}
    case = {"detection_qa": yes, "pair_id": "p", "dicom_id": "d",
            "contour_qa": {"no_deformation": False, "initial_context": "c",
                           "contour_eval_qa": {**yes, "relative_path": "contour_eval_qa/xray_with_mask.png"},
                           "contour_revision_qa_revision_result": {
                               "question": "q", "answer": "a", "answer_index": 1,
                               "answer_options": [{"type": "true", "masks": ["m"], "relative_path": "o1.png"}]},
                           "contour_revision_qa_expansion": {"question": "q", "answer": "a", "answer_index": [1],
                                                             "answer_options": [{"point": None, "color": "None"}]}}}
    c = parse_benchmark({"edema_s1_positive_0": case}).cases["edema_s1_positive_0"]
    base = "chexpercept/edema_s1_positive_0"
    assert c.detection_qa.relative_path == f"{base}/detection_qa/xray.png"
    assert c.contour_qa.contour_eval_qa.relative_path == f"{base}/contour_qa/contour_eval_qa/xray_with_mask.png"
    assert c.contour_qa.contour_revision_qa_expansion.relative_path == \
        f"{base}/contour_qa/contour_revision_qa/xray_with_mask_and_points.png"
    assert c.contour_qa.contour_revision_qa_revision_result.answer_options[0].relative_path == \
        f"{base}/contour_qa/contour_revision_qa/o1.png"
