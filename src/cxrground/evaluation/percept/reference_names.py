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


#: Keys of the reply text recorded for a stage: cxrground's export keeps the raw reply beside the reference's
#: parsed answer (first key); the reference evaluator records the parsed answer only (second key).
_RESPONSE_KEYS: Final[dict[int, tuple[str, str]]] = {1: ("raw_response", "response"),
                                                    2: ("raw_responses", "responses"),
                                                    3: ("raw_responses", "responses"),
                                                    4: ("raw_responses", "responses")}


def recorded_response(record: dict[str, Any], stage: int, qid: str) -> str | None:
    """The response recorded in one case's ``record`` (an ``all_results.json`` value) for question ``qid`` of
    ``stage``: the raw reply where cxrground's export kept it, else the answer the reference evaluator recorded. A
    Stage-1 or Stage-2 block recorded empty (``{}``) is ``""``: the reference evaluator leaves the block empty when
    the reply parsed to nothing and goes on with the case (the question counts wrong). None when no answer is
    recorded (the stage is missing, a block holds no response, as an export writes a failed case, or a Stage-3/4
    question was not asked)."""
    block = record.get(REFERENCE_STAGE_KEYS[stage])
    if not isinstance(block, dict):
        return None
    raw_key, key = _RESPONSE_KEYS[stage]
    if stage <= 2:
        for source in (raw_key, key):
            if isinstance(block.get(source), str):
                return block[source]
        return None if block else ""  # an empty block: the reply parsed to nothing; a block without one: no answer
    name = REFERENCE_QUESTION_NAMES.get(qid, qid)
    for source in (raw_key, key):
        responses = block.get(source)
        if isinstance(responses, dict) and isinstance(responses.get(name), str):
            return responses[name]
    return None
