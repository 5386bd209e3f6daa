"""Out-of-tree backends that break: what they raise or return is checked where the toolkit calls them, and the
error names the backend; per-study / per-case / per-image in the batch commands (a build or a run goes on)."""

from __future__ import annotations

import inspect
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from cxrground.anatomy.segment import SEGMENTERS, LungHeartMasks
from cxrground.anatomy.segment.base import segment_image
from cxrground.anatomy.segment.plausibility import segment_checked
from cxrground.cli import main
from cxrground.errors import BackendError, BatchStopped
from cxrground.ils.build import BackendSpec, build_dataset
from cxrground.ils.config import IlsConfig
from cxrground.ils.ray_engine import gpus_per_worker
from cxrground.ils.spatial import DETECTORS, SYNTHESIZERS, PseudoNormalSynthesizer
from cxrground.ils.spatial.base import NormalSynthesizer
from cxrground.io.image import CXRImage
from cxrground.registry import Registry
from cxrground.reports.structure import STRUCTURERS


@contextmanager
def registered(registry: Registry, name: str, factory: Any, **kwargs: Any) -> Iterator[str]:
    """``factory`` registered as ``name`` in ``registry`` for the block's duration."""
    registry.register(name, factory, help="a test backend", **kwargs)
    try:
        yield name
    finally:
        del registry._backends[name]


