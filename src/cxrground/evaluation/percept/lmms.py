"""CheXpercept in lmms-eval: the functions of the task folder ``percept export --format lmms-eval`` writes.

The task reads the Hugging Face export (:mod:`cxrground.percept.export_hf`, one row per case) and runs each case
as lmms-eval's multi-round generation (``output_type: generate_until_multi_round``) with the harness's own
pieces, so that prompts, oracle settings, parsing and scoring are those of ``percept eval``:

- :func:`doc_to_messages` (chat models that implement multi-round generation: ``vllm_chat`` in lmms-eval
  0.7.3; its other chat adapters raise ``NotImplementedError`` for it): round ``k`` replays the case's
  :class:`~.conversation.Conversation` over the model's first ``k`` answers (each parsed and judged by
  :func:`~.runner.record_answer`, which drives the oracle of the setting) and returns
  :meth:`~.conversation.Conversation.next_request` as lmms-eval chat messages: the system prompt, every
  earlier turn re-sent with its images and the stored (or oracle-replaced) assistant text, then the current
  turn (text first, then its images, as PIL images from the row). After the last planned turn it returns the
  terminal signal.
- :func:`process_results`: replays the conversation over all answers into the ``results.jsonl`` record of
  ``percept eval`` (:func:`~.runner.case_record`); every metric receives it.
- :data:`METRICS` / :func:`aggregator`: each metric is one number of :func:`~.scoring.score_records` over all the
  records (the views of §15: End-to-End and Oracle-Passed accuracy per stage over all cases and per path,
  and mean depth per path; NaN where no case is asked the stage). Bootstrap CIs are not computed here
  (``percept score`` computes them from a run folder).
- :func:`doc_to_text` / :func:`doc_to_visual`: the first turn for lmms-eval's request building. lmms-eval's
  *simple* models get each later turn's text and images from ``doc_to_text`` but keep no history of their
  own, so they cannot run the sequential protocol; use a chat model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from cxrground.evaluation.percept.conversation import Conversation, plan_case
from cxrground.evaluation.percept.runner import case_record, record_answer
from cxrground.evaluation.percept.scoring import score_records
from cxrground.percept.export_hf import case_image_columns
from cxrground.percept.lmms_task import METRICS
from cxrground.percept.schema import Case

__all__ = ["METRICS", "aggregator", "conversation", "doc_to_messages", "doc_to_text", "doc_to_visual",
           "metric_value", "process_results", "score_samples"]

_VIEWS: Final[dict[str, str]] = {"e2e": "end_to_end", "oracle": "oracle_passed"}


def _case(doc: Mapping[str, Any]) -> tuple[str, Case]:
    return doc["key_id"], Case.model_validate(json.loads(doc["case_json"]))


def _images(doc: Mapping[str, Any], key: str, case: Case) -> dict[str, Any]:
    """Benchmark-relative image path -> the row's PIL image."""
    out: dict[str, Any] = {}
    for column, rel in case_image_columns(key, case).items():
        if isinstance(rel, list):
            out.update(zip(rel, doc[column], strict=True))
        elif rel is not None:
            out[rel] = doc[column]
    return out


def conversation(doc: Mapping[str, Any], oracle: str, answers: Sequence[str | None] = ()
                 ) -> tuple[Conversation, list[dict[str, Any]]]:
    """The case's conversation under ``oracle`` after ``answers`` (in turn order) and their parse records."""
    key, case = _case(doc)
    conv = Conversation(plan_case(key, case), oracle, image_url=str)  # image "URLs" stay benchmark paths
    meta = []
    for answer in answers[: len(conv.plan.questions)]:
        conv.next_request()  # applies the oracle of this turn, exactly as the harness does
        meta.append(record_answer(conv, answer))
    return conv, meta


def _chat(messages: Sequence[dict[str, Any]], images: Mapping[str, Any]) -> list[dict[str, Any]]:
    """OpenAI-format harness messages as lmms-eval chat messages (image paths -> PIL images)."""
    out = []
    for m in messages:
        if isinstance(m["content"], str):
            out.append({"role": m["role"], "content": [{"type": "text", "text": m["content"]}]})
            continue
        parts = []
        for part in m["content"]:
            if part["type"] == "text":
                parts.append({"type": "text", "text": part["text"]})
            else:
                parts.append({"type": "image", "url": images[part["image_url"]["url"]]})
        out.append({"role": m["role"], "content": parts})
    return out


