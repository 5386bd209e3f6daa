"""bench/lesion_unet_fit.py rebuilds the shipped lesion segmenter through the lungs it was fitted through (the
sidecar's ``segmenter``), not through whichever lung U-Net is the default now; ``--lungs`` names others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SIDECAR = ROOT / "src" / "cxrground" / "lesions" / "weights" / "lesion_unet_v1.json"


def _script():
    sys.path.insert(0, str(BENCH))
    try:
        import lesion_unet_fit
    finally:
        sys.path.remove(str(BENCH))
    return lesion_unet_fit


def test_default_lungs_are_those_of_the_shipped_weights():
    script = _script()
    shipped = json.loads(SIDECAR.read_text(encoding="utf-8"))["segmenter"]
    assert shipped == script.LUNGS
    weights = script.lung_weights(script.LUNGS)
    assert weights.name == f"{shipped}.safetensors" and weights.is_file()


def test_unknown_lungs_are_refused_before_the_fit(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(BENCH)]),
               CXRGROUND_PACK="/nonexistent-pack")
    done = subprocess.run([sys.executable, str(BENCH / "lesion_unet_fit.py"), "--out", str(tmp_path / "fit"),
                           "--lungs", "lung_unet_v0"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--lungs lung_unet_v0: no lung U-Net weights at" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())
