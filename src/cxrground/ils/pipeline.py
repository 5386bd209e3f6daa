"""One study through ILS Stage I and II: report → findings, image → anatomy, anomaly map, boxes,
Algorithm 1, location verification, pair composition; masks written at native size.

Every failure becomes the study's unit record (``status`` ``failed`` or ``rejected`` with the
stage and the reason) instead of an exception, so a batch always finishes; only a
:class:`~cxrground.errors.BatchStopped` (every study would fail alike: an LLM server that cannot be reached, or a
library of an extra that does not import, :class:`~cxrground.errors.MissingExtraError`) is raised, leaving the study
without a unit.

Worker processes import cxrground afresh: :func:`backend_registrations` gives the registry entries of the backends
a build uses (those registered at run time included), which :func:`install_registrations` registers in a worker.
"""

from __future__ import annotations

import math
import os
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.anatomy import cardiothoracic_ratio, ils_location_masks
from cxrground.anatomy.segment.base import segment_image
from cxrground.anatomy.segment.orientation import orientation_problem
from cxrground.anatomy.segment.plausibility import segment_checked
from cxrground.anatomy.segment.pose_net import pose_reader_at, pose_warning
from cxrground.datasets.views import is_frontal
from cxrground.errors import BatchStopped, CXRGroundError, InputError
from cxrground.extras import missing_extra
from cxrground.ils.backend_spec import BackendSpec
from cxrground.ils.compose import GroundedFinding, NegativePlacement, compose_pairs
from cxrground.ils.config import ALGORITHM1_CHECK, IlsConfig
from cxrground.ils.layout import MASK_DIR
from cxrground.ils.tasks import StudyTask
from cxrground.io.image import DEFAULT_MAX_PIXELS, read_image
from cxrground.io.masks import encode_rle, write_mask_png
from cxrground.io.store import local_copy
from cxrground.io.transform import Letterbox
from cxrground.lesions.lesion_zones import central_mask
from cxrground.registry import Backend, Registry, check_portable, read_provenance
from cxrground.reports import parse_report_text, read_report, select_section
from cxrground.reports.reading import addendum_lesions, reads_the_film
from cxrground.reports.structure import LLMError, structure_section
from cxrground.vocab.locations import HEART
from cxrground.vocab.traits import traits

__all__ = ["Backends", "Registration", "backend_provenance", "backend_registrations", "get_backends",
           "install_registrations", "note_retries", "prestructure", "process_study", "segmentation_disagreement",
           "structurer_counts", "worker_note"]

_CACHE: dict[tuple[Any, ...], Backends] = {}

#: The stages of a :class:`BackendSpec` that name a backend, and the kind of registry each names it in.
_BACKEND_STAGES: tuple[tuple[str, str], ...] = (("structurer", "structurer"), ("segmenter", "segmenter"),
                                                ("synthesizer", "synthesizer"), ("detector", "detector"),
                                                ("qc_segmenter", "segmenter"))

#: A registry entry sent to a worker process: the registry's kind and the entry.
Registration = tuple[str, Backend[Any]]


def _registries() -> dict[str, Registry[Any]]:
    """The registries a :class:`BackendSpec` names backends in, by kind."""
    from cxrground.anatomy.segment import SEGMENTERS
    from cxrground.ils.spatial import DETECTORS, SYNTHESIZERS
    from cxrground.reports.structure import STRUCTURERS

    return {"structurer": STRUCTURERS, "segmenter": SEGMENTERS, "synthesizer": SYNTHESIZERS, "detector": DETECTORS}


def _entries(spec: BackendSpec) -> dict[tuple[str, str], Backend[Any]]:
    """The registry entry of each backend ``spec`` names, by (kind, name); an unknown name is a
    :class:`~cxrground.errors.ConfigError`."""
    registries = _registries()
    out: dict[tuple[str, str], Backend[Any]] = {}
    for stage, kind in _BACKEND_STAGES:
        name = getattr(spec, stage)
        if name is not None:
            out[(kind, name)] = registries[kind].get(name)
    return out


