"""CheXpercept exports to other tools: a Hugging Face dataset and an lmms-eval task."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from cxrground.cli import main
from cxrground.percept.export_hf import benchmark_json_from_rows, case_image_columns
from cxrground.percept.schema import load_benchmark
from cxrground.testing.mock_bench import make_benchmark

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    """A mock benchmark with every path (LF, RF, RR) for a lung lesion and cardiomegaly (no Stage 4)."""
    return make_benchmark(tmp_path_factory.mktemp("bench"), {"LF": 2, "RF": 2, "RR": 3}, seed=5, size=12)


def test_hf_export_round_trips_every_case_and_image(bench, tmp_path):
    out = tmp_path / "hf"
    r = CliRunner().invoke(main, ["percept", "export", str(bench), str(out), "--format", "hf", "--shard-rows", "5",
                                  "--arrow"])
    assert r.exit_code == 0, r.output
    source = json.loads((bench / "chexpercept.json").read_text())
    files = sorted(str(p) for p in (out / "data").glob("test-*.parquet"))
    assert len(files) == -(-len(source) // 5)
    loaded = datasets.load_dataset("parquet", data_files={"test": files}, cache_dir=str(tmp_path / "c"))["test"]
    from_disk = datasets.load_from_disk(str(out / "arrow"))["test"]
    b = load_benchmark(bench)
    for ds in (loaded, from_disk):
        assert benchmark_json_from_rows(ds) == source  # every case, question, option and answer
        for row in ds:
            case = b.cases[row["key_id"]]
            assert row["detection_answer"] == case.detection_qa.answer
            assert row["detection_answer_index"] == [case.detection_qa.answer_index]
            paths = case_image_columns(row["key_id"], case)
            for col in ("image", "contour_overlay", "points_overlay"):
                if paths[col] is None:
                    assert row[col] is None
                else:
                    assert np.array_equal(np.asarray(row[col]), np.asarray(Image.open(bench / paths[col])))
            assert len(row["revision_options"]) == len(paths["revision_options"])
            for got, rel in zip(row["revision_options"], paths["revision_options"], strict=True):
                assert np.array_equal(np.asarray(got), np.asarray(Image.open(bench / rel)))
            if case.attribute_extraction_qa is not None:
                attrs = case.attribute_extraction_qa
                assert row["location_answer_index"] == attrs.location.answer_index
                assert row["severity_overlap_ratio"] == attrs.severity.overlap_ratio
                assert row["comparison_left_size"] == attrs.comparison.left_size
            else:
                assert row["location_question"] is None and row["location_answer_index"] == []
    header = (out / "README.md").read_text().split("---")[1]
    assert f"num_examples: {len(source)}" in header and "config_name: default" in header


def _policy(turns: list[tuple[str, str, int]]) -> str:
    """A fake model whose answers are known: a fixed function of the whole conversation (role, text, images per
    message), so that two harnesses sending the same prompts get the same answers, and answers vary enough that
    every oracle fires and every parse label occurs."""
    import hashlib

    h = int(hashlib.sha256(json.dumps(turns).encode()).hexdigest(), 16)
    return ["Answer: 1", "Answer: 2", "Answer: 1,2", "Answer: 3", "Yes", "<think>hm</think>Answer: 4",
            "no idea"][h % 7]


def _openai_turns(messages) -> list[tuple[str, str, int]]:
    out = []
    for m in messages:
        if isinstance(m["content"], str):
            out.append((m["role"], m["content"], 0))
        else:
            texts = [p["text"] for p in m["content"] if p["type"] == "text"]
            out.append((m["role"], "".join(texts), sum(p["type"] != "text" for p in m["content"])))
    return out


class _FakeClient:
    """The fake model as a ``percept eval`` client."""

    kind, model, max_images = "fake", "fake", 100

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.decoding: dict = {}
        self.identity = {"kind": "fake"}

    def cache_context(self, question, case_id):
        return None

    async def complete(self, messages, question, case_id="", seed=None):
        from cxrground.llm import Completion

        turns = _openai_turns(messages)
        self.seen.append(json.dumps(turns))
        return Completion(_policy(turns), {}, None)

    async def aclose(self):
        return None


def _fake_lmms_model():
    from lmms_eval.api.model import lmms

    class FakeChat(lmms):
        """The fake model as an lmms-eval chat model (multi-round through the task's doc_to_messages)."""

        is_simple = False

        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def loglikelihood(self, requests):
            raise NotImplementedError

        def generate_until(self, requests):
            raise NotImplementedError

        def generate_until_multi_round(self, requests):
            out = []
            for req in requests:
                _, doc_to_messages, _, doc_id, task, split = req.arguments
                doc = self.task_dict[task][split][doc_id]
                rounds: list[str] = []
                messages = doc_to_messages(doc)
                for _ in range(20):  # bounded: a case has at most 9 turns
                    turns = [(m["role"], "".join(p["text"] for p in m["content"] if p["type"] == "text"),
                              sum(p["type"] == "image" for p in m["content"])) for m in messages]
                    self.seen.append(json.dumps(turns))
                    rounds.append(_policy(turns))
                    messages, done, _, _ = doc_to_messages(doc, round_idx=len(rounds), previous_output=list(rounds),
                                                           previous_round_info=None)
                    if done:
                        break
                out.append(rounds)
            return out

    return FakeChat()


def test_lmms_eval_task_scores_like_percept_eval(bench, tmp_path, monkeypatch):
    pytest.importorskip("lmms_eval")
    import importlib.util
    import math

    from lmms_eval import evaluator
    from lmms_eval.evaluator import simple_evaluate
    from lmms_eval.tasks import TaskManager

    from cxrground.evaluation.percept.lmms import metric_value
    from cxrground.evaluation.percept.runner import EvalSettings, run_eval
    from cxrground.evaluation.percept.scoring import score_run
    from cxrground.percept.lmms_task import METRICS

    if importlib.util.find_spec("filelock._api") is None:
        # lmms-eval 0.7.3 patches filelock 3.x's internals before loading datasets (to avoid nested-lock deadlocks
        # across ranks); filelock 4 has no filelock._api (the export extra pins filelock<4). One process needs
        # no patch.
        monkeypatch.setattr(evaluator._enable_reentrant_filelocks, "_patched", True, raising=False)

    out = tmp_path / "task"
    r = CliRunner().invoke(main, ["percept", "export", str(bench), str(out), "--format", "lmms-eval"])
    assert r.exit_code == 0, r.output
    assert {p.name for p in out.glob("*.yaml")} == {"chexpercept.yaml", "chexpercept_none.yaml",
                                                     "chexpercept_implicit.yaml", "chexpercept_explicit.yaml"}
    fake = _fake_lmms_model()
    settings = ("none", "implicit", "explicit")
    results = simple_evaluate(model=fake, tasks=[f"chexpercept_{s}" for s in settings],
                              task_manager=TaskManager(include_path=str(out)), bootstrap_iters=0,
                              log_samples=False)["results"]
    client = _FakeClient()
    fired = 0
    for setting in settings:
        run = tmp_path / f"run_{setting}"
        run_eval(EvalSettings(bench=bench, model="fake", oracle=setting), run, client=client, concurrency=1,
                 progress=False, cache=tmp_path / f"cache_{setting}.sqlite")
        score = score_run(run, n_boot=0)
        got = results[f"chexpercept_{setting}"]
        for metric in METRICS:
            want, have = metric_value(score, metric), got[f"{metric},none"]
            assert (math.isnan(want) and math.isnan(have)) or want == pytest.approx(have, abs=1e-12), (setting,
                                                                                                      metric)
        lines = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
        fired += sum(bool(q["oracle_prefix"] or q["history_text"]) for rec in lines for q in rec["questions"])
    assert sorted(fake.seen) == sorted(client.seen)  # the same prompts, turn by turn, under every setting
    assert fired > 0  # the oracles were exercised
    assert 0 < results["chexpercept_none"]["oracle_stage1,none"] < 1



@pytest.mark.parametrize("fmt", ["hf", "lmms-eval", "reference"])
def test_percept_export_refuses_a_non_empty_out_and_overwrite_replaces_an_earlier_export(fmt, bench, tmp_path):
    def export(*options: str):
        return CliRunner().invoke(main, ["percept", "export", str(bench), str(out), "--format", fmt, *options])

    out = tmp_path / "out"
    out.mkdir()
    (out / "unrelated.txt").write_text("mine")
    r = export()
    assert r.exit_code == 1 and "not empty" in r.output and str(out) in r.output
    r = export("--overwrite")
    assert r.exit_code == 1 and "unrelated.txt" in r.output and sorted(p.name for p in out.iterdir()) == [
        "unrelated.txt"]
    (out / "unrelated.txt").unlink()
    r = export("--arrow") if fmt == "hf" else export()
    assert r.exit_code == 0, r.output
    first = sorted(p.name for p in out.iterdir())
    (out / "data" if fmt != "reference" else out / "chexpercept" / "old").mkdir(exist_ok=True)
    stale = (out / "data" if fmt != "reference" else out / "chexpercept" / "old") / "stale"
    stale.touch()
    assert export().exit_code == 1 and stale.exists()
    r = export("--overwrite")
    assert r.exit_code == 0, r.output
    assert not stale.exists() and not (out / "arrow").exists()
    assert sorted(p.name for p in out.iterdir()) == [n for n in first if n != "arrow"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging folder left beside it
    if fmt == "lmms-eval":  # the task files name the shards where they are now, not where they were written
        yaml = next(out.glob("*_none.yaml")).read_text()
        assert f"{(out / 'data').resolve()}/test-" in yaml


def test_lmms_eval_task_names_its_shards_whatever_the_path_and_the_hint_runs_in_a_shell(bench, tmp_path):
    import shlex

    import yaml

    class TaskLoader(yaml.SafeLoader):
        """Reads a task YAML, its ``!function`` values as None."""

    TaskLoader.add_multi_constructor("!", lambda loader, suffix, node: None)
    out = tmp_path / "run #2" / "a: b" / "task"
    r = CliRunner().invoke(main, ["percept", "export", str(bench), str(out), "--format", "lmms-eval"])
    assert r.exit_code == 0, r.output
    assert f"lmms-eval --include_path {shlex.quote(str(out))} --tasks chexpercept" in r.output
    for oracle in ("none", "implicit", "explicit"):
        task = yaml.load((out / f"chexpercept_{oracle}.yaml").read_text(), TaskLoader)
        assert task["task"] == f"chexpercept_{oracle}" and task["lmms_eval_specific_kwargs"]["default"] == {
            "oracle": oracle}
        assert task["dataset_kwargs"]["data_files"] == {"test": f"{(out / 'data').resolve()}/test-*.parquet"}
    glob = tmp_path / "run [1]" / "task"
    r = CliRunner().invoke(main, ["percept", "export", str(bench), str(glob), "--format", "lmms-eval"])
    assert r.exit_code == 1 and "[ ]" in r.output and "glob" in r.output and not glob.exists()


def test_lmms_eval_export_refuses_a_task_name_lmms_eval_defines(bench, tmp_path):
    pytest.importorskip("lmms_eval")
    from cxrground.percept.lmms_task import builtin_task_names

    assert {"mmmu", "mmmu_val", "vstar_bench"} <= builtin_task_names()  # a group, a task, a task of a template
    for name in ("mmmu", "mmmu_val"):  # the group itself, or one of its tasks (mmmu_val_none would not clash)
        out = tmp_path / name
        r = CliRunner().invoke(main, ["percept", "export", str(bench), str(out), "--format", "lmms-eval",
                                      "--task-name", name])
        assert r.exit_code == 1 and f"already defines {name}" in r.output and "--task-name" in r.output, r.output
        assert not out.exists()
    r = CliRunner().invoke(main, ["percept", "export", str(bench), str(tmp_path / "own"), "--format", "lmms-eval",
                                  "--task-name", "chexpercept_local"])
    assert r.exit_code == 0, r.output


def _as_the_reference_pipeline_writes(bench: Path, out: Path) -> Path:
    """``bench`` in the layout the reference pipeline writes: no toolkit fields, no MANIFEST or card, option files
    ``option_{k}_mask_{answer|fake}.png``, and every revision option naming a file, the unrendered ones of RF
    cases included."""
    import shutil

    from cxrground.percept.export import export_benchmark

    export_benchmark(bench, out, validate=False)
    for name in ("MANIFEST.sha256", "card.md"):
        (out / name).unlink(missing_ok=True)
    data = json.loads((out / "chexpercept.json").read_text())
    for key, case in data.items():
        for field in ("case_id", "lesion", "qa_path", "image_size"):
            case.pop(field, None)
        contour = case.get("contour_qa")
        if contour is None:
            continue
        folder = out / "chexpercept" / key / "contour_qa" / "contour_revision_qa"
        if contour["no_deformation"]:
            shutil.rmtree(folder, ignore_errors=True)
        for k, option in enumerate(contour["contour_revision_qa_revision_result"]["answer_options"], start=1):
            name = f"option_{k}_mask_{'answer' if option['type'] == 'true' else 'fake'}.png"
            if not contour["no_deformation"]:
                (folder / option["relative_path"]).rename(folder / name)
            option["relative_path"] = name
    (out / "chexpercept.json").write_text(json.dumps(data, indent=2))
    return out


def test_hf_and_lmms_eval_export_a_benchmark_the_reference_pipeline_wrote(bench, tmp_path):
    ref = _as_the_reference_pipeline_writes(bench, tmp_path / "refmade")
    source = json.loads((ref / "chexpercept.json").read_text())
    assert any(c.get("contour_qa", {}).get("no_deformation") for c in source.values())  # RF options name no file
    for fmt in ("hf", "lmms-eval"):
        r = CliRunner().invoke(main, ["percept", "export", str(ref), str(tmp_path / fmt), "--format", fmt,
                                      "--no-validate"])
        assert r.exit_code == 0, r.output
    files = sorted(str(p) for p in (tmp_path / "hf" / "data").glob("test-*.parquet"))
    rows = datasets.load_dataset("parquet", data_files={"test": files}, cache_dir=str(tmp_path / "c"))["test"]
    assert benchmark_json_from_rows(rows) == source
    for row in rows:
        key, case = row["key_id"], source[row["key_id"]]
        with Image.open(ref / "chexpercept" / key / "detection_qa" / "xray.png") as im:
            assert row["image_size"] == [im.height, im.width]
        contour = case.get("contour_qa")
        if contour is not None and not contour["no_deformation"]:  # RR: every revision image, in option order
            folder = ref / "chexpercept" / key / "contour_qa" / "contour_revision_qa"
            options = contour["contour_revision_qa_revision_result"]["answer_options"]
            assert len(row["revision_options"]) == len(options) and row["points_overlay"] is not None
            for got, option in zip(row["revision_options"], options, strict=True):
                assert np.array_equal(np.asarray(got), np.asarray(Image.open(folder / option["relative_path"])))
        else:  # LF, RF: no revision question is asked, so no revision image
            assert row["revision_options"] == [] and row["points_overlay"] is None


def test_neutral_keys_export_of_a_benchmark_without_case_ids(bench, tmp_path):
    ref = _as_the_reference_pipeline_writes(bench, tmp_path / "refmade")
    out = tmp_path / "neutral"
    r = CliRunner().invoke(main, ["percept", "export", str(ref), str(out), "--neutral-keys", "--no-validate"])
    assert r.exit_code == 0, r.output
    source = json.loads((ref / "chexpercept.json").read_text())
    keys = json.loads((out / "chexpercept.json").read_text())
    assert len(keys) == len(source) and not set(keys) & set(source)
    for key in keys:
        lesion, neutral = key.split("_", 1)
        assert lesion in ("edema", "cardiomegaly") and len(neutral) == 13 and neutral.startswith("c")
    from cxrground.percept.validate import validate_benchmark

    assert validate_benchmark(out, records=False) == []  # no name reveals an answer (the source has no records)
