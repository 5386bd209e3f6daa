"""The normative model of a build's own normal films: fitted once, before the per-study workers.

With ``--synthesizer normative`` and ``model=cohort`` (the synthesizer's default), :func:`resolve_spec` runs in
the build's main process, before any study is processed and whatever the engine:

1. **Report-normal studies.** The studies are visited in an order drawn from the build's seed; each report is
   structured (the build's structurer and section policy, as the workers will) and the study is *report-normal*
   when no finding is asserted present or uncertain, except a heart-only one (cardiomegaly: the lungs are
   normal), and the report reads the film (a finding of any kind or a normal-examination statement,
   :func:`cxrground.reports.reading.reads_the_film`). Known before any pixel is read.
2. **Their lungs.** The image is read, must be frontal, and the build's segmenter must find both lungs; the film
   and its lungs are taken onto the build's working canvas (:class:`~cxrground.io.transform.Letterbox`), exactly
   as the synthesizer sees them. At most ``max_normals`` films are read.
3. **Trim** (``trim``). Report-normal is not the same as normal (notes that describe another exam, a report
   that misses a finding), so films that do not look normal are left out before the fit. ``trim=cohort``
   (default): the statistics are fitted (and shrunk) on all the films first, and a film whose highest zone score
   under that fit, from its cells (:meth:`~cxrground.lesions.normative.NormativeModel.cell_film_score`), exceeds
   ``normative_v1``'s zone threshold (the NIH Youden threshold) is left out, highest score first, but never
   below ``min_normals`` films (a trimmed fit keeps the precision the fit needs); one pass. ``trim=prior``: the
   film's highest zone score under the shipped ``normative_v1`` itself, on the canvas
   (:meth:`~cxrground.lesions.normative.NormativeModel.zone_scores`), decides (this trims every film of a
   population unlike NIH's, e.g. the synthetic phantoms). ``trim=off``: no trim. The sidecar counts and lists the
   films left out with their scores.
4. **Fit.** With at least ``min_normals`` films, the per-location statistics are fitted on them
   (:func:`~cxrground.lesions.normative.fit_cells`) and, with ``shrink`` (default), shrunk toward the shipped
   ``normative_v1`` by their own noise (:func:`~cxrground.lesions.normative.shrink_toward`). With fewer, the
   shipped model is used and the note says why.
5. **Saved in the output folder.** ``OUT/normative_fitted.npz`` + ``.json`` (the studies used and trimmed,
   counts, note); the workers get a spec whose synthesizer reads that file with its sha256 pinned. A resumed
   build reuses the file (``--overwrite`` with other settings removes it), so a killed build finishes with
   byte-identical output.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.anatomy.segment.base import segment_image
from cxrground.errors import ConfigError, CXRGroundError
from cxrground.ils.backend_spec import BackendSpec
from cxrground.ils.config import IlsConfig
from cxrground.ils.tasks import StudyTask
from cxrground.io.progress import progress_bar
from cxrground.io.store import local_copy
from cxrground.lesions.normative import NormativeModel, film_cells, fit_cells, shrink_toward
from cxrground.reports.findings import Finding

__all__ = ["FITTED_FILE", "TRIM_MODES", "CohortNormals", "collect_normals", "film_score", "fit_cohort_model",
           "is_report_normal", "resolve_spec", "trim_against_cohort"]

#: The fitted model in the build's output folder (its sidecar is ``normative_fitted.json``).
FITTED_FILE: Final[str] = "normative_fitted.npz"


def is_report_normal(findings: Sequence[Finding], reads_film: bool = True) -> bool:
    """No finding asserted present or uncertain, except heart-only ones (cardiomegaly leaves the lungs normal), in a
    report that reads the film (``reads_film``, :func:`cxrground.reports.reading.reads_the_film`: a note that says
    nothing about the film is not a normal report)."""
    from cxrground.vocab.traits import traits

    return reads_film and not any(
        f.assertion != "absent" and not (f.lesion is not None and traits(f.lesion).heart_mask) for f in findings)


@dataclass(frozen=True)
class CohortNormals:
    """The report-normal studies read for the fit and their per-film cell statistics."""

    studies: tuple[str, ...]
    cells: tuple[np.ndarray, ...]
    visited: int
    """Studies whose report was structured before the cap was reached (or all)."""
    report_normal: int
    """Of those, the report-normal ones (before the image checks)."""
    trimmed: tuple[tuple[str, float], ...] = ()
    """Report-normal films with both lungs left out by the trim rule: ``(study, film score)``."""


def _seeded_order(tasks: Sequence[StudyTask], seed: int) -> list[StudyTask]:
    ordered = sorted(tasks, key=lambda t: t.study_key)
    return [ordered[i] for i in np.random.default_rng(seed).permutation(len(ordered))]


def _report_normal_tasks(tasks: Sequence[StudyTask], spec: BackendSpec, config: IlsConfig,
                         counts: dict[str, int]) -> Iterator[StudyTask]:
    """The report-normal studies of ``tasks`` in the seeded order (``counts``: visited, report_normal)."""
    from cxrground.ils.pipeline import get_backends
    from cxrground.reports import parse_report_text, read_report, select_section
    from cxrground.reports.reading import reads_the_film
    from cxrground.reports.structure import structure_section

    structurer = get_backends(spec).structurer
    for task in _seeded_order(tasks, config.seed):
        counts["visited"] += 1
        try:
            if task.report_path:
                with local_copy(task.report_path) as report_file:  # an object-storage report is fetched first
                    report = read_report(report_file)
            else:
                report = parse_report_text(task.report_text or "", report_id=task.study_key)
            section = select_section(report, config.sections)
            if section is None:
                continue
            structured = structure_section(structurer, task.study_key, section)
        except CXRGroundError:  # the study's own unit records the failure (a structurer's own error included)
            continue
        if is_report_normal(structured.findings, reads_the_film(structured)):
            counts["report_normal"] += 1
            yield task


def film_score(model: NormativeModel, pixels: np.ndarray, right: np.ndarray, left: np.ndarray) -> float:
    """The film's highest zone score under ``model`` (NaN when no zone has a pixel)."""
    scores = [v for v in model.zone_scores(model.z_map(pixels, right, left), right, left).values() if np.isfinite(v)]
    return float(max(scores)) if scores else float("nan")


