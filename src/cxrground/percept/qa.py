"""Assembly of one ``chexpercept.json`` entry (CHEXPERCEPT.md §3, §4, §12) from a planned case.

Every question string is ``format_question(stem, options)`` with vocab templates only. A *plan unit* is the
JSON-ready summary of a :class:`cxrground.percept.revision.RevisionPlan` written by the builder
(:func:`cxrground.percept.plans.plan_unit`); this module reads only its plain fields, so it works on cached
units too. Toolkit additions on every entry: ``case_id``, ``lesion``, ``qa_path``, ``image_size`` ``[H, W]``
and ``relative_path`` on ``detection_qa``. ``relative_path`` of the expansion question is the overlay with
points (shown in turn 3); the contraction question has no image of its own (turn 4). The ``answer_index`` and
``answer`` of the point questions name the GT points in GT order (component order, then step order, §4), as the
reference stores them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cxrground.vocab.percept_templates import (
    CONTRACTION,
    EXPANSION,
    NONE_OPTION,
    PATH_LESION_FREE,
    PATH_REVISION_FREE,
    PATH_REVISION_REQUIRED,
    POINT_OPTION,
    REVISION_RESULT,
    YES_NO,
    contour_eval_stem,
    detection_stem,
    format_question,
    initial_context,
    mask_options,
    point_options,
)
from cxrground.vocab.traits import traits

__all__ = ["CaseImages", "detection_qa", "lesion_free_case", "points_answer_text", "positive_case"]

_YES, _NO = 1, 2
_ANSWER_JOIN: Final[str] = ", "


@dataclass(frozen=True)
class CaseImages:
    """Benchmark-relative image paths of one case (neutral names, §10.3)."""

    stage1: str
    stage2: str | None = None
    stage3_points: str | None = None
    options: tuple[str, ...] = ()
    """The revision options' images (RR); empty: the options name no image (RF)."""


def _yes_no(stem: str, index: int) -> dict[str, Any]:
    return {"question": format_question(stem, YES_NO), "answer_options": list(YES_NO),
            "answer": YES_NO[index - 1], "answer_index": index}


def detection_qa(lesion: str, present: bool, relative_path: str) -> dict[str, Any]:
    """Stage 1: ``Yes`` (1) when the lesion is present, else ``No`` (2)."""
    qa = _yes_no(detection_stem(lesion), _YES if present else _NO)
    qa["relative_path"] = relative_path
    return qa


def _ids(lesion: str, pair_id: str, dicom_id: str, case_id: str, path: str, size: Sequence[int]) -> dict[str, Any]:
    return {"pair_id": pair_id, "dicom_id": dicom_id, "case_id": case_id, "lesion": lesion, "qa_path": path,
            "image_size": [int(size[0]), int(size[1])]}


def lesion_free_case(lesion: str, pair_id: str, dicom_id: str, case_id: str, image_size: Sequence[int],
                     images: CaseImages) -> dict[str, Any]:
    """An LF entry: detection (answer ``No``) and ids only."""
    return {"detection_qa": detection_qa(lesion, False, images.stage1),
            **_ids(lesion, pair_id, dicom_id, case_id, PATH_LESION_FREE, image_size)}


def points_answer_text(colors: Sequence[str]) -> str:
    """``{c1} point, {c2} point`` in GT order, or ``None``."""
    return _ANSWER_JOIN.join(POINT_OPTION.format(color=c) for c in colors) if colors else NONE_OPTION


def _points_qa(stem: str, unit: Mapping[str, Any], op: str, relative_path: str | None) -> dict[str, Any]:
    options = unit["point_options"]
    colors = [c for _, c in options]
    return {"question": format_question(stem, point_options(colors[:-1])),
            "answer_options": [{"point": None if p is None else [int(p[0]), int(p[1])], "color": c}
                               for p, c in options],
            "answer": points_answer_text(unit[f"{op}_colors"]),
            "answer_index": [int(i) for i in unit[f"{op}_answer"]],
            "relative_path": relative_path}


def positive_case(lesion: str, pair_id: str, dicom_id: str, case_id: str, path: str, image_size: Sequence[int],
                  unit: Mapping[str, Any], attributes: Mapping[str, Any] | None,
                  images: CaseImages) -> dict[str, Any]:
    """An RF or RR entry (RF entries carry the revision QAs too; they are not asked, and name no images when
    ``images`` has no Stage-3 paths)."""
    if path not in (PATH_REVISION_FREE, PATH_REVISION_REQUIRED):
        raise ValueError(f"positive cases are revision_free or revision_required, got {path!r}")
    rr = path == PATH_REVISION_REQUIRED
    eval_qa = _yes_no(contour_eval_stem(lesion), _YES if rr else _NO)
    eval_qa["relative_path"] = images.stage2
    mopts = unit["mask_options"]
    answer = int(unit["revision_answer"])
    texts = mask_options(len(mopts))
    revision = {"question": format_question(REVISION_RESULT, texts),
                "answer_options": [{"type": o["type"], "masks": list(o["masks"]), "relative_path": rel}
                                   for o, rel in zip(mopts, images.options or (None,) * len(mopts), strict=True)],
                "answer": texts[answer - 1], "answer_index": answer}
    contour = {
        "no_deformation": not rr,
        "initial_context": initial_context(lesion),
        "revision_before_masks": list(unit["revision_before_masks"]),
        "revision_after_masks": list(unit["revision_after_masks"]),
        "true_masks": {k: list(v) for k, v in unit["true_masks"].items()},
        "fake_masks": {k: list(v) for k, v in unit["fake_masks"].items()},
        "true_combination": list(unit["true_combination"]),
        "fake_combinations": [list(c) for c in unit["fake_combinations"]],
        "contour_eval_qa": eval_qa,
        "contour_revision_qa_expansion": _points_qa(EXPANSION.format(lesion=lesion), unit, "expansion",
                                                    images.stage3_points),
        "contour_revision_qa_contraction": _points_qa(CONTRACTION.format(lesion=lesion), unit, "contraction",
                                                      None),
        "contour_revision_qa_revision_result": revision,
    }
    return {"detection_qa": detection_qa(lesion, True, images.stage1), "contour_qa": contour,
            "attribute_extraction_qa": dict(attributes or {}) if traits(lesion).percept.attributes else None,
            **_ids(lesion, pair_id, dicom_id, case_id, path, image_size)}