def _lungs(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    right, left = np.zeros((h, w), bool), np.zeros((h, w), bool)
    right[h // 5:4 * h // 5, w // 8:w // 2 - w // 16] = True
    left[h // 5:4 * h // 5, w // 2 + w // 16:7 * w // 8] = True
    return right, left


class BoxLungs:
    """Two rectangles as lungs; ``mode`` picks a broken output (``small``: half-size masks, ``dict``, ``source``:
    an unknown heart source, ``name``: a source that is not text) or numbers for masks (``uint8``, ``float``)."""

    name = "t-boxlungs"

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode

    def segment(self, image: CXRImage) -> Any:
        h, w = image.pixels.shape
        if self.mode == "dict":
            return {"right": None}
        if self.mode == "small":
            h, w = h // 2, w // 2
        right, left = _lungs(h, w)
        if self.mode in ("uint8", "float"):
            right, left = right.astype(self.mode if self.mode == "uint8" else np.float32), left.astype(np.float32)
        heart_source, source = {"source": ("banana", self.name), "name": ("none", 123)}.get(self.mode,
                                                                                           ("none", self.name))
        return LungHeartMasks(right, left, None, heart_source, source=source)  # type: ignore[arg-type]

    def provenance(self) -> dict[str, Any]:
        return {"name": self.name}


class TupleBoxes:
    """A detector that returns tuples instead of :class:`Box`."""

    name = "t-tuples"

    def detect(self, image: np.ndarray, anomaly: np.ndarray | None = None) -> list[Any]:
        return [(0, 0, 10, 10, 0.5)]

    def provenance(self) -> dict[str, Any]:
        return {"name": self.name}


class BadBoxes(TupleBoxes):
    """A detector whose one box breaks the contract as ``mode`` says."""

    name = "t-badboxes"

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode

    def detect(self, image: np.ndarray, anomaly: np.ndarray | None = None) -> list[Any]:
        from cxrground.ils.spatial.base import Box

        bounds, conf = {"swapped": ((20, 20, 10, 10), 0.5), "conf": ((10, 10, 20, 20), 7.5),
                        "float": ((10.5, 10, 20, 20), 0.5), "outside": ((900, 10, 950, 20), 0.5),
                        "nan": ((10, 10, 20, 20), float("nan"))}.get(self.mode, ((np.int64(-5), 10, 20, 20),
                                                                               np.float32(0.5)))
        return [Box(*bounds, conf)]


@pytest.mark.parametrize(("mode", "said"), [
    ("swapped", "box 1 (20, 20, 10, 10) with x0 > x1 or y0 > y1"),
    ("conf", "box 1 (10, 10, 20, 20) with confidence 7.5 (expected a number in [0, 1])"),
    ("nan", "box 1 (10, 10, 20, 20) with confidence nan"),
    ("float", "box 1 (10.5, 10, 20, 20) with bounds that are not all integers"),
    ("outside", "box 1 (900, 10, 950, 20) with no pixel on the 64×64 canvas"),
])
def test_a_detector_box_that_breaks_the_contract_is_named(mode, said):
    from cxrground.ils.spatial.base import detect_boxes

    image = np.zeros((64, 64), np.uint8)
    with pytest.raises(BackendError, match=r"detector 't-badboxes': detect\(\) returned " + re.escape(said)):
        detect_boxes(BadBoxes(mode), image, None)
    assert len(detect_boxes(BadBoxes("ok"), image, None)) == 1  # numpy numbers, partly outside: kept


class ProtocolSynth:
    """A synthesizer with exactly the documented :class:`NormalSynthesizer` signature."""

    name = "t-protocol"

    def synthesize(self, image: np.ndarray, edit_mask: np.ndarray,
                   regions: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
        return PseudoNormalSynthesizer().synthesize(image, edit_mask, regions)

    def provenance(self) -> dict[str, Any]:
        return {"name": self.name}


class FloatSynth(ProtocolSynth):
    name = "t-float"

    def synthesize(self, image: np.ndarray, edit_mask: np.ndarray,
                   regions: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
        return image.astype(np.float64)


class RaisingStructurer:
    name = "t-raise"

    @property
    def provenance(self) -> dict[str, Any]:
        return {"name": self.name}

    def structure(self, report_id: str, section: Any) -> Any:
        raise RuntimeError("boom from the test structurer")


class MethodStructurer:
    """The rule structurer with an option and a ``provenance()`` method (the other backends' convention)."""

    name = "t-method"

    def __init__(self, tag: str = "none") -> None:
        from cxrground.reports.structure import RuleStructurer

        self.tag, self.rules = tag, RuleStructurer()

    def provenance(self) -> dict[str, Any]:
        return {"name": self.name, "tag": self.tag, "n": np.int64(1)}

    def structure(self, report_id: str, section: Any) -> Any:
        return self.rules.structure(report_id, section)


def test_reports_structure_takes_structurer_options_and_a_provenance_method(tmp_path):
    from cxrground.reports.request import StructureRequest, structure_files

    report = tmp_path / "s1.txt"
    report.write_text("FINDINGS: Small left pleural effusion.\n")
    with registered(STRUCTURERS, "t-method", MethodStructurer):
        output = structure_files([report], StructureRequest(structurer_name="t-method",
                                                            structurer_opt={"tag": "mine"}, progress=False))
    rows = [json.loads(line) for line in output.lines]
    assert rows and all(r["provenance"] == {"name": "t-method", "tag": "mine", "n": 1} for r in rows)


def _failures(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]


def _build(tiny_ils_tasks, out: Path, spec: BackendSpec) -> Any:
    tasks, failures = tiny_ils_tasks
    return build_dataset(tasks, out, IlsConfig(seed=0), spec, scan_failures=failures, progress=False)


def test_the_synthesizer_protocol_takes_the_regions_the_pipeline_passes(tiny_ils_tasks, tmp_path):
    assert "regions" in inspect.signature(NormalSynthesizer.synthesize).parameters
    with registered(SYNTHESIZERS, "t-protocol", ProtocolSynth):
        summary = _build(tiny_ils_tasks, tmp_path / "ils", BackendSpec(synthesizer="t-protocol"))
    assert summary.studies_in_dataset > 0 and not summary.every_failed


@pytest.mark.parametrize(("mode", "said"), [
    ("small", "segmenter 't-boxlungs' returned masks of (128, 128) for a (256, 256) image"),
    ("dict", "segmenter 't-boxlungs': segment() returned dict, expected LungHeartMasks"),
    ("source", "segmenter 't-boxlungs' returned unusable masks: heart_source 'banana' is not one of model, estimate"),
    ("name", "segmenter 't-boxlungs' returned unusable masks: source 123 is not text"),
])
def test_a_segmenter_returning_wrong_masks_is_named(mode, said):
    image = CXRImage(pixels=np.tile(np.arange(256, dtype=np.uint8), (256, 1)))  # a film, not a blank one
    with pytest.raises(BackendError, match=said.replace("(", r"\(").replace(")", r"\)")):
        segment_checked(BoxLungs(mode), image)


@pytest.mark.parametrize("mode", ["uint8", "float"])
def test_masks_of_binary_numbers_are_kept_as_bool(mode):
    masks = segment_image(BoxLungs(mode), CXRImage(pixels=np.full((256, 256), 100, np.uint8)))
    assert masks.right_lung.dtype == bool and masks.left_lung.dtype == bool
    assert int(masks.right_lung.sum()) == int(_lungs(256, 256)[0].sum())
    assert LungHeartMasks(*_lungs(8, 8), np.ones((8, 8), np.uint8) * 255, "model", "x").heart.dtype == bool


def test_ils_build_with_the_normative_synthesizer_takes_float_masks(tiny_ils_tasks, tmp_path):
    with registered(SEGMENTERS, "t-boxlungs", BoxLungs):
        summary = _build(tiny_ils_tasks, tmp_path / "ils", BackendSpec(segmenter="t-boxlungs",
                                                                       segmenter_kwargs={"mode": "float"}))
    assert not summary.every_failed
    assert not [f for f in _failures(tmp_path / "ils") if f["error"] == "BackendError"]


def test_ils_build_records_broken_backends_as_named_study_failures(tiny_ils_tasks, tmp_path):
    with registered(SEGMENTERS, "t-boxlungs", BoxLungs), registered(DETECTORS, "t-tuples", TupleBoxes), \
            registered(SYNTHESIZERS, "t-float", FloatSynth):
        cases = {
            "seg": (BackendSpec(synthesizer="pseudo-normal", segmenter="t-boxlungs",
                                segmenter_kwargs={"mode": "small"}), "segment",
                    "segmenter 't-boxlungs' returned masks of"),
            "det": (BackendSpec(synthesizer="pseudo-normal", detector="t-tuples"), "spatial",
                    "detector 't-tuples': detect() returned tuple, expected a list of Box"),
            "syn": (BackendSpec(synthesizer="t-float"), "spatial",
                    "synthesizer 't-float' returned a float64 image"),
        }
        for name, (spec, stage, said) in cases.items():
            _build(tiny_ils_tasks, tmp_path / name, spec)
            failed = [f for f in _failures(tmp_path / name) if f["error"] == "BackendError"]
            assert failed and all(f["stage"] == stage and said in f["reason"] for f in failed), (name, failed)


@pytest.mark.parametrize("synthesizer", ["normative", "pseudo-normal"])
def test_a_raising_structurer_is_a_study_failure_with_any_synthesizer(tiny_ils_tasks, tmp_path, synthesizer):
    with registered(STRUCTURERS, "t-raise", RaisingStructurer):
        summary = _build(tiny_ils_tasks, tmp_path / "ils", BackendSpec(structurer="t-raise", synthesizer=synthesizer))
    failures = _failures(tmp_path / "ils")
    assert failures and all(f["stage"] == "structure" and f["error"] == "BackendError" for f in failures)
    assert "structurer 't-raise' failed in structure(): RuntimeError: boom" in failures[0]["reason"]
    assert summary.every_failed


class ProvLungs(BoxLungs):
    """:class:`BoxLungs` whose provenance holds numpy values (``numpy``), an object (``object``) or raises."""

    name = "t-prov"

    def provenance(self) -> dict[str, Any]:
        if self.mode == "raise":
            raise RuntimeError("provenance broke")
        if self.mode == "object":
            return {"name": self.name, "settings": {"weights": object()}}
        return {"name": self.name, "threshold": np.float32(0.5), "n": np.int64(3), "shape": np.array([1, 2]),
                "flags": (np.bool_(True), Path("/w"))}


def test_a_provenance_is_made_json_ready_or_refused_by_name():
    from cxrground.registry import read_provenance

    assert read_provenance("segmenter", ProvLungs("numpy")) == {"name": "t-prov", "threshold": 0.5, "n": 3,
                                                                 "shape": [1, 2], "flags": [True, "/w"]}
    assert read_provenance("structurer", RaisingStructurer()) == {"name": "t-raise"}  # a property
    assert read_provenance("detector", object()) is None
    with pytest.raises(BackendError, match=r"segmenter 't-prov': its provenance holds a object at "
                                           r"provenance\['settings'\]\['weights'\], which JSON cannot hold"):
        read_provenance("segmenter", ProvLungs("object"))
    with pytest.raises(BackendError, match=r"segmenter 't-prov' failed in provenance\(\): RuntimeError: provenance"):
        read_provenance("segmenter", ProvLungs("raise"))


def test_ils_build_writes_numpy_provenance_as_json_and_refuses_a_broken_one_before_any_study(tiny_ils_tasks,
                                                                                             tmp_path):
    with registered(SEGMENTERS, "t-prov", ProvLungs):
        _build(tiny_ils_tasks, tmp_path / "np", BackendSpec(synthesizer="pseudo-normal", segmenter="t-prov"))
        for mode in ("raise", "object"):
            with pytest.raises(BackendError, match="segmenter 't-prov'"):
                _build(tiny_ils_tasks, tmp_path / mode, BackendSpec(segmenter="t-prov",
                                                                    segmenter_kwargs={"mode": mode}))
            assert not list((tmp_path / mode).rglob("units/*"))  # no study processed
    backends = json.loads((tmp_path / "np" / "provenance.json").read_text())["backends"]
    assert backends["segmenter"]["n"] == 3 and backends["segmenter"]["shape"] == [1, 2]


def test_ils_build_exits_1_when_every_study_failed(tiny_ils_tasks, tmp_path):
    tasks, _ = tiny_ils_tasks
    images = next(p for p in Path(tasks[0].image_path).parents if p.name == "files")
    (tmp_path / "no-masks").mkdir()
    args = ["ils", "build", "--images", str(images), "--quiet", "--synthesizer", "pseudo-normal"]
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "ils"), "--segmenter", "masks",
                                    "--segmenter-opt", f"root={tmp_path / 'no-masks'}"])
    assert res.exit_code == 1, res.output
    assert f"every study failed; the reasons are in {tmp_path / 'ils' / 'failures.jsonl'}" in res.output
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "ok")])
    assert res.exit_code == 0 and "every study failed" not in res.output, res.output


