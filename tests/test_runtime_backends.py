"""Backends registered at run time (a notebook, a script): registered again with ``replace=True``, known to the
worker processes of ``ils build``, refused up front when a worker cannot import them."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cxrground.anatomy.segment import SEGMENTERS
from cxrground.errors import ConfigError
from cxrground.ils.build import BackendSpec, build_dataset
from cxrground.ils.config import IlsConfig
from cxrground.ils.pipeline import backend_registrations, get_backends, install_registrations
from cxrground.registry import Registry, check_portable
from cxrground.reports.structure import STRUCTURERS
from runtime_backend_helpers import RuntimeRules, RuntimeUNet, UnbuildableSegmenter


@contextmanager
def runtime(registry: Registry, name: str, factory: Any) -> Iterator[str]:
    """``factory`` registered as ``name`` for the block, as a notebook registers it; the registry restored after."""
    before = dict(registry._backends)
    registry.register(name, factory, help="registered at run time")
    try:
        yield name
    finally:
        registry._backends.clear()
        registry._backends.update(before)


def _failures(out: Path) -> list[dict[str, Any]]:
    path = out / "failures.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


# --- registering a name again --------------------------------------------------------------------------


class _A:
    name = "a"


class _B:
    name = "b"

    def __init__(self, size: int = 1) -> None:
        self.size = size


def test_registering_a_name_again_needs_replace():
    reg: Registry[Any] = Registry("widget")
    reg.register("w", _A, help="first")
    with pytest.raises(ConfigError, match=r"^widget 'w' is already registered; pass replace=True"):
        reg.register("w", _B, help="second")
    assert reg.get("w").factory is _A
    reg.register("x", _A, help="after")
    reg.register("w", _B, help="second", replace=True)  # a notebook cell run again
    assert reg.get("w").factory is _B and reg.get("w").help == "second" and reg.options("w") == ("size",)
    assert reg.names() == ("w", "x")  # keeps its place
    assert isinstance(reg.create("w", size=3), _B)

    @reg.register("w", help="as a decorator", replace=True)
    def make() -> _A:
        return _A()

    assert reg.get("w").factory is make


def test_a_built_in_backend_is_replaced_only_with_replace():
    builtin = SEGMENTERS.get("unet")
    with pytest.raises(ConfigError, match=r"segmenter 'unet' is already registered; pass replace=True"):
        SEGMENTERS.register("unet", RuntimeUNet, help="mine")
    assert SEGMENTERS.get("unet") is builtin
    try:
        SEGMENTERS.register("unet", RuntimeUNet, help="mine", replace=True)
        assert SEGMENTERS.get("unet").factory is RuntimeUNet
    finally:
        SEGMENTERS.add(builtin, replace=True)
    assert SEGMENTERS.get("unet") is builtin


def test_a_backend_registered_again_is_built_again():
    spec = BackendSpec(structurer="t-again", synthesizer="pseudo-normal")
    with runtime(STRUCTURERS, "t-again", RuntimeRules):
        first = get_backends(spec).structurer
        assert type(first) is RuntimeRules and get_backends(spec).structurer is first
        STRUCTURERS.register("t-again", _A, help="the cell run again, edited", replace=True)
        assert type(get_backends(spec).structurer) is _A


# --- runtime registrations in worker processes ------------------------------------------------------------


def test_the_registrations_a_build_uses_are_sent_to_the_workers():
    spec = BackendSpec(segmenter="t-runtime-unet", structurer="t-runtime-rules", qc_segmenter="t-runtime-unet")
    with runtime(SEGMENTERS, "t-runtime-unet", RuntimeUNet), runtime(STRUCTURERS, "t-runtime-rules", RuntimeRules):
        sent = backend_registrations(spec)
        names = {(kind, entry.name) for kind, entry in sent}
        assert names == {("structurer", "t-runtime-rules"), ("segmenter", "t-runtime-unet"),
                         ("synthesizer", "normative"), ("detector", "anomaly")}
    assert "t-runtime-unet" not in SEGMENTERS
    install_registrations(sent)  # as a worker does
    try:
        assert SEGMENTERS.get("t-runtime-unet").factory is RuntimeUNet
        assert STRUCTURERS.get("t-runtime-rules").factory is RuntimeRules
    finally:
        del SEGMENTERS._backends["t-runtime-unet"], STRUCTURERS._backends["t-runtime-rules"]


def test_a_runtime_backend_builds_with_two_workers(tiny_ils_tasks, tmp_path):
    tasks, failures = tiny_ils_tasks
    spec = BackendSpec(segmenter="t-runtime-unet", structurer="t-runtime-rules", synthesizer="pseudo-normal")
    with runtime(SEGMENTERS, "t-runtime-unet", RuntimeUNet), runtime(STRUCTURERS, "t-runtime-rules", RuntimeRules):
        summary = build_dataset(tasks[:3], tmp_path / "ils", IlsConfig(seed=0), spec, workers=2,
                                scan_failures=failures, progress=False)
    assert summary.processed == 3 and summary.failures == 0, _failures(tmp_path / "ils")
    assert summary.studies_in_dataset > 0


@pytest.fixture
def interactive_main(monkeypatch):
    """``__main__`` as in a notebook or ``python -c``: a module without ``__file__``."""
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))


def _in_main(cls: type) -> type:
    """A subclass of ``cls`` defined, as far as pickle can tell, in ``__main__`` (a notebook cell)."""
    return type("ErodedUNet", (cls,), {"__module__": "__main__", "name": "eroded-unet"})


def test_a_backend_of_an_interactive_session_is_refused_before_any_study(tiny_ils_tasks, tmp_path, interactive_main):
    tasks, failures = tiny_ils_tasks
    said = (r"segmenter 'eroded-unet' is defined in this interactive session; worker processes cannot import it: "
            r"use workers=1, or define it in a module and import that module")
    with runtime(SEGMENTERS, "eroded-unet", _in_main(RuntimeUNet)):
        spec = BackendSpec(segmenter="eroded-unet", synthesizer="pseudo-normal")
        with pytest.raises(ConfigError, match=f"^{said}$"):
            build_dataset(tasks, tmp_path / "ils", IlsConfig(seed=0), spec, workers=2, scan_failures=failures,
                          progress=False)
        assert not (tmp_path / "ils" / "units").exists()
        with pytest.raises(ConfigError, match=r"^segmenter 'eroded-unet' is defined in this interactive session"):
            backend_registrations(BackendSpec(qc_segmenter="eroded-unet"))


def test_a_factory_that_cannot_be_pickled_is_refused():
    said = r"^segmenter 't-lambda' cannot be sent to worker processes .*use workers=1"
    with runtime(SEGMENTERS, "t-lambda", lambda: RuntimeUNet()), pytest.raises(ConfigError, match=said):
        check_portable("segmenter", SEGMENTERS.get("t-lambda"))


def test_a_script_main_is_portable_and_one_read_from_stdin_is_not(monkeypatch, tmp_path):
    script = types.ModuleType("__main__")
    script.__file__ = str(tmp_path / "run.py")
    (tmp_path / "run.py").write_text("# the script\n")
    monkeypatch.setitem(sys.modules, "__main__", script)
    cls = _in_main(RuntimeUNet)
    script.ErodedUNet = cls
    with runtime(SEGMENTERS, "eroded-unet", cls):
        check_portable("segmenter", SEGMENTERS.get("eroded-unet"))  # spawn re-imports the script
        script.__file__ = "<stdin>"  # python - <<EOF: no file a worker could run again
        with pytest.raises(ConfigError, match=r"^segmenter 'eroded-unet' is defined in this interactive session"):
            check_portable("segmenter", SEGMENTERS.get("eroded-unet"))


def test_ray_actors_know_runtime_backends_even_of_an_interactive_session(tiny_ils_tasks, tmp_path, interactive_main):
    pytest.importorskip("ray")
    tasks, failures = tiny_ils_tasks
    spec = BackendSpec(segmenter="eroded-unet", structurer="t-runtime-rules", synthesizer="pseudo-normal")
    with runtime(SEGMENTERS, "eroded-unet", _in_main(RuntimeUNet)), \
            runtime(STRUCTURERS, "t-runtime-rules", RuntimeRules):  # cloudpickle copies what __main__ defines
        summary = build_dataset(tasks[:2], tmp_path / "ils", IlsConfig(seed=0), spec, engine="ray", workers=1,
                                scan_failures=failures, progress=False)
    assert summary.processed == 2 and summary.failures == 0, _failures(tmp_path / "ils")


def test_a_backend_that_cannot_be_created_fails_at_the_backends_stage(tiny_ils_tasks, tmp_path):
    tasks, _ = tiny_ils_tasks
    with runtime(SEGMENTERS, "t-unbuildable", UnbuildableSegmenter):
        spec = BackendSpec(segmenter="t-unbuildable", synthesizer="pseudo-normal", detector="anomaly")
        from cxrground.ils.pipeline import process_study

        unit = process_study(tasks[0], tmp_path, IlsConfig(seed=0), spec)
    assert unit["status"] == "failed" and unit["stage"] == "backends" and unit["error"] == "ConfigError"
    assert "t-unbuildable" in unit["reason"]


def test_percept_build_workers_know_a_runtime_deformer(tmp_path, tmp_path_factory, interactive_main):
    from dataclasses import replace

    from cxrground.percept.build import build_benchmark
    from cxrground.percept.deform import DEFORMERS
    from percept_build_helpers import synthetic_bench
    from runtime_backend_helpers import RuntimeDeformer

    _, opts = synthetic_bench(tmp_path_factory)
    with runtime(DEFORMERS, "t-runtime-deformer", RuntimeDeformer):
        summary = build_benchmark(replace(opts, deformer="t-runtime-deformer"), tmp_path / "bench", workers=2,
                                  progress=False)
    reasons = [f["reason"] for f in _failures(tmp_path / "bench")]
    assert summary.cases >= 1 and not any("deformer" in r for r in reasons), reasons
    with runtime(DEFORMERS, "eroded", _in_main(RuntimeDeformer)), \
            pytest.raises(ConfigError, match=r"^deformer 'eroded' is defined in this interactive session"):
        build_benchmark(replace(opts, deformer="eroded"), tmp_path / "other", workers=2, progress=False)
    assert not (tmp_path / "other" / "cases").exists()
