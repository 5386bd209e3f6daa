"""bench/segment.py: a --cache folder is tied to the weights that filled it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench_segment():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_segment", BENCH / "segment.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_cache_of_other_weights_is_refused(tmp_path: Path):
    claim = _bench_segment()._claim_cache
    v1, v2 = tmp_path / "v1.safetensors", tmp_path / "v2.safetensors"
    v1.write_bytes(b"weights one")
    v2.write_bytes(b"weights two")
    cache = tmp_path / "cache"
    cache.mkdir()
    claim(cache, v1)
    assert (cache / "weights.sha256").read_text().endswith("v1.safetensors  content_box=off  polarity=checked\n")
    np.savez_compressed(cache / "cohen_x.npz", R=np.zeros((2, 2), bool))
    claim(cache, v1)  # the same weights reuse their lungs
    with pytest.raises(SystemExit, match="other weights"):
        claim(cache, v2)
    with pytest.raises(SystemExit, match="other weights or borders"):  # lungs read inside the borders are others
        claim(cache, v1, content_box=True)
    (cache / "weights.sha256").unlink()
    with pytest.raises(SystemExit, match="without a weights record"):
        claim(cache, v1)
