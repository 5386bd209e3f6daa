"""The bench scripts that fit a file of the kind shipped under src/cxrground/**/weights write it only where --out
(--save) names it, and refuse to replace an existing file without --overwrite (bench/weights_out.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"

# script, arguments before the output flag, output flag, files the output path stands for (suffixes; "" = itself)
FITS = [
    ("lung_shape_fit.py", [], "--out", [""]),
    ("zone_prior_fit.py", [], "--out", [""]),
    ("zone_prior_v2_fit.py", [], "--out", [""]),
    ("lesion_unet_fit.py", [], "--out", [".safetensors"]),
    ("lung_depth_fit.py", ["--cache", "CACHE"], "--out", [""]),
    ("zone_sim.py", ["--cache", "CACHE"], "--save", [".npz"]),
]


def _run(script: str, args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(BENCH)]),
               CXRGROUND_PACK="/nonexistent-pack")
    return subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize(("script", "before", "flag", "suffixes"), FITS, ids=[f[0] for f in FITS])
def test_existing_output_is_refused_without_overwrite(tmp_path, script, before, flag, suffixes):
    stem = tmp_path / "fit"
    existing = [Path(f"{stem}{suffix}") for suffix in suffixes]
    for path in existing:
        path.write_bytes(b"shipped")
    args = [str(tmp_path / "cache") if a == "CACHE" else a for a in before]
    done = _run(script, [*args, flag, str(existing[0] if suffixes == [""] else stem)])
    assert done.returncode == 2, done.stderr
    assert "exists: pass --overwrite to replace it" in done.stderr
    assert "Traceback" not in done.stderr
    assert all(path.read_bytes() == b"shipped" for path in existing)


def test_no_bench_output_defaults_to_a_shipped_file():
    option = re.compile(r"add_argument\(\s*\"--(?:out|save)\"[^)]*\)", re.S)
    offenders = [f"{path.name}: {match.group(0)}" for path in sorted(BENCH.glob("**/*.py"))
                 for match in option.finditer(path.read_text(encoding="utf-8"))
                 if "shipped" in match.group(0) or "weights" in match.group(0)]
    assert not offenders
