"""``percept validate`` catches each kind of problem on deliberately broken copies of a valid benchmark."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image, PngImagePlugin

from cxrground.cli import main
from cxrground.percept.export import export_benchmark
from cxrground.percept.validate import require_valid, validate_benchmark
from cxrground.testing.mock_bench import make_benchmark
from percept_build_helpers import synthetic_bench


@pytest.fixture(scope="module")
def valid_bench(tmp_path_factory) -> Path:
    out, _ = synthetic_bench(tmp_path_factory)
    return out


@pytest.fixture()
def bench(valid_bench: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "bench"
    shutil.copytree(valid_bench, copy, ignore=shutil.ignore_patterns(".work"))
    return copy


def _data(b: Path) -> dict:
    return json.loads((b / "chexpercept.json").read_text())


def _save(b: Path, data: dict) -> None:
    (b / "chexpercept.json").write_text(json.dumps(data, sort_keys=True, indent=1))


def _first(data: dict, pred: Callable[[dict], bool]) -> dict:
    return next(c for _, c in sorted(data.items()) if pred(c))


def _rr(c: dict) -> bool:
    return c.get("qa_path") == "revision_required"


def _lung_positive(c: dict) -> bool:
    return c.get("attribute_extraction_qa") is not None


def test_valid_benchmark_passes_and_cli_exit_codes(bench: Path) -> None:
    assert validate_benchmark(bench) == []
    ok = subprocess.run([sys.executable, "-m", "cxrground", "percept", "validate", str(bench)],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "valid" in ok.stdout
    assert "built without expert review" in ok.stderr  # still valid: a warning, not a problem
    (bench / "card.md").write_text((bench / "card.md").read_text() + "\nedited\n")
    bad = subprocess.run([sys.executable, "-m", "cxrground", "percept", "validate", str(bench)],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "manifest hash mismatch for card.md" in bad.stdout


def test_missing_image(bench: Path) -> None:
    case = _first(_data(bench), _rr)
    rel = case["contour_qa"]["contour_eval_qa"]["relative_path"]
    (bench / rel).unlink()
    problems = validate_benchmark(bench)
    assert any(f"image {rel} does not exist" in p for p in problems)
    assert f"manifest lists {rel}, which does not exist" in problems


def test_wrong_size(bench: Path) -> None:
    rel = _first(_data(bench), _rr)["detection_qa"]["relative_path"]
    with Image.open(bench / rel) as im:
        im.resize((im.width // 2, im.height)).save(bench / rel)
    assert any(rel in p and "expected" in p and "x" in p for p in validate_benchmark(bench))


def test_answer_index_out_of_range(bench: Path) -> None:
    data = _data(bench)
    case = _first(data, _rr)
    case["contour_qa"]["contour_revision_qa_revision_result"]["answer_index"] = 7
    _save(bench, data)
    assert any("answer_index 7 outside" in p for p in validate_benchmark(bench))


def test_multi_select_duplicates_are_refused_any_order_is_not(bench: Path) -> None:
    """§4: the point answers list the GT points in GT order, so a multi-select answer may come in any order."""
    data = _data(bench)
    case = _first(data, _lung_positive)
    case["attribute_extraction_qa"]["location"]["answer_index"] = [1, 1]
    exp = case["contour_qa"]["contour_revision_qa_expansion"]
    n = len(exp["answer_options"])
    exp["answer_index"] = [n, 1]
    con = case["contour_qa"]["contour_revision_qa_contraction"]
    con["answer_index"] = [n + 1, 1]
    _save(bench, data)
    problems = validate_benchmark(bench, records=False)
    where = case["pair_id"]
    assert any("duplicate indices in multi-select answer [1, 1]" in p for p in problems)
    assert any("contour_revision_qa_contraction: answer indices" in p and f"[{n + 1}]" in p for p in problems)
    assert not any("contour_revision_qa_expansion" in p for p in problems), (where, problems)


def test_leaking_name(bench: Path) -> None:
    rel = _first(_data(bench), _rr)["contour_qa"]["contour_revision_qa_revision_result"]["answer_options"][0][
        "relative_path"]
    shutil.copy(bench / rel, (bench / rel).with_name("option_1_mask_answer.png"))
    problems = validate_benchmark(bench)
    assert any("leaking name" in p and "mask_answer" in p for p in problems)


def test_png_text_chunk(bench: Path) -> None:
    rel = _first(_data(bench), _rr)["contour_qa"]["contour_eval_qa"]["relative_path"]
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "needs revision")
    with Image.open(bench / rel) as im:
        im.load()
        im.save(bench / rel, pnginfo=info)
    assert any("PNG text chunks" in p for p in validate_benchmark(bench))


def test_count_mismatch_with_card(bench: Path) -> None:
    data = _data(bench)
    key = sorted(data)[0]
    lesion = data[key]["lesion"]
    del data[key]
    _save(bench, data)
    problems = validate_benchmark(bench)
    assert any(p.startswith("count mismatch") and lesion in p for p in problems)


def test_manifest_mismatch(bench: Path) -> None:
    (bench / "failures.jsonl").write_text("{}\n")
    (bench / "extra.txt").write_text("x")
    problems = validate_benchmark(bench)
    assert "manifest hash mismatch for failures.jsonl" in problems
    assert "manifest does not list extra.txt" in problems


def test_schema_and_path_rules(bench: Path) -> None:
    data = _data(bench)
    lf = _first(data, lambda c: c.get("qa_path") == "lesion_free")
    lf["detection_qa"]["answer_index"] = 1
    _save(bench, data)
    assert any("lesion-free detection answer must be 2" in p for p in validate_benchmark(bench))
    data[sorted(data)[0]].pop("detection_qa")
    _save(bench, data)
    problems = validate_benchmark(bench)
    assert len(problems) == 1 and "detection_qa" in problems[0]


def test_ground_truth_that_disagrees_with_the_path(bench: Path) -> None:
    """A positive case whose detection answer_index is 2 (No), or whose answer text is not the option its index
    names, and a qa_path that contradicts no_deformation are problems."""
    data = _data(bench)
    rr = _first(data, _rr)
    rr["detection_qa"]["answer_index"] = 2
    _save(bench, data)
    problems = validate_benchmark(bench)
    assert any("detection answer 'Yes' disagrees with its answer_index 2 ('No')" in p for p in problems), problems
    assert any("revision-required detection answer must be 1 (Yes), not answer_index 2" in p for p in problems)
    rr["detection_qa"]["answer_index"] = 1
    rr["qa_path"] = "revision_free"
    _save(bench, data)
    assert any("qa_path revision_free disagrees with contour_qa.no_deformation=False" in p
               for p in validate_benchmark(bench))


def test_gallery_page_in_the_folder_keeps_it_valid(bench: Path) -> None:
    """``make demo`` writes gallery.html into the benchmark after the build; validate still accepts it."""
    from cxrground.percept.gallery import render_gallery

    render_gallery(bench, bench / "gallery.html")
    assert validate_benchmark(bench) == []
    manifest = (bench / "MANIFEST.sha256").read_text()
    (bench / "MANIFEST.sha256").write_text(manifest + "0" * 64 + "  gallery.html\n")  # an older manifest
    assert validate_benchmark(bench) == []


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink"])
def test_image_path_outside_the_benchmark_is_a_problem(bench: Path, tmp_path: Path, kind: str) -> None:
    data = _data(bench)
    case = _first(data, _rr)
    inside = bench / case["detection_qa"]["relative_path"]
    outside = tmp_path / "secret.png"
    shutil.copy(inside, outside)
    if kind == "absolute":
        rel = str(outside)
    elif kind == "dotdot":
        rel = "../secret.png"
    else:
        (bench / "cases" / "link.png").symlink_to(outside)
        rel = "cases/link.png"
    case["detection_qa"]["relative_path"] = rel
    _save(bench, data)
    problems = validate_benchmark(bench)
    assert any(repr(rel) in p and ("absolute" in p or "'..'" in p or "outside" in p) for p in problems), problems


def test_stage3_images_exist_for_rr_cases_only(bench: Path) -> None:
    """§10.2: an RF case's revision is not asked; rendering its options would show its Stage-2 image again."""
    data = _data(bench)
    paths = {c.get("qa_path") for c in data.values()}
    assert {"revision_free", "revision_required"} <= paths
    for case in data.values():
        cq = case.get("contour_qa")
        if cq is None:
            continue
        folder = bench / "cases" / case["case_id"]
        rr = case["qa_path"] == "revision_required"
        options = cq["contour_revision_qa_revision_result"]["answer_options"]
        assert sorted(p.name.startswith("stage3") for p in folder.iterdir()).count(True) == \
            (1 + len(options) if rr else 0)
        assert all((o["relative_path"] is not None) == rr for o in options)
        stage2 = (folder / "stage2.png").read_bytes()
        assert all((bench / o["relative_path"]).read_bytes() != stage2 for o in options if rr)
    rr_case = _first(data, _rr)
    rr_case["contour_qa"]["contour_revision_qa_revision_result"]["answer_options"][0]["relative_path"] = None
    _save(bench, data)
    assert any("an RR revision option must name its image" in p for p in validate_benchmark(bench))


