"""The names the reference repository's evaluator gives stages and questions in its ``all_results.json``, and the
raw responses it recorded there (shared by the export of runs in that layout and the ``replay:`` client)."""

from __future__ import annotations

from typing import Any, Final

from cxrground.percept.schema import SEVERITY_KEY

__all__ = ["REFERENCE_QUESTION_NAMES", "REFERENCE_STAGE_KEYS", "recorded_ground_truth", "recorded_response"]

#: Reference stage keys of the stage numbers.
REFERENCE_STAGE_KEYS: Final[dict[int, str]] = {1: "detection_qa", 2: "contour_evaluation_qa",
                                               3: "contour_revision_qa", 4: "attribute_extraction_qa"}
#: Reference names of the questions whose name differs from the harness's question id (also the reference CSVs').
REFERENCE_QUESTION_NAMES: Final[dict[str, str]] = {"severity": SEVERITY_KEY}


def recorded_ground_truth(record: dict[str, Any], stage: int, qid: str) -> tuple[int, ...] | None:
    """The ground truth the reference evaluator recorded in one case's ``record`` for question ``qid`` of ``stage``,
    as sorted option indices; None when it recorded none or none that reads as indices."""
    block = record.get(REFERENCE_STAGE_KEYS[stage])
    if not isinstance(block, dict):
        return None
    value = block.get("ground_truth")
    if stage >= 3:
        value = value.get(REFERENCE_QUESTION_NAMES.get(qid, qid)) if isinstance(value, dict) else None
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        return None
    return tuple(sorted(items))


def recorded_response(record: dict[str, Any], stage: int, qid: str) -> str | None:
    """The raw response the reference evaluator recorded in one case's ``record`` (an ``all_results.json`` value)
    for question ``qid`` of ``stage``; None when it recorded none (the question was not asked, or the stage is
    missing)."""
    block = record.get(REFERENCE_STAGE_KEYS[stage])
    if not isinstance(block, dict):
        return None
    if stage == 1:
        value = block.get("response")
    elif stage == 2:
        value = block.get("responses")
    else:
        responses = block.get("responses")
        value = responses.get(REFERENCE_QUESTION_NAMES.get(qid, qid)) if isinstance(responses, dict) else None
    return value if isinstance(value, str) else None