def test_a_backend_registered_with_gpu_gets_a_gpu_actor():
    with registered(DETECTORS, "t-gpu", TupleBoxes, gpu=True):
        assert gpus_per_worker(BackendSpec(detector="t-gpu")) == 1
        assert gpus_per_worker(BackendSpec(detector="t-gpu", detector_kwargs={"device": "cpu"})) == 0
    assert gpus_per_worker(BackendSpec()) == 0


# --- CheXpercept: deformers and VLM clients ------------------------------------------------------------------

def test_a_broken_deformer_fails_its_cases_by_name(tmp_path_factory, tmp_path):
    from cxrground.percept.build import BuildOptions, build_benchmark
    from cxrground.percept.deform.builtin import BuiltinDeformer
    from cxrground.percept.deform.registry import DEFORMERS
    from percept_build_helpers import synthetic_ils

    class Raising(BuiltinDeformer):
        name = "t-raise"

        def deform(self, image, mask, *args, **kwargs):
            raise RuntimeError("boom from the test deformer")

    class BareArray(BuiltinDeformer):
        name = "t-array"

        def deform(self, image, mask, *args, **kwargs):
            return mask

    ils, images = synthetic_ils(tmp_path_factory)
    said = {"t-raise": "deformer 't-raise' failed in deform(): RuntimeError: boom from the test deformer",
            "t-array": "deformer 't-array': deform() returned ndarray, expected DeformResult"}
    with registered(DEFORMERS, "t-raise", Raising), registered(DEFORMERS, "t-array", BareArray):
        for name, reason in said.items():
            opts = BuildOptions(ils=str(ils), images=str(images), per_lesion=(1, 1, 1), max_candidates=2,
                                splits=("train",), seed=3, deformer=name)
            build_benchmark(opts, tmp_path / name, workers=1, progress=False)
            failures = [json.loads(line) for line in (tmp_path / name / "failures.jsonl").read_text().splitlines()]
            assert any(f["reason"] == reason for f in failures), failures


