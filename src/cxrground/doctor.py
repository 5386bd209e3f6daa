"""What this machine has and what it misses, for ``cxrground doctor``.

:func:`run_checks` returns one :class:`Check` per piece: Python, the core dependencies, torch with CUDA and bf16,
every optional extra's libraries (installed = a distribution is present, importable = ``import`` succeeds, its
version), the shipped weights, weights folders under a weights root (with the option that points a backend at each),
Chromium, a Ray cluster (only when ``RAY_ADDRESS`` is set; it is reached over TCP, never started) and the real-data
pack. A missing piece carries the one line that installs or configures it. :attr:`Report.ok` is true when every
piece the built-in chain (``make demo``) needs is there.

Imports are tried in a child process each (:func:`probe_module`), so a library that crashes or half-imports (a
torchvision built for another torch) cannot disturb the others; tests pass their own ``probe``.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Final

import cxrground
from cxrground.extras import CORE, EXTRAS, ModuleSpec, install_line, is_editable_install
from cxrground.plugins import ENTRY_POINT_GROUP, PLUGINS_ENV, Plugins

__all__ = ["EXTRAS", "WEIGHTS_ENV", "Check", "ModuleSpec", "Probe", "Report", "format_report", "plugin_checks",
           "probe_module", "run_checks"]

#: Environment variable naming the folder where ``cxrground doctor`` looks for model weights.
WEIGHTS_ENV: Final[str] = "CXRGROUND_WEIGHTS"


#: Backends and what they import: (backend, how it is chosen, the import names it needs).
BACKENDS: Final[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
    ("built-in chain", "make demo (U-Net, normative model, anomaly boxes, baseline)", ("torch", "safetensors")),
    ("segmenter cxas / hybridgnet", "ils build --segmenter cxas|hybridgnet", ("torch",)),
    ("synthesizer radedit", "ils build --synthesizer radedit", ("diffusers", "transformers", "torch")),
    ("detector yolo", "ils build --detector yolo", ("ultralytics", "torchvision", "torch")),
    ("deformer sam", "percept build --deformer sam", ("transformers", "torch")),
    ("model lisa", "ils train|predict --model lisa", ("transformers", "peft", "accelerate", "sentencepiece", "torch")),
    ("LISA 8/4-bit", "ils predict --quantize 8bit|4bit (CUDA)", ("bitsandbytes", "transformers")),
    ("DeepSpeed ZeRO-2", "ils train --set distributed=deepspeed", ("deepspeed", "torch")),
    ("VLM client hf:", "percept eval --model hf:DIR", ("transformers", "torch")),
    ("VLM client openai:", "percept eval --model openai:NAME", ("httpx",)),
    ("engine ray", "ils build --engine ray", ("ray",)),
    ("object storage", "s3:// and gs:// paths", ("fsspec", "s3fs", "gcsfs")),
    ("exports", "ils export --format hf|dicom-seg, percept export --format hf|lmms-eval",
     ("datasets", "highdicom", "lmms_eval")),
    ("HTTP servers", "cxrground serve, cxrground review serve", ("fastapi", "uvicorn", "python_multipart")),
)

#: Libraries the built-in chain (``make demo``) cannot run without, besides :data:`CORE`.
REQUIRED_EXTRAS: Final[frozenset[str]] = frozenset({"torch", "safetensors"})

#: Weights a backend reads from a local path: (path under the weights root, what it is, the option that uses it).
WEIGHTS_LAYOUT: Final[tuple[tuple[str, str, str], ...]] = (
    ("hybridgnet/bestMSE.pt", "HybridGNet (CheXmask)", "--segmenter hybridgnet --segmenter-opt weights_path={path}"),
    ("cxas/UNet_ResNet50_default.pth", "CXAS", "--segmenter cxas --segmenter-opt weights_dir={parent}"),
    ("radedit/unet", "RadEdit (UNet, VAE, text encoder)",
     "--synthesizer radedit --synthesizer-opt model_dir={parent}"),
    ("yolo", "YOLO VinDr-CXR (*.pt)", "--detector yolo --detector-opt weights_path={path}/<file>.pt"),
    ("sam/config.json", "SAM (transformers SamModel)", "percept build --deformer sam --sam-model {parent}"),
    ("lisa", "LISA / ROSALIA checkpoints", "ils predict --checkpoint {path}/<name> (after ils convert-lisa)"),
)

def shipped_weights() -> tuple[Path, ...]:
    """The weights shipped inside the package, where the code that reads them looks for them: the lung U-Net, the
    pose reader, the mean lung shape of the lung check, the normative model, the zone reader, the lesion segmenter,
    the zone position prior and the film severity models of ``zone_prior_v2`` and ``zone_prior_v3``, then any other
    weight file of the package's ``weights`` folders (e.g. the earlier lung U-Net); their data and licences: the
    package's ``ATTRIBUTION.md``."""
    from cxrground.anatomy.segment.builtin import default_weights_path
    from cxrground.anatomy.segment.plausibility import shipped_shape_path
    from cxrground.anatomy.segment.pose_net import shipped_pose_path
    from cxrground.lesions.normative import default_normative_path
    from cxrground.lesions.segmenter import shipped_lesion_unet_path
    from cxrground.lesions.zone_classifier import shipped_zone_reader_path
    from cxrground.lesions.zone_prior import shipped_prior_path
    from cxrground.lesions.zone_severity import SEVERITY_V3_MODEL, shipped_severity_path

    named = (default_weights_path(), shipped_pose_path(), shipped_shape_path(), default_normative_path(),
             shipped_zone_reader_path(), shipped_lesion_unet_path(), shipped_prior_path(), shipped_severity_path(),
             shipped_severity_path(SEVERITY_V3_MODEL))
    package = Path(__file__).parent
    others = sorted({p for ext in ("safetensors", "npz") for p in package.glob(f"**/weights/*.{ext}")} - set(named))
    return (*named, *others)