# --- a benchmark in the reference layout, without the build records -----------------------------------------------

@pytest.fixture()
def reference_style(tmp_path: Path) -> Path:
    """A small benchmark written the way the reference generator and exporter write one: no ``MANIFEST.sha256`` or
    ``card.md``, no toolkit fields, a point answer in GT order (not sorted), and RF revision options that name the
    reference's option images, which its exporter does not write for an RF case."""
    mock = make_benchmark(tmp_path / "mock", {"LF": 1, "RF": 1, "RR": 1}, lesions=("edema", "cardiomegaly"))
    out = tmp_path / "reference"
    export_benchmark(mock, out)
    (out / "MANIFEST.sha256").unlink()
    data = _data(out)
    for key, case in data.items():
        for name in ("case_id", "lesion", "qa_path", "image_size"):
            case.pop(name, None)
        cq = case.get("contour_qa")
        if cq is None or not cq["no_deformation"]:
            continue
        shutil.rmtree(out / "chexpercept" / key / "contour_qa" / "contour_revision_qa")
        for k, option in enumerate(cq["contour_revision_qa_revision_result"]["answer_options"], start=1):
            option["relative_path"] = f"option_{k}_mask_{'answer' if option['type'] == 'true' else 'fake'}.png"
    for key in ("edema_prr0", "cardiomegaly_prr0"):
        exp = data[key]["contour_qa"]["contour_revision_qa_expansion"]
        exp["answer_index"] = list(range(len(exp["answer_options"]) - 1, 0, -1))  # every point, last one first
    assert any(len(data[k]["contour_qa"]["contour_revision_qa_expansion"]["answer_index"]) > 1
               for k in ("edema_prr0", "cardiomegaly_prr0"))
    _save(out, data)
    return out


