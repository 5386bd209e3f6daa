"""``cxrground percept export --layout reference``: a benchmark in the reference repository's layout.

The reference evaluator (its Stage 03) reads ``BENCH/chexpercept.json`` and finds the images by fixed names
under ``BENCH/chexpercept/<key_id>/`` (:mod:`cxrground.percept.schema`, reference layout)::

    chexpercept.json
    chexpercept/<key_id>/detection_qa/xray.png                                    every case
    chexpercept/<key_id>/contour_qa/contour_eval_qa/xray_with_mask.png            RF, RR
    chexpercept/<key_id>/contour_qa/contour_revision_qa/xray_with_mask_and_points.png      RR (RF: when built)
    chexpercept/<key_id>/contour_qa/contour_revision_qa/option_<k>.png                     RR (RF: when built)

The export copies every image byte for byte and rewrites the JSON's image paths to that layout:
``contour_eval_qa.relative_path`` becomes ``contour_eval_qa/xray_with_mask.png`` (relative to ``contour_qa/``),
each revision option's ``relative_path`` becomes ``option_<k>.png`` (relative to ``contour_revision_qa/``), and
the toolkit's own root-relative paths (``detection_qa`` and the expansion / contraction ``relative_path``) are
left out, which is how a reader tells the layout apart. Everything else is kept, with the attribute key
``severity/measurement`` (§12). ``card.md`` is copied and ``MANIFEST.sha256`` rewritten, so
``cxrground percept validate`` and ``percept eval`` read the export like the original.

Names (choice): the option files are neutral (``option_<k>.png``; the reference's ``option_<k>_mask_answer.png``
/ ``_fake.png`` would reveal the answer and its evaluator reads option names from the JSON anyway). The case
folders are the JSON keys, as the reference requires; a ``key_id`` contains the source ``pair_id``, whose
``positive`` / ``negative`` reveals the detection answer to anyone who can read the paths (validate reports
this). ``neutral_keys=True`` keys the export by ``{lesion}_{case_id}`` instead (the lesion prefix is kept: the
reference's analysis gives cardiomegaly its extra depth by the ``cardiomegaly_`` prefix; a case without
``case_id``, as the reference pipeline writes them, gets :func:`neutral_id` of its key); the original ``key_id``
stays recoverable from ``pair_id`` in the JSON.

Checks first (every export format): the export folder is neither the benchmark folder, nor inside it, nor holding
it (:func:`~cxrground.percept.paths.check_export_target`); OUT is empty, or with ``overwrite`` holds an earlier
export that is replaced (:mod:`cxrground.io.export_dir`: written in a staging folder, moved into place when
complete); and, unless ``validate=False``, the benchmark passes
``percept validate`` (:func:`~cxrground.percept.validate.require_valid`), so that an export never publishes a
benchmark whose images are unreadable or whose files no longer match its manifest.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError, InputError
from cxrground.io.export_dir import check_export_out, export_folder
from cxrground.io.files import sha256_bytes
from cxrground.percept.layout import CARD_FILE, MANIFEST_FILE
from cxrground.percept.manifest import manifest_lines
from cxrground.percept.paths import check_export_target
from cxrground.percept.schema import (
    BENCHMARK_FILE,
    REFERENCE_CONTOUR_DIR,
    REFERENCE_CXR,
    REFERENCE_IMAGE_DIR,
    REFERENCE_OVERLAY,
    REFERENCE_POINTS,
    REFERENCE_REVISION_DIR,
    Benchmark,
    Case,
    load_benchmark,
)

__all__ = ["LAYOUTS", "REFERENCE_NAMES", "ExportSummary", "export_benchmark", "neutral_id", "reference_case"]

#: Layouts ``percept export`` writes.
LAYOUTS: Final[tuple[str, ...]] = ("reference",)
_OPTION: Final[str] = "option_{k}.png"
#: What a reference-layout export writes at its top (what ``overwrite`` may replace).
REFERENCE_NAMES: Final[tuple[str, ...]] = (BENCHMARK_FILE, REFERENCE_IMAGE_DIR, CARD_FILE, MANIFEST_FILE)
_TOP_LEVEL_OPTIONAL: Final[tuple[str, ...]] = ("contour_qa", "case_id", "lesion", "qa_path", "image_size")


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote: the folder, the number of cases and of images; ``notes`` from the check before it."""

    out_dir: str
    layout: str
    cases: int
    images: int
    notes: tuple[str, ...] = ()


def neutral_id(key: str) -> str:
    """The neutral id of a case that records no ``case_id`` (a benchmark the reference pipeline wrote):
    ``c`` + the first 12 hex digits of the SHA-256 of its key, which reveals no answer."""
    return "c" + sha256_bytes(key.encode("utf-8"))[:12]


