"""bench/gpu_smoke.py runs its stages on the CPU (the script a GPU machine runs first must not rot)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_gpu_smoke_stages_run_on_the_cpu(capsys):
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("bench_gpu_smoke", BENCH / "gpu_smoke.py")
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    stages = "sam,lisa,baseline,lung-unet,lesion-unet,lisa-train"
    assert smoke.main(["--device", "cpu", "--dtype", "float32", "--size", "64", "--repeats", "1",
                       "--stages", stages, "--unet-batch", "2", "--train-steps", "1"]) == 0
    out = capsys.readouterr().out
    for stage in stages.split(","):
        assert re.search(rf"^{stage}\s+load\+first", out, re.M), out
    assert "skipped" not in out
    assert "trained 1 steps on cpu" in out and "canvases/s at batch 2" in out