_STATUS_OK: Final[str] = "ok"


@dataclass(frozen=True)
class Check:
    """One piece: ``ok``; ``detail`` (a version, a path, what was found); ``fix``, the one line that adds a missing
    piece; ``required``: the built-in chain needs it."""

    group: str
    name: str
    ok: bool
    detail: str = ""
    fix: str | None = None
    required: bool = False


@dataclass
class Report:
    """Every check, in order; :attr:`ok` when every required one passed."""

    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks if c.required)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``cxrground doctor --json``)."""
        return {"ok": self.ok, "checks": [asdict(c) for c in self.checks]}


@dataclass(frozen=True)
class Probe:
    """What trying to import a module gave: ``importable``, the version it reports, the error otherwise, and for
    torch the CUDA facts."""

    importable: bool
    version: str | None = None
    error: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


_PROBE_CODE = r"""
import json, sys
name = sys.argv[1]
out = {"importable": False}
try:
    mod = __import__(name)
    out["importable"] = True
    out["version"] = str(getattr(mod, "__version__", "") or "") or None
    if name == "torch":
        cuda = bool(mod.cuda.is_available())
        n = mod.cuda.device_count() if cuda else 0
        out["extra"] = {"cuda": cuda, "cuda_version": mod.version.cuda,
                        "devices": [mod.cuda.get_device_name(i) for i in range(n)],
                        "bf16": bool(mod.cuda.is_bf16_supported()) if cuda else False,
                        "threads": mod.get_num_threads()}
except BaseException as exc:  # a library may raise anything while importing
    text = (type(exc).__name__ + ": " + str(exc)).strip()
    out["error"] = text.splitlines()[0][:300] if str(exc) else type(exc).__name__