def backend_registrations(spec: BackendSpec, dumps: Callable[[Any], bytes] | None = None
                          ) -> tuple[Registration, ...]:
    """The registry entries of the backends ``spec`` names, for :func:`install_registrations` in worker processes.

    A :class:`~cxrground.errors.ConfigError` names a backend whose registration cannot reach a worker
    (:func:`~cxrground.registry.check_portable`; ``dumps``: the engine's serializer, None for pickle), e.g. one
    defined in an interactive session.
    """
    entries = _entries(spec)
    for (kind, _name), entry in entries.items():
        check_portable(kind, entry, dumps)
    return tuple((kind, entry) for (kind, _name), entry in entries.items())


def install_registrations(registrations: Sequence[Registration]) -> None:
    """Register ``registrations`` (from :func:`backend_registrations`) in this process, replacing entries of the
    same names."""
    registries = _registries()
    for kind, entry in registrations:
        registries[kind].add(entry, replace=True)


class Backends:
    """The four model-dependent stages, built once per process from a :class:`BackendSpec`."""

    def __init__(self, spec: BackendSpec) -> None:
        from cxrground.anatomy.segment import get_segmenter
        from cxrground.ils.spatial import detector_defaults, get_detector, get_synthesizer
        from cxrground.reports.structure import get_structurer

        self.spec = spec
        self.structurer = get_structurer(spec.structurer, **spec.structurer_kwargs)
        self.segmenter = get_segmenter(spec.segmenter, **spec.segmenter_kwargs)
        self.synthesizer = get_synthesizer(spec.synthesizer, **spec.synthesizer_kwargs)
        self.detector = get_detector(spec.detector, **{**detector_defaults(self.synthesizer, spec.detector),
                                                       **spec.detector_kwargs})
        self.qc_segmenter = (get_segmenter(spec.qc_segmenter, **spec.qc_segmenter_kwargs)
                             if spec.qc_segmenter else None)

    def provenance(self, skip: Collection[str] = ()) -> dict[str, Any]:
        """Each backend's own provenance (name, version, weights hash, settings), JSON-ready, but those of the stages
        in ``skip``; a provenance that fails or that JSON cannot hold is a :class:`~cxrground.errors.BackendError`
        naming the backend (:func:`~cxrground.registry.read_provenance`)."""
        out: dict[str, Any] = {}
        for stage, kind in _BACKEND_STAGES:
            backend = getattr(self, stage)
            if backend is None or stage in skip:
                continue
            prov = read_provenance(kind, backend)
            out[stage] = prov if prov is not None else {"name": getattr(backend, "name", type(backend).__name__)}
        return out


def get_backends(spec: BackendSpec) -> Backends:
    """Backends for ``spec``, cached per process (workers build them once; a backend registered again under its
    name is built again). A structurer that takes notes (the LLM structurer's retry notes, ``on_note``) gets this
    process's :func:`note_retries` target."""
    key = (spec.spec_hash(), *_entries(spec).values())
    if key not in _CACHE:
        _CACHE[key] = Backends(spec)
    backends = _CACHE[key]
    if hasattr(backends.structurer, "on_note"):
        backends.structurer.on_note = _RETRY_NOTE[0]
    return backends


#: Where the structurer of this process's studies sends its retry notes (None: nowhere), see :func:`note_retries`.
_RETRY_NOTE: list[Callable[[str], None] | None] = [None]


