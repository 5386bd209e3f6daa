"""Shared, memoised inputs of the CheXpercept builder tests: a 24-study synthetic cohort, its ILS dataset and a
small benchmark built from it (built once per test session, whichever test module asks first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cxrground.percept.build import BuildOptions, build_benchmark

_CACHE: dict[str, object] = {}


def synthetic_ils(tmp_path_factory) -> tuple[Path, Path]:
    """(ILS folder, images root) of a 24-study, 256-px-wide synthetic cohort."""
    if "ils" not in _CACHE:
        root = tmp_path_factory.mktemp("percept_synth")
        cli = [sys.executable, "-m", "cxrground"]
        subprocess.run([*cli, "synth", "--out", str(root / "cohort"), "--studies", "24", "--seed", "0", "--width",
                        "256", "--quiet"], check=True, capture_output=True)
        subprocess.run([*cli, "ils", "build", "--images", str(root / "cohort" / "files"), "--out",
                        str(root / "ils"), "--seed", "0", "--workers", "2"], check=True, capture_output=True)
        _CACHE["ils"] = (root / "ils", root / "cohort" / "files")
    return _CACHE["ils"]  # type: ignore[return-value]


def synthetic_bench(tmp_path_factory) -> tuple[Path, BuildOptions]:
    """(benchmark folder, options) of a (1, 1, 1) build over all splits (≤ 3 candidates per lesion)."""
    if "bench" not in _CACHE:
        ils, images = synthetic_ils(tmp_path_factory)
        out = tmp_path_factory.mktemp("bench") / "bench"
        opts = BuildOptions(ils=str(ils), images=str(images), per_lesion=(1, 1, 1), max_candidates=3,
                            splits=("train", "val", "test"), seed=3)
        build_benchmark(opts, out, workers=2, progress=False, keep_work=True)
        _CACHE["bench"] = (out, opts)
    return _CACHE["bench"]  # type: ignore[return-value]


def tiny_sam_folder(folder: Path) -> Path:
    """Save a random tiny transformers SAM (64-px input, 16-px low-res masks) with its processor in ``folder``."""
    from cxrground.percept.deform.sam import save_tiny_sam

    return save_tiny_sam(folder)
