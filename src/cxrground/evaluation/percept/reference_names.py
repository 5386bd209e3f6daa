"""The names the reference repository's evaluator gives stages and questions in its ``all_results.json``, and the
raw responses it recorded there (shared by the export of runs in that layout and the ``replay:`` client)."""

from __future__ import annotations

from typing import Any, Final

from cxrground.percept.schema import SEVERITY_KEY

__all__ = ["REFERENCE_QUESTION_NAMES", "REFERENCE_STAGE_KEYS", "recorded_response"]

#: Reference stage keys of the stage numbers.
REFERENCE_STAGE_KEYS: Final[dict[int, str]] = {1: "detection_qa", 2: "contour_evaluation_qa",
                                               3: "contour_revision_qa", 4: "attribute_extraction_qa"}
#: Reference names of the questions whose name differs from the harness's question id (also the reference CSVs').
REFERENCE_QUESTION_NAMES: Final[dict[str, str]] = {"severity": SEVERITY_KEY}


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