class _NumberMask:
    """A deformer whose mask is ``dtype`` numbers (``scale`` times 0/1): it grows the mask by one column."""

    name = "t-numbers"

    def __init__(self, dtype: Any, scale: float = 1.0) -> None:
        self.dtype, self.scale = dtype, scale

    def deform(self, image: np.ndarray, mask: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        from cxrground.percept.deform.base import DeformResult

        grown = mask.copy()
        grown[:, 1:] |= mask[:, :-1]
        return DeformResult((grown * self.scale).astype(self.dtype))


@pytest.mark.parametrize(("dtype", "scale"), [(np.uint8, 1), (np.uint8, 255), (np.float32, 1.0)])
def test_a_deformer_mask_of_binary_numbers_comes_back_as_bool(dtype, scale):
    from cxrground.percept.deform.base import CheckedDeformer

    mask = np.zeros((8, 8), bool)
    mask[2:5, 2:5] = True
    res = CheckedDeformer(_NumberMask(dtype, scale)).deform(np.zeros((8, 8), np.uint8), mask, mask, None, [], [],
                                                            np.random.default_rng(0))
    assert res.mask.dtype == bool and res.mask.sum() == 12
    shown = np.zeros((8, 8), bool)
    shown |= res.mask  # what the build does with it


def test_a_deformer_mask_that_is_not_binary_is_refused_by_name():
    from cxrground.percept.deform.base import CheckedDeformer

    mask = np.zeros((8, 8), bool)
    mask[2:5, 2:5] = True
    with pytest.raises(BackendError, match=r"deformer 't-numbers' returned an unusable mask: its mask is not binary"):
        CheckedDeformer(_NumberMask(np.float32, 0.5)).deform(np.zeros((8, 8), np.uint8), mask, mask, None, [], [],
                                                             np.random.default_rng(0))


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    from cxrground.testing.mock_bench import make_benchmark

    return make_benchmark(tmp_path_factory.mktemp("bench"), {"LF": 1, "RF": 1, "RR": 1}, seed=1)


class _BrokenClient:
    """A VLM client whose ``complete`` raises (model ``raise``) or returns a str (model ``str``)."""

    kind = "t-broken"

    def __init__(self, model: str, **opts: Any) -> None:
        self.model = model
        self.decoding: dict[str, Any] = {"temperature": 0.0}
        self.max_images = 8

    @property
    def identity(self) -> dict[str, Any]:
        if self.model == "identity":
            raise RuntimeError("identity broke")
        return {"kind": self.kind, "model": self.model}

    def cache_context(self, question: Any, case_id: str) -> None:
        if self.model == "context":
            raise RuntimeError("context broke")
        return None

    async def complete(self, messages: Any, question: Any, case_id: str = "", seed: int | None = None) -> Any:
        import asyncio

        if self.model == "raise":
            raise RuntimeError("boom from the test client")
        if self.model == "slow":
            await asyncio.sleep(30)
        return "A"

    async def aclose(self) -> None:
        pass


def _run_broken_client(bench: Path, out: Path, model: str, **kwargs: Any) -> Any:
    """``run_eval`` of the :class:`_BrokenClient` ``t-broken:MODEL`` into ``out``."""
    from cxrground.evaluation.percept import clients
    from cxrground.evaluation.percept.clients import CLIENTS, HARNESS_OPTIONS
    from cxrground.evaluation.percept.runner import EvalSettings, run_eval

    clients._NAME_ARG["t-broken"] = "NAME"
    try:
        with registered(CLIENTS, "t-broken", _BrokenClient, options=("model", *HARNESS_OPTIONS)):
            return run_eval(EvalSettings(bench, f"t-broken:{model}", oracle="none"), out, progress=False, **kwargs)
    finally:
        del clients._NAME_ARG["t-broken"]


@pytest.mark.parametrize(("model", "said"), [
    ("raise", "VLM client 't-broken:raise' failed in complete(): RuntimeError: boom from the test client"),
    ("str", "VLM client 't-broken:str': complete() returned str, expected Completion"),
    ("context", "VLM client 't-broken:context' failed in cache_context(): RuntimeError: context broke"),
])
def test_a_broken_vlm_client_fails_each_case_by_name_and_the_run_finishes(bench, tmp_path, model, said):
    from cxrground.evaluation.percept.runner import load_results

    _run_broken_client(bench, tmp_path / "run", model)
    results = load_results(tmp_path / "run")
    assert len(results) == len(json.loads((tmp_path / "run" / "cases.json").read_text())) > 1
    assert all(r["status"] == "failed" and r["error"] == f"BackendError: {said}" for r in results.values())


def test_a_vlm_client_whose_identity_fails_is_named(bench, tmp_path):
    with pytest.raises(BackendError, match=r"VLM client 't-broken:identity' failed in identity\(\): RuntimeError: "
                                           "identity broke"):
        _run_broken_client(bench, tmp_path / "run", "identity")


def test_the_request_timeout_bounds_a_plugin_client(bench, tmp_path, monkeypatch):
    from cxrground.evaluation.percept import runner
    from cxrground.llm import RetryPolicy

    monkeypatch.setattr(runner, "TIMEOUT_GRACE_S", 0.0)
    started = time.monotonic()
    with pytest.raises(BatchStopped, match=r"gave no answer within 0\.05 s \(the request timeout, --timeout\)"):
        _run_broken_client(bench, tmp_path / "run", "slow", retry=RetryPolicy(max_attempts=1, timeout=0.05))
    assert time.monotonic() - started < 20  # bounded by the timeout, not the client's 30 s sleep
    # a client that has never answered stops the run at its first case, which is left unrecorded (a rerun asks it)
    assert runner.load_results(tmp_path / "run") == {}


# --- ils predict: the model's own failures and its masks' size ---------------------------------------------------

class _Model:
    """An ILS model that raises (``raise``) or returns half-size masks (``small``)."""

    name = "t-model"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def predict_batch(self, images: list[np.ndarray], instructions: list[str]) -> list[Any]:
        from cxrground.models.base import IlsOutput

        if self.mode == "raise":
            raise RuntimeError("boom from the test model")
        h, w = images[0].shape
        mask = np.zeros((h // 2, w // 2), bool)
        return [IlsOutput(answer="x", mask=mask, presence=0.9, present=True) for _ in instructions]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from ils_helpers import tiny_ils

    return tiny_ils(tmp_path_factory.mktemp("predict"), 3)


@pytest.mark.parametrize(("mode", "said"), [
    ("raise", "the model failed; the first reason: model 't-model' failed in predict(): RuntimeError: boom"),
    ("small", "model 't-model': the mask of pair"),
])
def test_ils_predict_blames_the_model_not_the_images(tiny, tmp_path, mode, said):
    from cxrground.models.base import MODELS

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint.json").write_text(json.dumps({"model": "t-model", "mode": mode}))
    module = SimpleNamespace(load_model=lambda checkpoint_dir, device="cpu": _Model(mode))
    with registered(MODELS, "t-model", lambda: module):
        res = CliRunner().invoke(main, ["ils", "predict", "--checkpoint", str(tmp_path / "ckpt"), "--dataset",
                                        str(tiny / "ils"), "--images", str(tiny / "cohort" / "files"), "--split",
                                        "train", "--out", str(tmp_path / "pred.jsonl"), "--quiet"])
    assert res.exit_code == 1, res.output
    assert said in res.output and "a wrong --images" not in res.output
    failures = [json.loads(line) for line in (tmp_path / "pred.jsonl.failures.jsonl").read_text().splitlines()]
    assert failures and all(f["error"] == "BackendError" for f in failures)
    if mode == "small":  # the image, the pair and both shapes
        assert "has shape (" in failures[0]["reason"] and "(the image's native size)" in failures[0]["reason"]
        assert failures[0]["path"].endswith(".jpg") and failures[0]["pair_ids"]


def test_a_client_with_a_model_option_is_addressed_with_a_name():
    from cxrground.errors import ConfigError
    from cxrground.evaluation.percept.clients import CLIENTS, HARNESS_OPTIONS, make_client, spec_forms

    made = []

    def factory(**kw):
        made.append(kw.get("model"))
        return SimpleNamespace(**kw)

    with registered(CLIENTS, "mine", factory, options=("model", *HARNESS_OPTIONS)):
        assert "mine:NAME" in spec_forms()
        make_client("mine:my-model")
        assert made == ["my-model"]
        with pytest.raises(ConfigError, match="needs a name after 'mine:'"):
            make_client("mine")
    with pytest.raises(ConfigError, match="client 'random' takes no name"):
        make_client("random:x")
