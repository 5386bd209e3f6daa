"""``cxrground percept export --format hf``: a CheXpercept benchmark as a Hugging Face dataset (Parquet + card).

One row per case (one CXR × one lesion × one conversation), split ``test``, config ``default``. Columns:

- the case: ``key_id``, ``case_id``, ``pair_id``, ``dicom_id``, ``lesion``, ``qa_path`` (§1.3, derived when the
  file has none), ``image_size`` (``[H, W]``, read from the CXR when the file records none), ``initial_context``
  (Stage 3a's context; empty for LF);
- the images (:data:`IMAGE_COLUMNS`, ``Image`` features, the PNG bytes as stored): ``image`` (the CXR, Stage 1),
  ``contour_overlay`` (Stage 2), ``points_overlay`` (Stage 3a), ``revision_options`` (Stage 3c, one per option,
  in option order); None / empty where the case does not ask the question (an RF case's revision QAs are not
  asked, and a benchmark in the reference pipeline's layout names option files of RF cases that do not exist);
- per question (:data:`QUESTIONS`): ``{q}_question``, ``{q}_options`` (option texts; point options by colour,
  revision options by number), ``{q}_answer`` and ``{q}_answer_index`` (a list; single-answer questions hold
  one index); empty where the case does not hold the question;
- the attributes behind the answers: ``no_deformation``, ``revision_before_masks``, ``revision_after_masks``,
  ``true_combination`` (Stages 2-3), ``distribution_answer_zones``, ``location_answer_zones``,
  ``severity_overlap_ratio``, ``severity_selected_lung``, ``comparison_left_size`` / ``_right_size`` /
  ``_left_has_overlap`` / ``_right_has_overlap`` (Stage 4);
- ``case_json``: the whole case as in ``chexpercept.json`` (every attribute, the masks' provenance), so that
  :func:`benchmark_json_from_rows` gives the benchmark JSON back exactly.

:func:`case_image_columns` maps a case's image paths to these columns: the lmms-eval task
(:mod:`cxrground.percept.lmms_task`) finds each turn's images through it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from cxrground.errors import InputError
from cxrground.io.export_dir import export_folder
from cxrground.io.hf import HF_NAMES, image_cell, require_datasets, write_card, write_splits
from cxrground.percept.paths import check_export_target
from cxrground.percept.schema import BENCHMARK_FILE, Benchmark, Case, case_path, load_benchmark, with_root_paths

__all__ = ["IMAGE_COLUMNS", "QUESTIONS", "SPLIT", "benchmark_json_from_rows", "case_image_columns",
           "case_row", "export_hf", "load_for_export", "percept_features", "write_hf"]

#: The one split of an exported benchmark.
SPLIT: Final[str] = "test"
IMAGE_COLUMNS: Final[tuple[str, ...]] = ("image", "contour_overlay", "points_overlay", "revision_options")
#: List fields of ``contour_qa`` kept as columns (the masks behind the revision options).
_CONTOUR_LISTS: Final[tuple[str, ...]] = ("revision_before_masks", "revision_after_masks", "true_combination")
QUESTIONS: Final[tuple[str, ...]] = ("detection", "contour_eval", "expansion", "contraction", "revision_result",
                                     "distribution", "location", "severity", "comparison")


def percept_features() -> Any:
    """The :class:`datasets.Features` of a case row (module docstring)."""
    d = require_datasets()
    string = d.Value("string")
    questions: dict[str, Any] = {}
    for q in QUESTIONS:
        questions |= {f"{q}_question": string, f"{q}_options": d.List(string), f"{q}_answer": string,
                      f"{q}_answer_index": d.List(d.Value("int32"))}
    return d.Features({
        "key_id": string, "case_id": string, "pair_id": string, "dicom_id": string, "lesion": string,
        "qa_path": string, "image_size": d.List(d.Value("int32")), "initial_context": string,
        "no_deformation": d.Value("bool"), **{c: d.List(string) for c in _CONTOUR_LISTS},
        "distribution_answer_zones": d.List(string), "location_answer_zones": d.List(string),
        "severity_overlap_ratio": d.Value("float64"), "severity_selected_lung": string,
        "comparison_left_size": d.Value("float64"), "comparison_right_size": d.Value("float64"),
        "comparison_left_has_overlap": d.Value("bool"), "comparison_right_has_overlap": d.Value("bool"),
        "image": d.Image(), "contour_overlay": d.Image(), "points_overlay": d.Image(),
        "revision_options": d.List(d.Image()), **questions, "case_json": string,
    })


def case_image_columns(key: str, case: Case) -> dict[str, str | list[str] | None]:
    """Benchmark-relative image path(s) of each image column of ``case`` (either layout): the images of the
    questions the case asks; an RF case's revision QAs are not asked (§12), so it has no ``points_overlay`` and no
    ``revision_options`` even where its JSON names them (the reference pipeline names option files it never
    renders)."""
    case = with_root_paths(key, case)
    cq = case.contour_qa
    asked = cq is not None and not cq.no_deformation
    exp = cq.contour_revision_qa_expansion if cq is not None and asked else None
    rev = cq.contour_revision_qa_revision_result if cq is not None and asked else None
    return {"image": case.detection_qa.relative_path,
            "contour_overlay": cq.contour_eval_qa.relative_path if cq is not None else None,
            "points_overlay": exp.relative_path if exp is not None else None,
            "revision_options": [o.relative_path for o in rev.answer_options if o.relative_path is not None]
            if rev is not None else []}


def _indices(value: int | list[int]) -> list[int]:
    return list(value) if isinstance(value, list) else [int(value)]


def _question_columns(case: Case) -> dict[str, Any]:
    """``{q}_question/_options/_answer/_answer_index`` of every question the case holds (None/[] otherwise)."""
    found: dict[str, Any] = {"detection": case.detection_qa}
    cq = case.contour_qa
    if cq is not None:
        found |= {"contour_eval": cq.contour_eval_qa, "expansion": cq.contour_revision_qa_expansion,
                  "contraction": cq.contour_revision_qa_contraction,
                  "revision_result": cq.contour_revision_qa_revision_result}
    attrs = case.attribute_extraction_qa
    if attrs is not None:
        found |= {q: getattr(attrs, q) for q in ("distribution", "location", "severity", "comparison")}
    out: dict[str, Any] = {}
    for q in QUESTIONS:
        item = found.get(q)
        if item is None:
            out |= {f"{q}_question": None, f"{q}_options": [], f"{q}_answer": None, f"{q}_answer_index": []}
            continue
        if q in ("expansion", "contraction"):
            options = [o.color for o in item.answer_options]
        elif q == "revision_result":
            options = [str(k) for k in range(1, len(item.answer_options) + 1)]
        else:
            options = list(item.answer_options)
        out |= {f"{q}_question": item.question, f"{q}_options": options, f"{q}_answer": str(item.answer),
                f"{q}_answer_index": _indices(item.answer_index)}
    return out


def _attribute_columns(case: Case) -> dict[str, Any]:
    """The contour and Stage-4 attributes beyond question and answer (None / [] where the case has none)."""
    cq, attrs = case.contour_qa, case.attribute_extraction_qa
    out: dict[str, Any] = {"no_deformation": cq.no_deformation if cq is not None else None,
                           **{c: list(getattr(cq, c)) if cq is not None else [] for c in _CONTOUR_LISTS}}
    if attrs is None:
        return out | {"distribution_answer_zones": [], "location_answer_zones": [], "severity_overlap_ratio": None,
                      "severity_selected_lung": None, "comparison_left_size": None, "comparison_right_size": None,
                      "comparison_left_has_overlap": None, "comparison_right_has_overlap": None}
    c = attrs.comparison
    return out | {"distribution_answer_zones": list(attrs.distribution.answer_zones),
                  "location_answer_zones": list(attrs.location.answer_zones),
                  "severity_overlap_ratio": attrs.severity.overlap_ratio,
                  "severity_selected_lung": attrs.severity.selected_lung, "comparison_left_size": c.left_size,
                  "comparison_right_size": c.right_size, "comparison_left_has_overlap": c.left_has_overlap,
                  "comparison_right_has_overlap": c.right_has_overlap}


def _image_hw(root: Path, rel: str | list[str] | None) -> list[int]:
    """``[H, W]`` of the benchmark image ``rel`` read from its file ([] when the case names none)."""
    from PIL import Image

    if not isinstance(rel, str):
        return []
    path = root / rel
    try:
        with Image.open(path) as im:
            return [im.height, im.width]
    except (OSError, ValueError) as exc:
        raise InputError(f"unreadable image ({exc})", path) from exc


def case_row(key: str, case: Case, raw: Mapping[str, Any], root: Path) -> dict[str, Any]:
    """The row of one case (``raw``: its entry as stored in ``chexpercept.json``)."""
    def cell(rel: str | None) -> dict[str, Any] | None:
        if rel is None:
            return None
        path = root / rel
        if not path.is_file():
            raise InputError(f"case {key}: image {rel} does not exist", path)
        return image_cell(path)

    images = case_image_columns(key, case)
    revision = images["revision_options"]
    assert isinstance(revision, list)
    return {"key_id": key, "case_id": case.case_id, "pair_id": case.pair_id, "dicom_id": case.dicom_id,
            "lesion": case.lesion_of(key), "qa_path": case.qa_path or case_path(case),
            "image_size": list(case.image_size) if case.image_size else _image_hw(root, images["image"]),
            "initial_context": case.contour_qa.initial_context if case.contour_qa is not None else None,
            **{c: cell(images[c]) for c in ("image", "contour_overlay", "points_overlay")},  # type: ignore[arg-type]
            "revision_options": [cell(p) for p in revision], **_question_columns(case), **_attribute_columns(case),
            "case_json": json.dumps(raw, ensure_ascii=False, sort_keys=True)}


def benchmark_json_from_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``chexpercept.json`` object (``{key_id: case}``, as stored) of exported rows."""
    return {r["key_id"]: json.loads(r["case_json"]) for r in rows}


