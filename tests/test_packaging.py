"""Packaging: the licence files and metadata, the shipped weights' attribution, and what the sdist and the wheel
hold (built from this checkout's tracked files with setuptools' own build hooks, offline, in a few seconds)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "cxrground"
WEIGHT_DIRS = (PACKAGE / "anatomy" / "segment" / "weights", PACKAGE / "lesions" / "weights")
ATTRIBUTION = PACKAGE / "ATTRIBUTION.md"
#: sha256 of the unmodified Apache License 2.0 text (https://www.apache.org/licenses/LICENSE-2.0.txt).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
#: What the sdist carries beside src/ and tests/ (make demo, make test, the docs site, the weights' recipes).
SDIST_EXTRAS = ("Makefile", "mkdocs.yml", "CHANGELOG.md", "LICENSE", "NOTICE", "README.md", "README-pypi.md",
                "docs/index.md", "bench/README.md")
LICENSE_FILES = ("LICENSE", "NOTICE", "src/cxrground/ATTRIBUTION.md")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_license_is_the_apache_2_text_and_the_metadata_says_so():
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    assert tuple(project["license-files"]) == LICENSE_FILES
    assert all((ROOT / f).is_file() for f in LICENSE_FILES)
    assert "ATTRIBUTION.md" in _pyproject()["tool"]["setuptools"]["package-data"]["cxrground"]


def test_test_servers_are_not_in_the_store_extra():
    extras = _pyproject()["project"]["optional-dependencies"]
    servers = ("moto", "gcp-storage-emulator")
    assert not any(dep.startswith(servers) for dep in extras["store"])
    assert all(any(dep.startswith(s) for dep in extras["dev"]) for s in servers)


def test_package_index_description_has_no_relative_links():
    readme = _pyproject()["project"]["readme"]
    text = (ROOT / readme).read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"""(?:src|href)=["']([^"']+)""", text)
    assert not [t for t in targets if "://" not in t], f"{readme} links to files of the checkout"


def _weight_files() -> list[Path]:
    return sorted(p for d in WEIGHT_DIRS for p in d.iterdir() if p.suffix in (".safetensors", ".npz", ".json"))


def test_every_weight_sidecar_names_its_licence_and_attribution():
    sidecars = [p for p in _weight_files() if p.suffix == ".json"]
    assert sidecars
    for path in sidecars:
        meta = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(meta.get("licence"), str) and meta["licence"], f"{path.name}: no licence"
        assert isinstance(meta.get("attribution"), str) and meta["attribution"], f"{path.name}: no attribution"
        if "authorized for everyone" in meta["licence"]:
            assert "not a formal licence" in meta["licence"], path.name
    for path in _weight_files():  # every weight file has a sidecar (a JSON model is its own)
        assert path.with_suffix(".json").is_file(), f"{path.name}: no JSON sidecar"
    # lung_shape_v1.npz's sidecar is read by no loader: it must not go stale when bench/lung_shape_fit.py rewrites it
    shape = WEIGHT_DIRS[0] / "lung_shape_v1.npz"
    recorded = json.loads(shape.with_suffix(".json").read_text(encoding="utf-8"))["sha256"]
    assert recorded == hashlib.sha256(shape.read_bytes()).hexdigest(), "lung_shape_v1.json: sha256 of another npz"


def test_attribution_lists_every_shipped_weight_file():
    text = ATTRIBUTION.read_text(encoding="utf-8")
    for path in _weight_files():
        if path.suffix == ".json" and any(path.with_suffix(s).is_file() for s in (".safetensors", ".npz")):
            continue  # a sidecar: listed with its weights
        rel = path.relative_to(PACKAGE).as_posix()
        assert f"`{rel}`" in text or f"`{rel} " in text, f"ATTRIBUTION.md does not list {rel}"
    assert "not a formal licence" in text  # the rad2share rows are flagged as what they are
    assert "https://nihcc.app.box.com/v/ChestXray-NIHCC" in text and "CVPR 2017" in text


def _tracked_copy(dest: Path) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the sdist is built from the tracked files")
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    for rel in proc.stdout.decode().split("\0"):
        if rel and (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


_BUILD = """
import sys
from setuptools import build_meta
out = sys.argv[1]
print("BUILT", build_meta.build_sdist(out), build_meta.build_wheel(out))
"""


def test_sdist_carries_the_makefile_and_the_wheel_only_the_package(tmp_path):
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("setuptools is not installed")
    if int(version.split(".")[0]) < 77:
        pytest.skip(f"setuptools {version}: the build needs 77 or later (build-system.requires)")
    src = _tracked_copy(tmp_path / "src")
    out = tmp_path / "dist"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", _BUILD, str(out)], cwd=src, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sdist_name, wheel_name = next(line for line in proc.stdout.splitlines() if line.startswith("BUILT")).split()[1:]
    with tarfile.open(out / sdist_name) as tar:
        top = sdist_name.removesuffix(".tar.gz")
        sdist = {n.removeprefix(f"{top}/") for n in tar.getnames()}
    assert set(SDIST_EXTRAS) <= sdist
    assert not any("__pycache__" in n or ".pytest_cache" in n for n in sdist)
    with zipfile.ZipFile(out / wheel_name) as whl:
        names = whl.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = whl.read(f"{info}/METADATA").decode()
    assert {n.split("/")[0] for n in names} == {"cxrground", info}
    for rel in LICENSE_FILES:
        assert f"{info}/licenses/{rel}" in names
    assert "cxrground/ATTRIBUTION.md" in names
    assert "License-Expression: Apache-2.0" in metadata