print(json.dumps(out))
"""


def probe_module(name: str, timeout: float = 120.0) -> Probe:
    """Import ``name`` in a child process (this interpreter) and report what happened."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE_CODE, name], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    except subprocess.TimeoutExpired:
        return Probe(False, error=f"import took longer than {timeout:.0f} s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return Probe(False, error=f"the import crashed: {tail[:300]}")
    raw = json.loads(lines[-1])
    return Probe(bool(raw.get("importable")), raw.get("version"), raw.get("error"), raw.get("extra") or {})


def _dist_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _module_check(spec: ModuleSpec, probe: Probe, installed: str | None, required: bool, editable: bool) -> Check:
    fix = spec.fix or install_line(() if spec.extra == "core" else (spec.extra,), editable=editable)
    group = "core" if spec.extra == "core" else f"extra: {spec.extra}"
    if probe.importable:
        return Check(group, spec.module, True, installed or probe.version or "version unknown", None, required)
    if installed:
        detail = f"installed ({installed}) but not importable: {probe.error or 'unknown error'}"
    else:
        detail = f"not installed; needed for {spec.needed_for}"
    return Check(group, spec.module, False, detail, fix, required)


def _backend_fix(lacking: list[ModuleSpec], editable: bool) -> str | None:
    """One line for the missing libraries of a backend: the extras in one ``pip install``, or a library's own line
    (the first such library of each extra)."""
    if not lacking:
        return None
    extras: list[str] = []
    own: list[str] = []
    for spec in lacking:
        if spec.fix is not None:
            if not any(other.extra == spec.extra and other.fix in own for other in lacking):
                own.append(spec.fix)
        elif spec.extra not in extras:
            extras.append(spec.extra)
    parts = ([install_line(extras, editable=editable)] if extras else []) + own
    return "; ".join(parts)


def _torch_checks(probe: Probe) -> list[Check]:
    if not probe.importable:
        return []
    extra = dict(probe.extra)
    if extra.get("cuda"):
        devices = ", ".join(extra.get("devices") or []) or "?"
        out = [Check("extra: models", "torch CUDA", True, f"CUDA {extra.get('cuda_version')}: {devices}")]
        bf16 = bool(extra.get("bf16"))
        out.append(Check("extra: models", "torch bf16", bf16,
                         "supported" if bf16 else "not supported on this GPU (use dtype=float16 or float32)"))
    else:
        build = f"CUDA {extra['cuda_version']} build" if extra.get("cuda_version") else "CPU build"
        out = [Check("extra: models", "torch CUDA", False,
                     f"no GPU visible ({build}); everything runs on the CPU, LISA/RadEdit slowly",
                     "pip install torch==2.13.0  # on a GPU machine: PyPI's Linux wheel is a CUDA build")]
    return out


def _shipped_checks(editable: bool) -> list[Check]:
    out = []
    fix = f"reinstall the package: {install_line(editable=editable)}" + ("" if editable else " --force-reinstall")
    for path in shipped_weights():
        out.append(Check("weights", f"shipped {path.name}", path.is_file(), str(path) if path.is_file() else "missing",
                         None if path.is_file() else fix, required=True))
    return out


def _weights_checks(root: Path | None, env: Mapping[str, str], home: Path) -> list[Check]:
    if root is None:
        root = Path(env.get(WEIGHTS_ENV) or "weights")
    how = f"--weights DIR or ${WEIGHTS_ENV}"
    if not root.is_dir():
        return [Check("weights", "weights root", False, f"{root} does not exist; no model weights found ({how})",
                      f"export {WEIGHTS_ENV}=/path/to/weights  # laid out as in the backends reference")]
    out = [Check("weights", "weights root", True, str(root.resolve()))]
    for rel, what, option in WEIGHTS_LAYOUT:
        path = root / rel
        found = path.exists() and (not path.is_dir() or any(path.iterdir()))
        if rel == "yolo" and found:
            found = any(path.glob("*.pt"))
        detail = option.format(path=path, parent=path.parent) if found else f"not found at {path}"
        out.append(Check("weights", what, found, detail))
    cxas_home = home / ".cxas" / "weights" / "UNet_ResNet50_default.pth"
    if cxas_home.is_file():
        out.append(Check("weights", "CXAS (cxas package folder)", True,
                         f"--segmenter cxas --segmenter-opt weights_dir={cxas_home.parent}"))
    return out


def _chromium_check(which: Callable[[str], str | None]) -> Check:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = which(name)
        if path:
            return Check("tools", "Chromium", True, path)
    return Check("tools", "Chromium", False, "not found; the browser tests and gallery checks need it",
                 "sudo apt-get install chromium")


def _ray_address(address: str, tmp: Path) -> tuple[str, int] | None:
    """``host, port`` of a Ray address (``ray://h:p``, ``h:p``, or ``auto`` read from the local session file)."""
    if address == "auto":
        current = tmp / "ray" / "ray_current_cluster"
        if not current.is_file():
            return None
        address = current.read_text(encoding="utf-8").strip()
    address = address.removeprefix("ray://")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host or "127.0.0.1", int(port)


def _ray_check(env: Mapping[str, str], connect: Callable[[str, int], None], tmp: Path) -> Check | None:
    address = env.get("RAY_ADDRESS")
    if not address:
        return None
    target = _ray_address(address, tmp)
    if target is None:
        return Check("cluster", "Ray cluster", False, f"RAY_ADDRESS={address!r} names no host:port",
                     "export RAY_ADDRESS=ray://HEAD:10001  # or HEAD:6379 on the head node's network")
    try:
        connect(*target)
    except OSError as exc:
        return Check("cluster", "Ray cluster", False, f"{target[0]}:{target[1]} not reachable ({exc})",
                     "start the cluster (ray start --head on the head node) or fix RAY_ADDRESS")
    return Check("cluster", "Ray cluster", True, f"{target[0]}:{target[1]} reachable (TCP; not started here)")


def _tcp_connect(host: str, port: int) -> None:
    with socket.create_connection((host, port), timeout=5):
        pass


def _pack_check(find: Callable[[], Path]) -> Check:
    try:
        path = find()
    except Exception as exc:  # PackMissingError or an unreadable folder
        return Check("data", "real-data pack", False, f"not found ({exc})",
                     "export CXRGROUND_PACK=/path/to/cxr-pack-v1  # only the pack tests and benchmarks need it")
    return Check("data", "real-data pack", True, str(path))


def run_checks(*, weights: str | Path | None = None, env: Mapping[str, str] | None = None,
               probe: Callable[[str], Probe] = probe_module, installed: Callable[[str], str | None] = _dist_version,
               which: Callable[[str], str | None] = shutil.which,
               connect: Callable[[str, int], None] = _tcp_connect, find_pack: Callable[[], Path] | None = None,
               home: Path | None = None, tmp: Path = Path("/tmp"), workers: int = 4,
               editable: bool | None = None) -> Report:
    """Check this environment (see the module docstring); every argument but ``weights`` is for tests.

    The install lines are ``pip install 'cxrground[EXTRA]'``, or ``pip install -e '.[EXTRA]'`` when the package is
    an editable install of a source checkout (``editable``; None: as its ``direct_url.json`` says)."""
    env = os.environ if env is None else env
    editable = is_editable_install() if editable is None else editable
    if find_pack is None:
        from cxrground.datasets.pack import find_pack as _find

        find_pack = _find
    report = Report()
    py_ok = sys.version_info >= (3, 11)
    report.checks.append(Check("python", "Python", py_ok, f"{platform.python_version()} ({sys.executable})",
                               None if py_ok else "install Python 3.11 or newer", required=True))
    report.checks.append(Check("python", "cxrground", True,
                               f"{cxrground.__version__} ({Path(cxrground.__file__).parent})"))
    specs = (*CORE, *EXTRAS)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        probes = list(pool.map(probe, [s.module for s in specs]))
    for spec, result in zip(specs, probes, strict=True):
        required = spec.extra == "core" or spec.module in REQUIRED_EXTRAS
        report.checks.append(_module_check(spec, result, installed(spec.dist), required, editable))
        if spec.module == "torch":
            report.checks.extend(_torch_checks(result))
    importable = {spec.module: result.importable for spec, result in zip(specs, probes, strict=True)}
    by_module = {spec.module: spec for spec in specs}
    for backend, how, modules in BACKENDS:
        lacking = [m for m in modules if not importable.get(m, False)]
        report.checks.append(Check("backends", backend, not lacking,
                                   how if not lacking else f"{how}: needs {', '.join(lacking)}",
                                   _backend_fix([by_module[m] for m in lacking], editable)))
    report.checks.extend(_shipped_checks(editable))
    report.checks.extend(_weights_checks(Path(weights) if weights else None, env, home or Path.home()))
    report.checks.append(_chromium_check(which))
    ray = _ray_check(env, connect, tmp)
    if ray is not None:
        report.checks.append(ray)
    report.checks.append(_pack_check(find_pack))
    return report


def plugin_checks(plugins: Plugins) -> list[Check]:
    """One check per plug-in module (:mod:`cxrground.plugins`): imported, with where it was named, or failed (then
    required: the command line runs no command with it); one line saying how to add one when there is none."""
    if not plugins.loaded and not plugins.failed:
        return [Check("plug-ins", "none", True, f"${PLUGINS_ENV} or entry points of group {ENTRY_POINT_GROUP!r} name "
                                                "plug-in modules")]
    checks = [Check("plug-ins", p.module, True, f"imported (named by {p.source})") for p in plugins.loaded]
    checks += [Check("plug-ins", f.plugin.module, False, f"{f.error} (named by {f.plugin.source})", f.fix(),
                     required=True) for f in plugins.failed]
    return checks


def format_report(report: Report) -> str:
    """The report as text: one line per check, the fix under each missing piece, the verdict last."""
    lines: list[str] = []
    group = None
    for c in report.checks:
        if c.group != group:
            group = c.group
            lines.append(f"\n[{group}]")
        mark = _STATUS_OK if c.ok else ("MISSING" if c.required else "missing")
        lines.append(f"  {mark:<8} {c.name:<34} {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"  {'':<8} {'':<34} fix: {c.fix}")
    missing = [c.name for c in report.checks if c.required and not c.ok]
    if report.ok:
        lines.append("\nThe built-in chain can run (make demo). Lines marked 'missing' are optional.")
    else:
        lines.append("\nThe built-in chain cannot run; missing: " + ", ".join(missing) + ".")
    return "\n".join(lines).lstrip("\n")
