"""``percept eval`` on broken or hostile benchmark files (issue 11 item 7): a clear error, exit != 0, nothing sent.

Each test edits one field of a valid mock benchmark; before the fix these runs exited 0 (or with a traceback),
and an image path outside the benchmark folder was read and sent to the server.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ConfigError, InputError
from cxrground.evaluation.percept.conversation import MAX_LISTED, plan_benchmark, safe_image_path
from cxrground.evaluation.percept.runner import EvalSettings, run_eval
from cxrground.percept.schema import load_benchmark
from cxrground.testing.mock_bench import make_benchmark
from cxrground.testing.mock_server import MockServer, hash_policy


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_benchmark(tmp_path_factory.mktemp("base"), {"LF": 1, "RF": 1, "RR": 1}, lesions=("edema",), seed=1)


def _variant(base: Path, dest: Path, edit: Callable[[dict[str, Any]], Any]) -> Path:
    """A copy of ``base`` in ``dest`` with ``edit`` applied to its JSON (``edit`` may return a new object)."""
    shutil.copytree(base, dest)
    data = json.loads((base / "chexpercept.json").read_text())
    new = edit(data)
    data = data if new is None else new
    (dest / "chexpercept.json").write_text(json.dumps(data))
    return dest


def _eval(bench: Path, out: Path, server: MockServer | None = None, *extra: str):
    args = ["percept", "eval", "--bench", str(bench), "--out", str(out), "--no-progress"]
    args += ["--model", "openai:mock-vlm", "--base-url", server.base_url] if server else ["--model", "first-option"]
    return CliRunner().invoke(main, [*args, *extra])


def _refused(res, *needles: str) -> None:
    """Exit 1 through a clean ClickException (no traceback) whose message holds every needle."""
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)  # a traceback would be the exception itself
    for needle in needles:
        assert needle in res.output, (needle, res.output)


def test_empty_benchmark_is_refused(base, tmp_path):
    bench = _variant(base, tmp_path / "bench", lambda d: {})
    res = _eval(bench, tmp_path / "run")
    _refused(res, "chexpercept.json", "no cases")
    assert not (tmp_path / "run").exists()


def test_selection_of_no_case_is_refused(base, tmp_path):
    for opt in ("--limit", "--per-path-limit"):
        res = _eval(base, tmp_path / "run", None, opt, "0")
        _refused(res, f"{opt} must be >= 1")
    assert not (tmp_path / "run").exists()


def _set_lesion(value: str | None) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d["edema_prf0"]["lesion"] = value

    return edit


def _rekey_without_lesion(d: dict[str, Any]) -> None:
    case = d.pop("edema_prf0")
    del case["lesion"]
    d["prf0"] = case


@pytest.mark.parametrize(("edit", "needles"), [
    (_set_lesion("tumour"), ("case edema_prf0", "unknown lesion 'tumour'")),
    (_set_lesion("Edema"), ("case edema_prf0", "unknown lesion 'Edema'")),
    (_rekey_without_lesion, ("case prf0", "no lesion", "'prf0'")),
], ids=["unknown", "wrong-case", "missing"])
def test_unknown_or_missing_lesion_is_refused(base, tmp_path, edit, needles):
    res = _eval(_variant(base, tmp_path / "bench", edit), tmp_path / "run")
    _refused(res, "1 of 3 cases cannot be evaluated", *needles)
    assert not (tmp_path / "run").exists()


def _drop(case: str, *keys: str) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        node = d[case]
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]

    return edit


def _set(case: str, value: Any, *keys: str) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        node = d[case]
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return edit


@pytest.mark.parametrize(("edit", "needles"), [
    (_drop("edema_prf0", "attribute_extraction_qa"), ("case edema_prf0", "without attribute_extraction_qa")),
    (_drop("edema_prf0", "contour_qa"), ("case edema_prf0", "without contour_qa")),
    (_drop("edema_prr0", "contour_qa", "contour_revision_qa_expansion"), ("case edema_prr0", "revision question")),
    (_drop("edema_prr0", "contour_qa", "contour_revision_qa_revision_result"), ("case edema_prr0", "revision")),
    (_set("edema_prf0", "lesion_free", "qa_path"), ("case edema_prf0", "contradicts the detection answer")),
    (_set("edema_plf0", 3, "detection_qa", "answer_index"), ("case edema_plf0", "detection", "outside 1..2")),
    (_set("edema_prf0", [], "attribute_extraction_qa", "location", "answer_index"), ("location", "[]")),
    (_set("edema_prf0", [], "contour_qa", "contour_eval_qa", "answer_options"), ("contour_eval", "0 answer option")),
    (_set("edema_prf0", "  ", "attribute_extraction_qa", "comparison", "question"), ("comparison: empty question",)),
    (_set("edema_prr0", "revision_free", "qa_path"),
     ("case edema_prr0", "qa_path revision_free disagrees with contour_qa.no_deformation=False")),
    (_set("edema_prr0", 2, "detection_qa", "answer_index"),
     ("case edema_prr0", "detection answer 'Yes' disagrees with its answer_index 2 ('No')",
      "revision-required detection answer must be 1 (Yes), not answer_index 2")),
], ids=["rf-no-stage4", "rf-no-contour", "rr-no-expansion", "rr-no-revision-result", "path-vs-detection",
        "gt-outside-options", "empty-multi-gt", "no-options", "empty-question", "path-vs-no-deformation",
        "positive-answered-no"])
def test_case_missing_its_questions_is_refused(base, tmp_path, edit, needles):
    res = _eval(_variant(base, tmp_path / "bench", edit), tmp_path / "run")
    _refused(res, "cannot be evaluated", *needles)
    assert not (tmp_path / "run").exists()


def test_many_bad_cases_are_listed_in_one_message(tmp_path):
    bench = make_benchmark(tmp_path / "bench", {"LF": 8}, lesions=("edema",))
    data = json.loads((bench / "chexpercept.json").read_text())
    for case in data.values():
        case["lesion"] = "unknown"
    (bench / "chexpercept.json").write_text(json.dumps(data))
    with pytest.raises(InputError) as info:
        plan_benchmark(load_benchmark(bench), bench / "chexpercept.json")
    message = str(info.value)
    assert message.startswith(str(bench / "chexpercept.json")) and "8 of 8 cases" in message
    assert message.count("unknown lesion") == MAX_LISTED and f"and {8 - MAX_LISTED} more" in message


# -- image paths ------------------------------------------------------------------------------------------------


@pytest.fixture
def secret(tmp_path) -> Path:
    """A real PNG outside the benchmark folder: what a hostile benchmark would make the harness upload."""
    from PIL import Image

    path = tmp_path / "private" / "secret.png"
    path.parent.mkdir()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(path)
    return path


def _point_contour_eval_at(rel: str) -> Callable[[dict[str, Any]], None]:
    return _set("edema_prf0", rel, "contour_qa", "contour_eval_qa", "relative_path")


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink", "symlinked-folder"])
def test_image_paths_outside_the_benchmark_are_refused_before_any_request(base, tmp_path, secret, kind):
    bench = tmp_path / "bench"
    if kind == "absolute":
        rel = str(secret)
        _variant(base, bench, _point_contour_eval_at(rel))
    elif kind == "dotdot":
        rel = "cases/../../private/secret.png"
        _variant(base, bench, _point_contour_eval_at(rel))
    elif kind == "symlink":
        rel = "cases/innocent.png"
        _variant(base, bench, _point_contour_eval_at(rel))
        (bench / rel).symlink_to(secret)
    else:
        rel = "linked/secret.png"
        _variant(base, bench, _point_contour_eval_at(rel))
        (bench / "linked").symlink_to(secret.parent, target_is_directory=True)
    with MockServer(hash_policy(0)) as server:
        res = _eval(bench, tmp_path / "run", server)
        assert server.requests == 0  # refused at plan time: not even Stage 1 of another case was sent
    _refused(res, "refusing the benchmark", "outside the benchmark folder", "case edema_prf0", repr(rel))
    assert not (tmp_path / "run").exists()


def test_symlinks_inside_the_benchmark_are_allowed(base, tmp_path):
    def edit(d: dict[str, Any]) -> None:
        d["edema_prf0"]["contour_qa"]["contour_eval_qa"]["relative_path"] = "alias/stage2.png"

    bench = _variant(base, tmp_path / "bench", edit)
    original = load_benchmark(base).cases["edema_prf0"].contour_qa.contour_eval_qa.relative_path
    (bench / "alias").mkdir()
    (bench / "alias" / "stage2.png").symlink_to(bench / original)
    with MockServer(hash_policy(0)) as server:
        res = _eval(bench, tmp_path / "run", server)
    assert res.exit_code == 0, res.output
    assert server.requests > 0


def test_safe_image_path_checks_again_when_read(base, tmp_path, secret):
    root = tmp_path / "bench"
    shutil.copytree(base, root)
    (root / "late.png").symlink_to(next(root.rglob("stage1.png")))
    assert safe_image_path(root, "late.png") == root / "late.png"
    (root / "late.png").unlink()
    (root / "late.png").symlink_to(secret)  # swapped after planning
    for rel, reason in (("late.png", "resolves outside"), (str(secret), "is absolute"), ("a/../../x.png", "'..'"),
                        ("", "empty"), ("C:\\x.png", "is absolute"), ("a\\..\\..\\x.png", "'..'")):
        with pytest.raises(InputError, match=re.escape(reason)) as info:
            safe_image_path(root, rel)
        assert str(root) in str(info.value) and repr(rel) in str(info.value)
    (root / "loop.png").symlink_to(root / "loop.png")
    with pytest.raises(InputError, match="cannot be resolved"):
        safe_image_path(root, "loop.png")


def test_run_eval_api_refuses_too(base, tmp_path):
    bench = _variant(base, tmp_path / "bench", _point_contour_eval_at("../x.png"))
    with pytest.raises(InputError, match=re.escape("'..' component")):
        run_eval(EvalSettings(bench, "first-option"), tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match="--limit must be >= 1"):
        run_eval(EvalSettings(base, "first-option", limit=-1), tmp_path / "run", progress=False)


def test_an_ils_dataset_given_as_the_benchmark_is_named_as_such(tmp_path):
    """`--bench mimic_ils_instruction_answer.json` (or its folder) is an ILS dataset: said so, with how to build a
    benchmark (it was "case train: detection_qa: Field required")."""
    ils = tmp_path / "ils"
    ils.mkdir()
    study = {"subject_id": "p1", "pairs": []}
    (ils / "mimic_ils_instruction_answer.json").write_text(json.dumps({"train": {"s1": study}, "val": {}, "test": {}}))
    for bench in (ils / "mimic_ils_instruction_answer.json", ils):
        res = _eval(bench, tmp_path / "run")
        _refused(res, f"{bench}: is an ILS dataset, not a CheXpercept benchmark", "cxrground percept build")
        assert "detection_qa" not in res.output
    assert not (tmp_path / "run").exists()
