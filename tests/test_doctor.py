"""``cxrground doctor``: what it reports, the fix lines of missing pieces, and its exit code."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground import doctor
from cxrground.doctor import Probe, Report, format_report, probe_module, run_checks

GPU_TORCH = {"cuda": True, "cuda_version": "12.4", "devices": ["NVIDIA H200"], "bf16": True, "threads": 8}


def _probe(missing=(), broken=(), torch_extra=None):
    def probe(name: str) -> Probe:
        if name in missing:
            return Probe(False, error=f"ModuleNotFoundError: No module named '{name}'")
        if name in broken:
            return Probe(False, error="RuntimeError: operator torchvision::nms does not exist")
        return Probe(True, "1.0", extra=torch_extra or {} if name == "torch" else {})
    return probe


def _installed(missing=()):
    return lambda dist: None if dist in missing else "1.0"


def _run(tmp_path, *, missing=(), broken=(), env=None, torch_extra=None, pack=True, **kw) -> Report:
    def find_pack() -> Path:
        if not pack:
            raise FileNotFoundError("cxr-pack-v1 not found; set CXRGROUND_PACK to its folder")
        return tmp_path
    kw.setdefault("editable", False)
    return run_checks(env=env or {}, probe=_probe(missing, broken, torch_extra), installed=_installed(missing),
                      which=lambda name: None, find_pack=find_pack, home=tmp_path / "home", tmp=tmp_path, **kw)


def _by_name(report: Report) -> dict:
    return {c.name: c for c in report.checks}


def test_everything_present_is_ok_and_optional_misses_are_listed(tmp_path):
    report = _run(tmp_path, torch_extra=GPU_TORCH)
    checks = _by_name(report)
    assert report.ok
    assert checks["torch CUDA"].ok and "H200" in checks["torch CUDA"].detail and checks["torch bf16"].ok
    assert not checks["Chromium"].ok and checks["Chromium"].fix == "sudo apt-get install chromium"
    assert not checks["weights root"].ok and "CXRGROUND_WEIGHTS" in checks["weights root"].fix
    assert "Ray cluster" not in checks  # RAY_ADDRESS unset: nothing is tried


def test_missing_extras_give_their_install_lines_and_only_required_ones_fail(tmp_path):
    report = _run(tmp_path, missing=("transformers", "diffusers", "ray", "fastapi"))
    checks = _by_name(report)
    assert report.ok  # none of them is needed by the built-in chain
    assert checks["transformers"].fix == "pip install 'cxrground[vlm]'"
    assert checks["diffusers"].fix == "pip install 'cxrground[gen]'"
    assert checks["ray"].fix == "pip install 'cxrground[ray]'"
    assert "not installed" in checks["fastapi"].detail
    text = format_report(report)
    assert "fix: pip install 'cxrground[serve]'" in text and "The built-in chain can run" in text
    assert "pip install -e" not in text  # not an editable install: no line that works only in a source checkout


def test_an_editable_install_gets_the_source_checkout_lines(tmp_path):
    report = _run(tmp_path, missing=("transformers", "numpy", "diffusers"), editable=True)
    checks = _by_name(report)
    assert checks["transformers"].fix == "pip install -e '.[vlm]'"
    assert checks["numpy"].fix == "pip install -e ."
    assert checks["synthesizer radedit"].fix == "pip install -e '.[gen,vlm]'"


@pytest.mark.parametrize(("direct_url", "editable"), [
    ('{"url": "file:///src/cxrground", "dir_info": {"editable": true}}', True),
    ('{"url": "file:///tmp/cxrground-0.1.0-py3-none-any.whl", "archive_info": {}}', False),
    (None, False),  # installed from an index: no direct_url.json
    ("not json", False),
])
def test_an_editable_install_is_read_from_direct_url_json(monkeypatch, direct_url, editable):
    from importlib import metadata

    from cxrground import extras

    class Dist:
        def read_text(self, name):
            return direct_url if name == "direct_url.json" else None

    monkeypatch.setattr(metadata, "distribution", lambda name: Dist())
    assert extras.is_editable_install() is editable
    assert run_checks.__kwdefaults__["editable"] is None  # the command reads it from the installed distribution


def test_a_package_that_is_not_installed_is_not_editable(monkeypatch):
    from importlib import metadata

    from cxrground import extras

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    assert not extras.is_editable_install()


def test_missing_torch_fails_the_built_in_chain(tmp_path):
    report = _run(tmp_path, missing=("torch",))
    assert not report.ok
    assert _by_name(report)["torch"].fix == "pip install 'cxrground[models]'"
    assert "torch CUDA" not in _by_name(report)
    assert "cannot run; missing: torch" in format_report(report)


def test_installed_but_not_importable_says_why(tmp_path):
    check = _by_name(_run(tmp_path, broken=("torchvision",)))["torchvision"]
    assert not check.ok and "installed (1.0) but not importable" in check.detail
    assert "torchvision::nms" in check.detail and "matches your torch" in check.fix


def test_cpu_torch_and_gpu_without_bf16(tmp_path):
    cpu = _by_name(_run(tmp_path, torch_extra={"cuda": False, "cuda_version": None}))
    assert not cpu["torch CUDA"].ok and "CPU build" in cpu["torch CUDA"].detail and "torch bf16" not in cpu
    old = _by_name(_run(tmp_path, torch_extra={**GPU_TORCH, "bf16": False}))
    assert old["torch CUDA"].ok and not old["torch bf16"].ok and "float16" in old["torch bf16"].detail


def test_weights_folders_found_with_the_option_that_uses_them(tmp_path):
    root = tmp_path / "w"
    (root / "hybridgnet").mkdir(parents=True)
    (root / "hybridgnet" / "bestMSE.pt").write_bytes(b"x")
    (root / "yolo").mkdir()
    (root / "yolo" / "vindr.pt").write_bytes(b"x")
    (root / "radedit" / "unet").mkdir(parents=True)  # empty: not counted
    checks = _by_name(_run(tmp_path, env={"CXRGROUND_WEIGHTS": str(root)}))
    assert checks["weights root"].ok
    assert checks["HybridGNet (CheXmask)"].ok
    assert f"weights_path={root / 'hybridgnet' / 'bestMSE.pt'}" in checks["HybridGNet (CheXmask)"].detail
    assert checks["YOLO VinDr-CXR (*.pt)"].ok and not checks["RadEdit (UNet, VAE, text encoder)"].ok
    assert not checks["CXAS"].ok
    # --weights wins over the environment variable
    assert not _by_name(_run(tmp_path, env={"CXRGROUND_WEIGHTS": str(root)}, weights=tmp_path / "none"))[
        "weights root"].ok


def test_ray_cluster_is_only_reached_when_ray_address_is_set(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        ok = _by_name(_run(tmp_path, env={"RAY_ADDRESS": f"ray://127.0.0.1:{port}"}))["Ray cluster"]
        assert ok.ok and "reachable" in ok.detail
    finally:
        server.close()
    down = _by_name(_run(tmp_path, env={"RAY_ADDRESS": f"127.0.0.1:{port}"}))["Ray cluster"]
    assert not down.ok and "not reachable" in down.detail and down.fix
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")
    assert not _by_name(_run(tmp_path, env={"RAY_ADDRESS": "auto"}))["Ray cluster"].ok
    bad = _by_name(_run(tmp_path, env={"RAY_ADDRESS": "nonsense"}))["Ray cluster"]
    assert not bad.ok and "names no host:port" in bad.detail


def test_missing_pack_is_optional_with_its_variable(tmp_path):
    report = _run(tmp_path, pack=False)
    check = _by_name(report)["real-data pack"]
    assert report.ok and not check.ok and check.fix.startswith("export CXRGROUND_PACK=")


def test_probe_module_imports_in_a_child_process():
    assert probe_module("json").importable
    missing = probe_module("cxrground_no_such_module")
    assert not missing.importable and "ModuleNotFoundError" in missing.error


def test_cli_prints_and_exits_by_the_verdict(monkeypatch, tmp_path):
    from cxrground.cli import main

    monkeypatch.setattr(doctor, "probe_module", _probe(missing=("torch",)))
    real = doctor.run_checks
    monkeypatch.setattr("cxrground.cli.doctor_cmds.run_checks",
                        lambda weights=None: real(weights=weights, probe=_probe(missing=("torch",)),
                                                  installed=_installed(("torch",))))
    result = CliRunner().invoke(main, ["doctor", "--json", "--weights", str(tmp_path)])
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["ok"] is False and any(c["name"] == "torch" and not c["ok"] for c in data["checks"])
    monkeypatch.setattr("cxrground.cli.doctor_cmds.run_checks",
                        lambda weights=None: real(weights=weights, probe=_probe(), installed=_installed()))
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 0 and "The built-in chain can run" in result.output


@pytest.mark.skipif(sys.version_info < (3, 11), reason="cxrground needs Python 3.11")
def test_shipped_weights_are_found_in_this_checkout(tmp_path):
    checks = [c for c in _run(tmp_path).checks if c.name.startswith("shipped ")]
    assert len(checks) == len(doctor.shipped_weights()) >= 9 and all(c.ok and c.required for c in checks)
    names = {c.name.removeprefix("shipped ") for c in checks}
    assert {"pose_net_v1.safetensors", "lung_shape_v1.npz", "lung_unet_v1.safetensors"} <= names


def test_doctor_command_on_an_environment_without_the_extras(tmp_path):
    """The real command, its child-process probes included, with every optional library blocked from importing."""
    import os
    import subprocess

    blocked = sorted({spec.module for spec in doctor.EXTRAS})
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        "import sys\n"
        f"BLOCKED = {blocked!r}\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Block())\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{root / 'src'}", "CXRGROUND_WEIGHTS": "",
           "RAY_ADDRESS": ""}
    proc = subprocess.run([sys.executable, "-m", "cxrground", "doctor", "--json", "--weights", str(tmp_path / "w")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["numpy"]["ok"] and checks["Python"]["ok"]
    for name in ("torch", "transformers", "diffusers", "ray", "fastapi", "mkdocs"):
        assert not checks[name]["ok"] and "No module named" in checks[name]["detail"], checks[name]
        assert checks[name]["fix"].startswith("pip install")
    assert checks["torch"]["required"] and not checks["transformers"]["required"]


def test_backends_are_ready_only_when_all_their_libraries_import(tmp_path):
    checks = _by_name(_run(tmp_path, missing=("diffusers",), broken=("torchvision",)))
    assert checks["built-in chain"].ok and checks["model lisa"].ok
    radedit = checks["synthesizer radedit"]
    assert not radedit.ok and "needs diffusers" in radedit.detail and radedit.fix == "pip install 'cxrground[gen]'"
    yolo = checks["detector yolo"]
    assert not yolo.ok and "torchvision" in yolo.detail
    assert yolo.fix == "pip install torchvision  # the build that matches your torch (see the install guide)"
    both = _by_name(_run(tmp_path, missing=("diffusers", "transformers")))["synthesizer radedit"]
    assert both.fix == "pip install 'cxrground[gen,vlm]'"