def _canvas_cells(task: StudyTask, spec: BackendSpec, config: IlsConfig, grid: tuple[int, int],
                  prior: NormativeModel | None = None) -> tuple[np.ndarray, float] | None:
    """The study's cell statistics on the working canvas and its film score under ``prior`` (NaN without one);
    None when it is not frontal or a lung is missing."""
    from cxrground.datasets.views import is_frontal
    from cxrground.ils.pipeline import get_backends
    from cxrground.io.image import read_image
    from cxrground.io.transform import Letterbox

    try:
        with local_copy(task.image_path) as image_file:  # an object-storage film is fetched first
            image = read_image(image_file)
        view = (image.view or task.view or "").upper()
        if view and not is_frontal(view, config.qc.views):
            return None
        anatomy = segment_image(get_backends(spec).segmenter, image)
    except CXRGroundError:
        return None
    right, left = anatomy.right_lung, anatomy.left_lung
    if not right.any() or not left.any() or float((right | left).mean()) < config.qc.min_lung_fraction:
        return None
    box = Letterbox.fit(image.pixels.shape, config.working_size)
    r_c, l_c = box.mask_to_canvas(right), box.mask_to_canvas(left)
    l_c = l_c & ~r_c
    if not r_c.any() or not l_c.any():
        return None
    canvas = box.image_to_canvas(image.pixels)
    score = film_score(prior, canvas, r_c, l_c) if prior is not None else float("nan")
    return film_cells(canvas, r_c, l_c, grid), score