def _card_body(bench: Path, n: int, paths: dict[str, int]) -> str:
    counts = ", ".join(f"{p}: {c}" for p, c in sorted(paths.items()))
    return f"""# CheXpercept benchmark

Multi-stage perception questions on chest X-rays (detection, contour evaluation, contour revision, attribute
extraction), exported with `cxrground percept export --format hf` from `{bench.name}`: {n} cases ({counts}).

## How it was built

`cxrground percept build` made the cases from an ILS dataset (see the source benchmark's `card.md` for the
sources, the deformer and the validation); this export writes one row per case with the images of every stage
(`image`, `contour_overlay`, `points_overlay`, `revision_options`, PNG bytes as stored), the question, options
and answer of every question as columns, and the whole case as `case_json` (the benchmark JSON is recovered
exactly with `cxrground.percept.export_hf.benchmark_json_from_rows`).

Ask the questions as a conversation, in the order and with the oracle settings of the benchmark: the
`cxrground percept eval` harness, or the lmms-eval task `cxrground percept export --format lmms-eval` writes.

## Load

```python
from datasets import load_dataset
ds = load_dataset("parquet", data_files={{"test": "data/test-*.parquet"}})["test"]
case = ds[0]  # case["image"]: PIL image; case["detection_question"], case["detection_answer"]
```

## Licence

Fill in the `license` field above with the licence of the source images and reports before publishing.
"""