def test_reference_style_folder_is_valid_with_one_note(reference_style: Path) -> None:
    notes: list[str] = []
    assert validate_benchmark(reference_style, note=notes.append) == []
    assert len(notes) == 1 and "no MANIFEST.sha256" in notes[0] and "without the build records" in notes[0]
    assert require_valid(reference_style) == notes
    res = CliRunner().invoke(main, ["percept", "validate", str(reference_style)])
    assert res.exit_code == 0, res.output
    assert f"{reference_style}: valid" in res.stdout and notes[0] in res.stderr


def test_reference_style_folder_problems_are_still_found(reference_style: Path) -> None:
    """Without the build records the checks of the questions and of every image a model is shown still run; an RF
    case's revision image is checked where the folder holds one."""
    data = _data(reference_style)
    rr = data["edema_prr0"]["contour_qa"]
    rr["contour_revision_qa_contraction"]["answer_index"] = [1, 1]
    _save(reference_style, data)
    asked = reference_style / "chexpercept" / "edema_prr0" / "contour_qa" / "contour_revision_qa" / "option_1.png"
    asked.unlink()
    rf = data["edema_prf0"]["contour_qa"]["contour_revision_qa_revision_result"]["answer_options"][0]
    held = reference_style / "chexpercept" / "edema_prf0" / "contour_qa" / "contour_revision_qa" / rf["relative_path"]
    held.parent.mkdir(parents=True)
    held.write_bytes(b"not a png")
    problems = validate_benchmark(reference_style)
    assert any("duplicate indices in multi-select answer [1, 1]" in p for p in problems)
    assert any("option_1.png does not exist" in p for p in problems)
    assert any(rf["relative_path"] in p and "cannot be read as PNG" in p for p in problems)
    assert any("leaking name" in p for p in problems)  # the reference's own option names reveal the answer
    assert not any("MANIFEST" in p or "card.md" in p or "image_size" in p for p in problems)