def note_retries(note: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """Send the retry notes of the structurer that :func:`process_study` uses in this process (the LLM structurer's
    ``on_note``: at most one every 10 s) to ``note`` (None: nowhere); returns the previous target."""
    previous, _RETRY_NOTE[0] = _RETRY_NOTE[0], note
    return previous


def worker_note(message: str) -> None:
    """A worker process's note on its stderr (the build's console or log: pool workers share the driver's, Ray
    forwards an actor's), naming the worker: ``LLM structurer (worker 4242): retrying ...``."""
    print(message.replace("LLM structurer:", f"LLM structurer (worker {os.getpid()}):", 1), file=sys.stderr,
          flush=True)


def structurer_counts(spec: BackendSpec) -> Counter[str]:
    """The counters of the structurer this process built for ``spec`` (the LLM structurer's ``stats``: requests,
    cache hits, retries, ...), a copy; empty when this process has not built its backends or the structurer keeps
    none."""
    try:
        key = (spec.spec_hash(), *_entries(spec).values())
    except CXRGroundError:
        return Counter()
    backends = _CACHE.get(key)
    stats = getattr(backends.structurer, "stats", None) if backends is not None else None
    return Counter(stats) if isinstance(stats, Counter) else Counter()


def backend_provenance(spec: BackendSpec) -> dict[str, Any]:
    """Provenance of the backends of ``spec``."""
    return get_backends(spec).provenance()


def prestructure(tasks: Iterable[StudyTask], config: IlsConfig, spec: BackendSpec,
                 progress: bool = False, note: Callable[[str], None] | None = None) -> Counter[str] | None:
    """With the ``llm`` structurer and a response-cache file: structure the reports of ``tasks`` first, on the
    driver, with the structurer's ``concurrency`` requests in flight (:meth:`LLMStructurer.warm_cache`), so that
    the workers' per-study calls are answered from the cache. Streams over ``tasks``; a report that cannot be read
    or fails is left for its study to record. None (nothing done) for any other structurer. ``note`` gets the
    structurer's retry notes (:attr:`LLMStructurer.on_note`)."""
    from cxrground.reports.structure import get_structurer

    if spec.structurer != "llm" or not spec.structurer_kwargs.get("cache"):
        return None
    structurer = get_structurer(spec.structurer, **spec.structurer_kwargs)
    if note is not None and hasattr(structurer, "on_note"):
        structurer.on_note = note

    def sections() -> Iterator[tuple[str, Any]]:
        for task in tasks:
            try:
                if task.report_path:
                    with local_copy(task.report_path) as report_file:
                        report = read_report(report_file)
                else:
                    report = parse_report_text(task.report_text or "", report_id=task.study_key)
            except CXRGroundError:
                continue
            section = select_section(report, config.sections)
            if section is not None:
                yield task.study_key, section

    try:
        return structurer.warm_cache(sections(), progress)
    finally:
        structurer.cache.close()


def process_study(task: StudyTask, out: Path, config: IlsConfig, spec: BackendSpec,
                  max_pixels: int | None = DEFAULT_MAX_PIXELS) -> dict[str, Any]:
    """The unit record of one study (masks already written under ``out/lesion_mask``).

    An image whose header states more than ``max_pixels`` pixels fails the study without being decoded.
    """
    unit: dict[str, Any] = {"study_key": task.study_key, "split": task.split, "image_path": task.image_path,
                            "status": "ok"}
    stage = "backends"
    report_id: str | None = None
    try:
        backends = get_backends(spec)
        stage = "reports"
        if task.report_path:
            with local_copy(task.report_path) as report_file:
                report = read_report(report_file)
        else:
            report = parse_report_text(task.report_text or "", report_id=task.study_key)
        report_id = report.report_id
        section = select_section(report, config.sections)
        if section is None:
            return {**unit, "status": "rejected", "stage": stage, "reason": "no usable report section",
                    **report_details(task, stage, report_id)}
        stage = "structure"
        structured = structure_section(backends.structurer, task.study_key, section)
        unit["findings"] = [f.to_dict() for f in structured.findings]
        addendum = addendum_lesions(report)
        if addendum is not None:  # ILS §6 reads one section: the addendum is recorded for review, not paired
            unit["addendum_lesions"] = list(addendum)
        stage = "images"
        with local_copy(task.image_path) as image_file:  # an object-storage image is fetched first
            image = read_image(image_file, max_pixels=max_pixels)
        view = (image.view or task.view or "").upper() or None
        unit["view"] = view
        if task.images_in_study > 1:
            unit["images_in_study"] = task.images_in_study
        if view is not None and not is_frontal(view, config.qc.views):
            return {**unit, "status": "rejected", "stage": "qc", "reason": f"view {view} is not frontal (PA/AP)"}
        if config.qc.pose_warning:
            stage = "pose"
            warning = pose_warning(image.pixels, pose_reader_at(config.qc.pose_weights))
            if warning is not None:
                unit["pose_warning"] = warning
        stage = "segment"
        image, anatomy, problems = segment_checked(backends.segmenter, image,
                                                   min_iou=config.qc.lung_shape_min_iou,
                                                   min_fraction=config.qc.min_lung_fraction)
        if anatomy.extra.get("polarity"):
            unit["image_note"] = anatomy.extra["polarity"]
        if anatomy.extra.get("tilt_kept"):  # the segmenter's option deskew read the film upright
            unit["tilt"] = anatomy.extra["tilt"]
        if anatomy.extra.get("content_box"):  # the segmenter's option content_box cut the film's uniform borders
            unit["content_box"] = anatomy.extra["content_box"]
        right, left, heart = anatomy.right_lung, anatomy.left_lung, anatomy.heart
        estimate = anatomy.extra.get("heart_estimate") or {}
        if anatomy.heart_source == "estimate" and not estimate.get("ctr_plausible", True):
            # a heart estimated from lungs that hide it gives CTRs far below any real heart: do not make
            # cardiomegaly masks or CTR-based negatives from it
            heart = None
            unit["heart_note"] = "heart estimate implausible (CTR below 0.30): no cardiomegaly pairs"
        if problems:
            return {**unit, "status": "rejected", "stage": "qc", "reason": "implausible lungs: " + "; ".join(problems)}
        if config.qc.orientation_check:
            posed = orientation_problem(backends.segmenter, image)
            if posed:
                return {**unit, "status": "rejected", "stage": "qc", "reason": posed}
        if backends.qc_segmenter is not None:
            problem = segmentation_disagreement(anatomy, segment_image(backends.qc_segmenter, image), config)
            if problem:
                return {**unit, "status": "rejected", "stage": "qc", "reason": problem}
        ctr = cardiothoracic_ratio(heart, right, left) if heart is not None and heart.any() else None
        stage = "spatial"
        grounded, empty, records, pair_check, placement = _ground(structured.findings, image.pixels, right,
                                                                  left, heart, backends, config)
        unit["grounding"] = records
        stage = "compose"
        composed = compose_pairs(task.study_key, structured.findings, grounded, empty, ctr, heart, config,
                                 placement, reads_film=reads_the_film(structured))
        if pair_check is not None:
            from cxrground.ils.image_check import check_pairs

            check_pairs(task.study_key, composed, *pair_check)
        for m in composed.masks:
            write_mask_png(out / MASK_DIR / m.path, m.mask)
        unit["masks"] = [{"path": m.path, "lesion": m.lesion, "area": int(m.mask.sum()), "rle": encode_rle(m.mask)}
                         for m in composed.masks]
        unit["reported"] = [[lesion, got] for lesion, got in composed.reported]
        if composed.dropped:
            unit["dropped_pairs"] = dict(composed.dropped)
        if composed.placed:
            unit["placed_negatives"] = dict(composed.placed)
        unit["anatomy"] = {
            "height": image.height, "width": image.width, "ctr": ctr,
            "segmenter": anatomy.source, "heart_source": anatomy.heart_source,
            "right_lung": encode_rle(right), "left_lung": encode_rle(left),
            "heart": encode_rle(heart) if heart is not None else None,
            "locations": {k: encode_rle(v) for k, v in ils_location_masks(right, left).items()},
            "empty_locations": list(empty),
        }
        unit["study"] = {
            "subject_id": task.subject_id,
            "dicom_id": task.dicom_id,
            "image_path": task.relative_image_path,
            "section_name": section.name,
            "section_content": section.section_content,
            "instruction_answer_pairs": {"positive_pairs": composed.positive_pairs,
                                         "negative_pairs": composed.negative_pairs},
        }
        return unit
    except BatchStopped:  # every study would fail alike (an LLM server that cannot be reached): the build stops
        raise
    except ImportError as exc:  # a library of an extra not installed: every study would fail alike
        raise missing_extra(exc, f"ils build ({stage} stage)") from exc
    except InputError as exc:
        named = {"file": exc.path} if exc.path and exc.path != task.image_path else {}  # e.g. the report
        return {**unit, "status": "failed", "stage": stage, "reason": exc.reason, "error": type(exc).__name__,
                **named, **report_details(task, stage, report_id, exc)}
    except CXRGroundError as exc:
        return {**unit, "status": "failed", "stage": stage, "reason": str(exc), "error": type(exc).__name__,
                **report_details(task, stage, report_id, exc)}
    except Exception as exc:  # a bug must not stop the batch: record it with its traceback tail
        tail = traceback.format_exc().strip().splitlines()[-3:]
        return {**unit, "status": "failed", "stage": stage, "reason": f"{type(exc).__name__}: {exc}",
                "error": "internal", "traceback": tail}


#: The unit keys a failed study's ``failures.jsonl`` line copies (see :func:`report_details`).
REPORT_DETAILS: tuple[str, ...] = ("report_path", "report", "step", "http_status", "attempts")


def report_details(task: StudyTask, stage: str, report_id: str | None,
                   exc: BaseException | None = None) -> dict[str, Any]:
    """What a study that failed at stage ``reports`` or ``structure`` records of its report: ``report_path`` (its
    file, when it has one), ``report`` (its id, once read) and, for an LLM failure, ``step``, ``http_status`` and
    ``attempts`` (see :class:`~cxrground.errors.Failure`); nothing at another stage."""
    if stage not in ("reports", "structure"):
        return {}
    details: dict[str, Any] = {"report_path": task.report_path, "report": report_id}
    if isinstance(exc, LLMError):
        details.update(step=exc.step, http_status=exc.status, attempts=exc.attempts)
    return {k: v for k, v in details.items() if v is not None}


def segmentation_disagreement(a: Any, b: Any, config: IlsConfig) -> str | None:
    """ILS §6 cross-check of two segmentations: the reason to drop the study, or None.

    Compared: the outermost x of the lungs (right lung's leftmost and left lung's rightmost column) as a
    share of the image width, and the lowest row of the heart as a share of the height (when both have
    a heart).
    """
    height, width = a.shape
    for name, mask_a, mask_b, pick in (("right", a.right_lung, b.right_lung, np.min),
                                       ("left", a.left_lung, b.left_lung, np.max)):
        if not mask_b.any():
            return f"QC segmenter found no {name} lung"
        dx = abs(int(pick(np.flatnonzero(mask_a.any(axis=0)))) - int(pick(np.flatnonzero(mask_b.any(axis=0)))))
        if dx > config.qc.lung_x_disagreement * width:
            return f"segmenters disagree on the outer {name} lung border (lung x disagreement > " \
                   f"{config.qc.lung_x_disagreement:.0%} of width)"
    if a.heart is not None and b.heart is not None and a.heart.any() and b.heart.any():
        dy = abs(int(np.flatnonzero(a.heart.any(axis=1))[-1]) - int(np.flatnonzero(b.heart.any(axis=1))[-1]))
        if dy > config.qc.heart_y_disagreement * height:
            return f"segmenters disagree on the lowest heart row (heart y disagreement > " \
                   f"{config.qc.heart_y_disagreement:.0%} of height)"
    return None


def _lesion_free_centre(config: IlsConfig, backends: Backends, ev: Any, right: np.ndarray, left: np.ndarray,
                        heart: np.ndarray | None) -> np.ndarray | None:
    """Where no lung-lesion mask may lie: the heart outline ∪ the mediastinum (widened as the synthesizer's own
    evidence widens it, when it reads lesions), or None when masks are not clipped (``lung_lesions_off_centre``
    off and a synthesizer that does not ask for it)."""
    if getattr(backends.synthesizer, "EXCLUDES_CENTRE", False) and ev is not None:
        return ev.centre
    if not config.lung_lesions_off_centre:
        return None
    return central_mask(right, left, heart, margin=0.0)


def _without_slivers(mask: np.ndarray, config: IlsConfig) -> np.ndarray:
    """``mask`` without the components smaller than Algorithm 1's own minimum (``min_component_fraction`` of the
    canvas): what a cut off the heart and mediastinum or to the guided zones leaves of a component."""
    from cxrground.ils.grounding import remove_small_components

    cfg = config.refine
    return remove_small_components(mask, math.ceil(cfg.min_component_fraction * mask.size), cfg.connectivity)


def _guided(f: Any, result: Any, lesion_mask: np.ndarray | None, guide: Any, locations: dict[str, np.ndarray],
            centre: np.ndarray | None, box: Letterbox, record: dict[str, Any], config: IlsConfig) -> GroundedFinding:
    """The finding ``f`` grounded with a zone guide (:mod:`cxrground.ils.zone_guide`); ``record`` (its grounding
    record) says which zones were guided and filled, or why no mask was left."""
    from cxrground.ils.verify import verify_location
    from cxrground.ils.zone_guide import NOTHING_LEFT, UNFLAGGED, guide_mask

    zones = guide.guided_zones(f)
    record["zone_guide"] = {"reader": guide.reader, "zones": zones}
    if not zones:
        record.update(status="empty", reason=UNFLAGGED)
        return GroundedFinding(f, None, (), False)
    mask, filled = guide_mask(lesion_mask if result.grounded else None, zones, locations, guide.smoothed, centre,
                              sigma=0.0, fill=traits(f.lesion).zone_fill)
    mask = _without_slivers(mask, config)
    record["zone_guide"]["filled"] = filled
    record["algorithm1"] = bool(result.grounded)
    native = box.mask_to_native(mask) if mask.any() else None
    if native is None or not native.any():
        if result.grounded:  # Algorithm 1's mask lay outside the flagged zones
            record.update(status="empty", reason=NOTHING_LEFT)
        return GroundedFinding(f, None, (), False)  # else Algorithm 1's own reason stands (nothing was filled)
    record.update(status="grounded", reason=None)
    check = verify_location(f.reported_location or ("right lung", "left lung"), locations, (), config, covered=mask)
    return GroundedFinding(f, native, tuple(check.grounded), check.complete)


def _ground(findings, pixels: np.ndarray, right: np.ndarray, left: np.ndarray, heart: np.ndarray | None,
            backends: Backends, config: IlsConfig
            ) -> tuple[list[GroundedFinding], list[str], list[dict[str, Any]], tuple[Any, ...] | None,
                       NegativePlacement | None]:
    """Steps 2-4 on the working canvas; lesion masks mapped back to native pixels.

    Returns the grounded findings, EL, one grounding record per positive lesion finding (for the card) and, when
    the synthesizer reads lesions (``evidence``), the arguments of :func:`~cxrground.ils.image_check.check_pairs`
    after the study key and pairs (locations, letterbox, probability, threshold, heart + mediastinum); such a
    synthesizer's lung-lesion and effusion masks are clipped off the heart and mediastinum. Last, with
    ``config.negative_check`` set, the zone reader's flags (read on the canvas) for placing the negatives
    (:class:`~cxrground.ils.compose.NegativePlacement`), else None. With ``config.zone_guide`` set, lung-lesion
    masks are shaped by that zone reader (:mod:`cxrground.ils.zone_guide`); each reader reads the canvas once.
    A positive finding without any reported location blocks every empty location (we cannot know where it is).
    """
    from cxrground.ils.grounding import ground_finding
    from cxrground.ils.spatial import anomaly_map
    from cxrground.ils.spatial.base import detect_boxes, synthesize_normal
    from cxrground.ils.verify import boxes_mask, empty_locations, verify_location, widen_to_lungs

    box = Letterbox.fit(pixels.shape, config.working_size)
    canvas = box.image_to_canvas(pixels)
    r_c, l_c = box.mask_to_canvas(right), box.mask_to_canvas(left)
    h_c = box.mask_to_canvas(heart) if heart is not None else np.zeros_like(r_c)
    locations = ils_location_masks(r_c, l_c)
    edit = r_c | l_c | h_c
    x_hat = synthesize_normal(backends.synthesizer, canvas, edit, (r_c, l_c, h_c))
    anomaly = anomaly_map(canvas, x_hat, edit)
    boxes = detect_boxes(backends.detector, canvas, anomaly)
    evidence = getattr(backends.synthesizer, "evidence", None)
    ev = evidence(canvas, (r_c, l_c, h_c)) if callable(evidence) else None
    pair_check = (locations, box, ev.probability, ev.threshold, ev.centre, ev.zone_flags) if ev is not None else None
    centre = _lesion_free_centre(config, backends, ev, r_c, l_c, h_c if heart is not None else None)
    readings: dict[str, Any] = {}

    def read_zones(name: str) -> tuple[Any, float]:
        """The zone reader ``name``'s reading of the canvas (read once per study) and the reader's flag threshold."""
        if name not in readings:
            from cxrground.lesions.zone_prior import shipped_reader

            reader = shipped_reader(name)
            readings[name] = (reader.read_film(canvas, r_c, l_c, h_c if heart is not None else None), reader.flag)
        return readings[name]

    placement = None
    if config.negative_check != "none":
        from cxrground.ils.negative_flags import algorithm1_flags, unexplained

        if config.negative_check == ALGORITHM1_CHECK:
            def ground_probe(probe):
                return ground_finding(probe, canvas, anomaly, locations, r_c, l_c, h_c, boxes, config)

            flags = algorithm1_flags(ground_probe, locations, centre)
        else:
            reading, flag = read_zones(config.negative_check)
            flags = reading.negative_flags(flag)
        placement = NegativePlacement(unexplained(flags, findings), config.negative_check)
    from cxrground.ils.zone_guide import ZoneGuide, guided

    guide = None
    if config.zone_guide != "none" and any(guided(f) for f in findings):
        reading, flag = read_zones(config.zone_guide)
        guide = ZoneGuide(config.zone_guide, reading.flags(flag), reading.lesion_map)
    grounded: list[GroundedFinding] = []
    records: list[dict[str, Any]] = []
    for f in findings:
        if f.lesion is None or f.assertion == "absent":
            continue
        if traits(f.lesion).heart_mask:
            grounded.append(GroundedFinding(f, heart, (HEART,), True))
            records.append({"lesion": f.lesion, "sent_idx": f.sent_idx, "status": "grounded" if heart is not None
                            else "empty", "reason": None if heart is not None else "empty_heart"})
            continue
        result = ground_finding(f, canvas, anomaly, locations, r_c, l_c, h_c, boxes, config)
        records.append({"lesion": f.lesion, "sent_idx": f.sent_idx, "status": result.status, "reason": result.reason,
                        "failure_counts": result.failure_counts(), "selected": len(result.selected)})
        lesion_mask = result.mask
        if centre is not None and result.grounded:
            lesion_mask = _without_slivers(lesion_mask & ~centre, config)
        if guide is not None and guide.guides(f):
            grounded.append(_guided(f, result, lesion_mask, guide, locations, centre, box, records[-1], config))
            continue
        native = box.mask_to_native(lesion_mask) if result.grounded else None
        if native is None or not native.any():
            grounded.append(GroundedFinding(f, None, (), False))
            continue
        # GL: the reported labels the drawn mask reaches within the selected boxes (a box spanning two zones grounds
        # only the zone its mask lies in; bench/records/grounded_location_mask_preregistration.md)
        drawn = boxes_mask(result.selected, lesion_mask.shape) & lesion_mask
        check = verify_location(f.reported_location or ("right lung", "left lung"), locations, result.selected,
                                config, covered=drawn if config.grounded_location == "mask" else None)
        grounded.append(GroundedFinding(f, native, tuple(check.grounded), check.complete))
    el = empty_locations(widen_to_lungs(findings) if config.negative_exclusion == "lung" else findings, locations)
    if any(findings[i].assertion != "absent" for i in el.unlocated):
        return grounded, [], records, pair_check, placement
    return grounded, list(el.labels), records, pair_check, placement
