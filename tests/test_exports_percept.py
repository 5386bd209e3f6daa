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
                assert row["location_answer_index"] == case.attribute_extraction_qa.location.answer_index
            else:
                assert row["location_question"] is None and row["location_answer_index"] == []
    header = (out / "README.md").read_text().split("---")[1]
    assert f"num_examples: {len(source)}" in header and "config_name: default" in header