def _export_key(key: str, case: Case, neutral_keys: bool) -> str:
    if not neutral_keys:
        return key
    return f"{case.lesion_of(key)}_{case.case_id or neutral_id(key)}"


def reference_case(key: str, case: Case) -> tuple[dict[str, Any], list[tuple[str, str, bool]]]:
    """The JSON entry of ``case`` in the reference layout and its images as ``(source path, target path,
    asked)``, paths relative to their benchmark folders (``key``: the case's folder name in the export;
    ``asked``: shown to a model, so it must exist; the unasked revision images of an RF case are optional)."""
    base = f"{REFERENCE_IMAGE_DIR}/{key}"
    entry = case.model_dump(by_alias=True, exclude_none=False)
    entry["detection_qa"].pop("relative_path", None)
    if case.detection_qa.relative_path is None:
        raise InputError(f"case {key}: detection_qa names no image")
    images = [(case.detection_qa.relative_path, f"{base}/{REFERENCE_CXR}", True)]
    cq = case.contour_qa
    if cq is not None:
        contour = entry["contour_qa"]
        images.append((cq.contour_eval_qa.relative_path, f"{base}/{REFERENCE_CONTOUR_DIR}/{REFERENCE_OVERLAY}",
                       True))
        asked = not cq.no_deformation
        contour["contour_eval_qa"]["relative_path"] = REFERENCE_OVERLAY
        for name in ("contour_revision_qa_expansion", "contour_revision_qa_contraction"):
            if contour.get(name) is not None:
                contour[name].pop("relative_path", None)
        exp = cq.contour_revision_qa_expansion
        if exp is not None and exp.relative_path is not None:
            images.append((exp.relative_path, f"{base}/{REFERENCE_REVISION_DIR}/{REFERENCE_POINTS}", asked))
        rev = cq.contour_revision_qa_revision_result
        if rev is not None:
            for k, (option, out) in enumerate(zip(rev.answer_options, contour["contour_revision_qa_revision_result"]
                                                  ["answer_options"], strict=True), start=1):
                if option.relative_path is None:  # an RF case's unasked option, not rendered: no file to name
                    out["relative_path"] = None
                    continue
                out["relative_path"] = _OPTION.format(k=k)
                images.append((option.relative_path, f"{base}/{REFERENCE_REVISION_DIR}/{_OPTION.format(k=k)}",
                               asked))
    for name in _TOP_LEVEL_OPTIONAL:
        if entry.get(name) is None:
            entry.pop(name, None)
    if cq is None:
        entry.pop("attribute_extraction_qa", None)  # §12: a lesion-free case holds no attribute QAs
    return entry, images


def export_benchmark(bench: str | Path, out: str | Path, layout: str = "reference", *, neutral_keys: bool = False,
                     overwrite: bool = False, validate: bool = True) -> ExportSummary:
    """Write the benchmark folder ``bench`` (either layout) to ``out`` in ``layout`` (module docstring); with
    ``validate``, a benchmark that ``percept validate`` rejects is refused (:class:`InputError` listing why)."""
    from cxrground.percept.validate import require_valid

    if layout not in LAYOUTS:
        raise ConfigError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    src, out = Path(bench), Path(out)
    benchmark: Benchmark = load_benchmark(src)
    root = benchmark.root
    assert root is not None
    check_export_target(root, out)
    notes = tuple(require_valid(root)) if validate else ()
    check_export_out(out, overwrite, REFERENCE_NAMES, "reference-layout")
    entries: dict[str, dict[str, Any]] = {}
    copies: list[tuple[Path, str]] = []
    for key, case in benchmark.cases.items():
        new_key = _export_key(key, case, neutral_keys)
        if new_key in entries:
            raise InputError(f"two cases map to the export key {new_key}", root / BENCHMARK_FILE)
        entries[new_key], images = reference_case(new_key, case)
        for rel_src, rel_dst, asked in images:
            source = root / rel_src
            if source.is_file():
                copies.append((source, rel_dst))
            elif asked:
                raise InputError(f"case {key}: image {rel_src} does not exist", source)
    with export_folder(out, overwrite, REFERENCE_NAMES, "reference-layout") as stage:
        for source, rel_dst in copies:
            target = stage / rel_dst
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        (stage / BENCHMARK_FILE).write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
        if (root / CARD_FILE).is_file():
            shutil.copyfile(root / CARD_FILE, stage / CARD_FILE)
        (stage / MANIFEST_FILE).write_text("".join(line + "\n" for line in manifest_lines(stage)), encoding="utf-8")
    return ExportSummary(str(out), layout, len(entries), len(copies), notes)
