"""The bench fit scripts rebuild each shipped file through the lungs it was fitted through (the sidecar's
``meta.lungs`` or ``segmenter``), not through whichever lung U-Net is the package's default now; ``--lungs`` names
others, and a missing weights file is a usage error naming it (bench/fit_lungs.py)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
LESIONS = ROOT / "src" / "cxrground" / "lesions" / "weights"


def _bench(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


def _sidecar(name: str) -> dict:
    return json.loads((LESIONS / name).read_text(encoding="utf-8"))


def _default_lungs() -> dict[str, str]:
    """Each fit script (and reader) -> the name of its default --lungs."""
    v2 = _bench("zone_prior_v2_fit").LUNGS
    return {"lesion_unet_fit": _bench("lesion_unet_fit").LUNGS, "zone_prior_fit": _bench("zone_prior_fit").LUNGS,
            "zone_prior_v2_fit --reader zone_prior_v2": v2["zone_prior_v2"],
            "zone_prior_v2_fit --reader zone_prior_v3": v2["zone_prior_v3"],
            "zone_evidence_weight_fit (zone_prior_v3's table)": v2["zone_prior_v3"],
            "zone_sim": _bench("zone_sim").LUNGS}


#: fit script (reader) -> the shipped sidecar it rebuilds and the lungs identity it records there
RECORDED = {
    "lesion_unet_fit": lambda: {"name": _sidecar("lesion_unet_v1.json")["segmenter"]},
    "zone_prior_fit": lambda: _sidecar("zone_prior_v1.json")["meta"]["lungs"],
    "zone_prior_v2_fit --reader zone_prior_v2": lambda: _sidecar("zone_prior_v2_severity.json")["meta"]["lungs"],
    "zone_prior_v2_fit --reader zone_prior_v3": lambda: _sidecar("zone_prior_v3_severity.json")["meta"]["lungs"],
    "zone_evidence_weight_fit (zone_prior_v3's table)":
        lambda: _sidecar("zone_prior_v3_severity.json")["meta"]["lungs"],
    "zone_sim": lambda: {"name": _sidecar("zone_sim_v1.json")["segmenter"]},
}


@pytest.mark.parametrize("script", sorted(RECORDED))
def test_default_lungs_are_those_of_the_shipped_file(script):
    fit_lungs = _bench("fit_lungs")
    recorded = RECORDED[script]()
    default = _default_lungs()[script]
    weights = fit_lungs.lung_weights(default)
    assert weights.name == f"{recorded['name']}.safetensors" and weights.is_file()
    identity = json.loads(weights.with_suffix(".json").read_text(encoding="utf-8"))
    assert {k: identity[k] for k in recorded} == recorded  # name, and sha256 where the sidecar records it


def test_the_two_severity_files_were_fitted_through_different_lungs():
    """The default of zone_prior_v2_fit.py --lungs follows --reader (no single default rebuilds both)."""
    v2, v3 = (_sidecar(f"zone_prior_{r}_severity.json")["meta"]["lungs"] for r in ("v2", "v3"))
    assert v2["sha256"] != v3["sha256"]


def test_lungs_as_a_path_are_taken_as_given(tmp_path):
    fit_lungs = _bench("fit_lungs")
    assert fit_lungs.lung_weights(str(tmp_path / "mine.safetensors")) == tmp_path / "mine.safetensors"
    assert fit_lungs.lung_weights("lung_unet_v2").parent == fit_lungs.lung_weights("lung_unet_v1").parent


FITS = [("lesion_unet_fit.py", ["--out", "OUT"]), ("zone_prior_fit.py", ["--out", "OUT"]),
        ("zone_prior_v2_fit.py", ["--out", "OUT"]), ("zone_prior_v2_fit.py", ["--reader", "zone_prior_v3"]),
        ("zone_evidence_weight_fit.py", []), ("zone_sim.py", ["--cache", "OUT", "--save", "OUT"])]


@pytest.mark.parametrize(("script", "args"), FITS, ids=[f"{s} {' '.join(a)}" for s, a in FITS])
def test_unknown_lungs_are_refused_before_the_fit(tmp_path, script, args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(BENCH)]),
               CXRGROUND_PACK="/nonexistent-pack")
    out = tmp_path / "fit"
    done = subprocess.run([sys.executable, str(BENCH / script), *(str(out) if a == "OUT" else a for a in args),
                           "--lungs", "lung_unet_v0"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--lungs lung_unet_v0: no lung U-Net weights at" in done.stderr
    assert "lung_unet_v0.safetensors" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())


def test_a_table_read_through_other_lungs_is_refused(tmp_path):
    table = tmp_path / "rows.csv"
    table.write_text("image,patient,group,licence," + ",".join(f"sim_{z}" for z in "ABCDEF") + ","
                     + ",".join(f"share_{z}" for z in "ABCDEF") + ",lungs\n"
                     + "a.png,p,covid,CC BY 4.0," + ",".join(["0.5"] * 12) + ",0123abcd\n", encoding="utf-8")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(BENCH)]),
               CXRGROUND_PACK="/nonexistent-pack")
    done = subprocess.run([sys.executable, str(BENCH / "zone_prior_v2_fit.py"), "--from-table", str(table)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"--from-table {table}: read through other lungs (sha256 0123abcd) than --lungs lung_unet_v1" in done.stderr
    assert "Traceback" not in done.stderr