def collect_normals(tasks: Sequence[StudyTask], spec: BackendSpec, config: IlsConfig, cap: int,
                    grid: tuple[int, int], progress: bool = False,
                    trim_with: NormativeModel | None = None) -> CohortNormals:
    """Up to ``cap`` report-normal studies with both lungs, in the seeded order (steps 1-3 of the module; the
    trim only with ``trim_with``, the shipped model); ``progress`` shows a bar of the films collected."""
    counts = {"visited": 0, "report_normal": 0}
    studies: list[str] = []
    cells: list[np.ndarray] = []
    trimmed: list[tuple[str, float]] = []
    with progress_bar(total=min(cap, len(tasks)), desc="normative fit", unit="film", progress=progress,
                      dynamic_ncols=True) as bar:
        for task in _report_normal_tasks(tasks, spec, config, counts):
            film = _canvas_cells(task, spec, config, grid, trim_with)
            if film is None:
                continue
            if trim_with is not None and not film[1] <= trim_with.zone_threshold:
                trimmed.append((task.study_key, round(film[1], 4)))
                continue
            studies.append(task.study_key)
            cells.append(film[0])
            bar.update(1)
            bar.set_postfix(visited=counts["visited"], refresh=False)
            if len(studies) >= cap:
                break
        bar.total = bar.n  # fewer report-normal films than the cap: the fit is complete all the same
        bar.set_postfix(visited=counts["visited"], refresh=False)
        bar.refresh()
    return CohortNormals(tuple(studies), tuple(cells), counts["visited"], counts["report_normal"], tuple(trimmed))


_TRIM_RULES: Final[dict[str, str]] = {
    "cohort": "cell film score (highest zone score) under the fit on all report-normal films above {:.4g}, "
              "highest first, keeping at least min_normals films",
    "prior": "film score (highest zone score) under normative_v1 above its zone threshold {:.4g}",
    "off": "no trim (threshold {:.4g} unused)",
}
#: ``trim`` values (step 3 of the module).
TRIM_MODES: Final[tuple[str, ...]] = ("cohort", "prior", "off")


def _fit(cells: Sequence[np.ndarray], prior: NormativeModel, shrink: bool) -> NormativeModel:
    model = fit_cells(list(cells), prior.zone_threshold)
    return shrink_toward(model, prior, len(cells)) if shrink else model


def trim_against_cohort(normals: CohortNormals, prior: NormativeModel, shrink: bool,
                        keep_at_least: int = 0) -> CohortNormals:
    """``normals`` without the films whose cell film score under the fit on all of them exceeds the prior's zone
    threshold (``trim=cohort``, one pass), highest score first, never below ``keep_at_least`` films; the films
    left out join ``trimmed``."""
    if len(normals.cells) < 3:
        return normals
    first = _fit(normals.cells, prior, shrink)
    scores = [first.cell_film_score(c) for c in normals.cells]
    flagged = sorted((i for i, v in enumerate(scores) if v > prior.zone_threshold), key=lambda i: -scores[i])
    drop = set(flagged[: max(0, len(scores) - max(keep_at_least, 3))])
    out = tuple((normals.studies[i], round(scores[i], 4)) for i in sorted(drop))
    return replace(normals, studies=tuple(k for i, k in enumerate(normals.studies) if i not in drop),
                   cells=tuple(c for i, c in enumerate(normals.cells) if i not in drop),
                   trimmed=normals.trimmed + out)