def doc_to_messages(doc: Mapping[str, Any], oracle: str, round_idx: int | None = None,
                    previous_output: Sequence[str | None] | None = None, previous_round_info: Any = None) -> Any:
    """lmms-eval's multi-round ``doc_to_messages``: the messages of the next turn (module docstring)."""
    key, case = _case(doc)
    conv, _ = conversation(doc, oracle, previous_output or ())
    if conv.done:
        return None, True, list(previous_output or ()), previous_round_info
    messages = _chat(conv.next_request(), _images(doc, key, case))
    if round_idx is None:
        return messages
    return messages, False, list(previous_output or ()), previous_round_info


def doc_to_visual(doc: Mapping[str, Any]) -> list[Any]:
    """The first turn's image (the CXR)."""
    return [doc["image"]]


def doc_to_text(doc: Mapping[str, Any], lmms_eval_specific_kwargs: Mapping[str, Any] | None = None,
                previous_output: Sequence[str | None] | None = None, round_idx: int | None = None,
                previous_round_info: Any = None) -> Any:
    """The first turn's text; for later rounds (simple models) ``(images, text, done, outputs, info)`` of the
    current turn alone (no history: not the benchmark's protocol, module docstring)."""
    oracle = (lmms_eval_specific_kwargs or {}).get("oracle", "none")
    key, case = _case(doc)
    conv, _ = conversation(doc, oracle, previous_output or ())
    if round_idx is None:
        return conv.plan.questions[0].user_text()
    if conv.done:
        return None, None, True, list(previous_output or ()), previous_round_info
    last = conv.next_request()[-1]["content"]
    images = _images(doc, key, case)
    return ([images[p["image_url"]["url"]] for p in last if p["type"] == "image_url"], last[0]["text"], False,
            list(previous_output or ()), previous_round_info)


def _answers(results: Sequence[Any]) -> list[str | None]:
    """The per-round answers of one doc from lmms-eval's results (a list of rounds, possibly wrapped once)."""
    rounds: Any = results
    if len(rounds) == 1 and isinstance(rounds[0], list | tuple):
        rounds = rounds[0]
    return [r if r is None else str(r) for r in rounds]


def process_results(doc: Mapping[str, Any], results: Sequence[Any], oracle: str = "none") -> dict[str, Any]:
    """The ``percept eval`` result record of the case (answers in turn order), under every metric name."""
    answers = _answers(results)
    conv, meta = conversation(doc, oracle, answers)
    full = [{**m, "usage": {}, "model_version": None, "cached": False, "attempts": 1, "latency_s": None}
            for m in meta]
    error = None if conv.done else f"the model answered {len(meta)} of {len(conv.plan.questions)} turns"
    record = case_record(conv.plan, conv, full, error, 0.0)
    return dict.fromkeys(METRICS, record)


def score_samples(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """:func:`~.scoring.score_records` of the records :func:`process_results` made (no bootstrap)."""
    plans = [{"case_id": r["case_id"], "path": r["path"], "lesion": r["lesion"],
              "questions": [{k: q[k] for k in ("qid", "stage", "gt", "n_options", "multi")} for q in r["questions"]]}
             for r in records]
    return score_records(plans, {r["case_id"]: dict(r) for r in records}, n_boot=0)


def metric_value(score: Mapping[str, Any], metric: str) -> float:
    """One metric of :data:`METRICS` from a score (NaN where no case is asked it)."""
    parts = metric.split("_")
    if parts[-1] == "depth":
        block = score["paths"].get(parts[0])
        return float("nan") if block is None else float(block["depth"]["mean"])
    view, stage = _VIEWS[parts[-2]], parts[-1]
    block = score["overall"] if len(parts) == 2 else score["paths"].get(parts[0])
    acc = None if block is None else block[view][stage]["acc"]
    return float("nan") if acc is None else float(acc)


def aggregator(metric: str) -> Callable[[Sequence[Mapping[str, Any]]], float]:
    """lmms-eval aggregation of ``metric``: score all the records, return that number."""
    if metric not in METRICS:
        raise ValueError(f"unknown CheXpercept metric {metric!r}")

    def aggregate(records: Sequence[Mapping[str, Any]]) -> float:
        return metric_value(score_samples(records), metric)

    aggregate.__name__ = f"agg_{metric}"
    return aggregate