def load_for_export(bench: str | Path, out: Path, validate: bool) -> tuple[Benchmark, list[str]]:
    """The benchmark folder ``bench`` (either layout) and the notes of the check before an export to ``out``: the
    checks of :func:`cxrground.percept.export.export_benchmark` (``validate``: ``bench`` must pass ``percept
    validate``)."""
    from cxrground.percept.validate import require_valid

    benchmark: Benchmark = load_benchmark(bench)
    assert benchmark.root is not None
    check_export_target(benchmark.root, out)
    return benchmark, list(require_valid(benchmark.root)) if validate else []


def write_hf(benchmark: Benchmark, dest: Path, shard_rows: int = 500, arrow: bool = False) -> dict[str, Any]:
    """Write the Parquet shards and the card of ``benchmark`` into the folder ``dest``; returns the split record."""
    root = benchmark.root
    assert root is not None
    raw = json.loads((root / BENCHMARK_FILE).read_text(encoding="utf-8"))
    keys = sorted(benchmark.cases)
    features = percept_features()
    paths: dict[str, int] = {}
    for k in keys:
        c = benchmark.cases[k]
        p = c.qa_path or case_path(c)
        paths[p] = paths.get(p, 0) + 1

    def rows() -> Iterable[dict[str, Any]]:
        return (case_row(k, benchmark.cases[k], raw[k], root) for k in keys)

    info = write_splits(dest, features, {SPLIT: (len(keys), rows)}, shard_rows, arrow)
    write_card(dest, features, info, "CheXpercept benchmark", _card_body(root, len(keys), paths),
               tags=("medical", "chest-x-ray", "visual-question-answering", "benchmark"))
    return info


def export_hf(bench: str | Path, out: str | Path, *, shard_rows: int = 500, arrow: bool = False,
              validate: bool = True, overwrite: bool = False) -> dict[str, Any]:
    """Write the benchmark folder ``bench`` (either layout) as a Hugging Face dataset in ``out``; returns the
    split record ``{"test": {num_examples, num_bytes, shards}}``, the case count and ``notes`` from the check
    before it (:func:`load_for_export`). ``out`` must be empty or, with ``overwrite``, hold an earlier hf export,
    which is replaced (:mod:`cxrground.io.export_dir`)."""
    out = Path(out)
    benchmark, notes = load_for_export(bench, out, validate)
    with export_folder(out, overwrite, HF_NAMES, "hf") as stage:
        info = write_hf(benchmark, stage, shard_rows, arrow)
    return {"splits": info, "cases": len(benchmark.cases), "notes": notes}