def fit_cohort_model(normals: CohortNormals, prior: NormativeModel, min_normals: int, shrink: bool,
                     settings: dict[str, Any], trim: str = "off") -> NormativeModel:
    """The cohort model (steps 3-4 of the module; ``trim=prior`` was applied when the films were collected), or
    ``prior`` with a note when there are too few films."""
    if trim not in TRIM_MODES:
        raise ConfigError(f"normative trim must be one of {', '.join(TRIM_MODES)}, got {trim!r}")
    if trim == "cohort":
        normals = trim_against_cohort(normals, prior, shrink, keep_at_least=min_normals)
    n = len(normals.studies)
    meta: dict[str, Any] = {"name": "normative_fitted", "studies": sorted(normals.studies), "films": n,
                            "visited": normals.visited, "report_normal": normals.report_normal, "settings": settings,
                            "prior": prior.meta.get("name", "normative_v1"),
                            "trimmed": {"films": len(normals.trimmed), "mode": trim,
                                        "rule": _TRIM_RULES[trim].format(prior.zone_threshold),
                                        "studies": [{"study": k, "film_score": v} for k, v in normals.trimmed]}}
    if n < max(min_normals, 3):
        note = (f"{n} report-normal studies with both lungs that look normal under normative_v1 "
                f"({len(normals.trimmed)} trimmed; fewer than min_normals={min_normals}): the shipped normative_v1 "
                "is used")
        return NormativeModel(prior.median, prior.scale, prior.zone_threshold,
                              {**meta, "source": "shipped (fallback)", "note": note,
                               "summary": f"shipped normative_v1 (fallback: {note})"})
    model = _fit(normals.cells, prior, shrink)
    source = "cohort, shrunk toward normative_v1" if shrink else "cohort"
    summary = (f"{n} report-normal studies of this build (of {normals.report_normal} report-normal among "
               f"{normals.visited} visited; {len(normals.trimmed)} trimmed as not normal under normative_v1), "
               "lungs from the build's segmenter, working canvas; "
               f"{'shrunk toward' if shrink else 'not blended with'} normative_v1; zone threshold of normative_v1")
    return NormativeModel(model.median, model.scale, prior.zone_threshold,
                          {**meta, **{k: v for k, v in model.meta.items() if k == "shrinkage"}, "source": source,
                           "summary": summary})


def _fitted_ready(path: Path) -> bool:
    """Both files of a fitted model are there (the sidecar, with the sha256, is written last)."""
    sidecar = path.with_suffix(".json")
    if not (path.is_file() and sidecar.is_file()):
        return False
    try:
        return bool(json.loads(sidecar.read_text(encoding="utf-8")).get("sha256"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def resolve_spec(spec: BackendSpec, tasks: Sequence[StudyTask], out: Path, config: IlsConfig,
                 progress: bool = False) -> BackendSpec:
    """``spec`` with a ``normative`` ``model=cohort`` synthesizer pointed at its fitted file (fitted now, with a
    progress bar when ``progress``, or the one a previous run of this build left in ``out``); any other spec
    unchanged."""
    from cxrground.ils.spatial import get_synthesizer
    from cxrground.ils.spatial.normative import COHORT, NormativeSynthesizer

    if spec.synthesizer != "normative":
        return spec
    synth = get_synthesizer(spec.synthesizer, **spec.synthesizer_kwargs)
    if not isinstance(synth, NormativeSynthesizer) or synth.model != COHORT:
        return spec
    path = out / FITTED_FILE
    if not _fitted_ready(path):
        prior = NormativeModel.load()
        settings = {"min_normals": synth.min_normals, "max_normals": synth.max_normals, "shrink": synth.shrink,
                    "trim": synth.trim, "seed": config.seed, "working_size": config.working_size}
        if synth.trim not in TRIM_MODES:
            raise ConfigError(f"normative trim must be one of {', '.join(TRIM_MODES)}, got {synth.trim!r}")
        normals = collect_normals(tasks, spec, config, synth.max_normals, prior.grid, progress,
                                  trim_with=prior if synth.trim == "prior" else None)
        fit_cohort_model(normals, prior, synth.min_normals, synth.shrink, settings, synth.trim).save(path)
    sha = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))["sha256"]
    return replace(spec, synthesizer_kwargs={**spec.synthesizer_kwargs, "fitted": str(path.resolve()),
                                             "sha256": sha})
