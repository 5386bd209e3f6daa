"""Evaluation runs in the reference repository's result layout, for its analysis scripts.

The reference evaluator writes one ``all_results.json`` per model and oracle setting, under
``<provider>_<model>/oracle_<setting>/``, and its analyzer (``01_analyze_model_performance.py``) reads only that
file. :func:`export_results` writes a cxrground run (``percept eval --out RUN``) in that form, so the reference's
analysis and plots run on cxrground runs. Per case (keyed by the benchmark's case id, the reference ``key_id``):
``qa_path``; per asked stage its ``correct`` flag, the answer string(s) the reference's first parsing pass makes of
the replies (``response`` / ``responses``, what the reference evaluator records) and the ground-truth index (an int,
a list for the multi-select questions), as the reference evaluator records them, plus the raw replies
(``raw_response`` / ``raw_responses``, which the reference's scripts do not read; a null reply is written as the
empty string it is scored as, a question left unanswered as null); the Stage-3 and Stage-4
sub-questions under their reference names (``expansion``, ``severity/measurement`` ...) with their own ``correct``.
Correctness is cxrground's scoring (:func:`~cxrground.evaluation.percept.scoring.case_view`): a failed or missing
case has every asked stage wrong and stays in the file, where the reference evaluator would leave a stage it got no
answer for out of its denominators. The reference's ``chat_history`` is not written (the run keeps every turn in
``results.jsonl``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError
from cxrground.evaluation.percept.conversation import ATTRIBUTE_QIDS, REVISION_QIDS
from cxrground.evaluation.percept.parsing import reference_answer_text
from cxrground.evaluation.percept.reference_names import REFERENCE_STAGE_KEYS
from cxrground.evaluation.percept.scoring import CSV_PATH_NAMES, CSV_QUESTION_NAMES, case_view, run_records
from cxrground.io.files import atomic_write_text

__all__ = ["REFERENCE_RESULTS_FILE", "export_results", "reference_folder", "reference_results"]

REFERENCE_RESULTS_FILE: Final[str] = "all_results.json"
#: Reference provider names of the model-spec prefixes (`hf:` and `ils:` models run locally: "opensource").
_PROVIDERS: Final[dict[str, str]] = {"hf": "opensource", "ils": "opensource"}


def reference_folder(model: str, oracle: str) -> str:
    """``<provider>_<model>/oracle_<setting>``, where the reference analyzer looks for a model's results: the model
    spec's prefix as provider (``hf:`` / ``ils:`` → ``opensource``; a built-in baseline → ``dummy``) and the rest of
    the spec (a folder's name for a path) with characters other than letters, digits, ``.`` and ``-`` as ``-``."""
    prefix, sep, name = model.partition(":")
    provider = _PROVIDERS.get(prefix, prefix) if sep else "dummy"
    name = name if sep else model
    if sep and prefix in _PROVIDERS:
        name = Path(name.rstrip("/\\")).name or name
        name = f"ils-{name}" if prefix == "ils" else name
    safe = re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-") or "model"
    provider = re.sub(r"[^A-Za-z0-9.-]+", "-", provider).strip("-") or "model"
    return f"{provider}_{safe}/oracle_{oracle}"


def _gt(question: dict[str, Any]) -> Any:
    """The reference's ground truth: the index, or the list of indices of a multi-select question."""
    gt = list(question["gt"])
    return gt if question["multi"] else gt[0]


def _parsed(text: str | None) -> str | None:
    """The answer string the reference evaluator records for a reply (its first parsing pass); None for no reply."""
    return None if text is None else reference_answer_text(text)


def _reply(question: dict[str, Any]) -> str | None:
    """The reply recorded for one question of a result record: its text; ``""`` for a null reply (scored as an
    unparseable answer, as an empty one, and the case went on); None for a question left unanswered (``failed``)."""
    raw = question.get("raw")
    if isinstance(raw, str):
        return raw
    return None if question.get("label", "failed") == "failed" else ""


def _case(plan: dict[str, Any], rec: dict[str, Any] | None) -> dict[str, Any]:
    """One case in the reference evaluator's record form."""
    view = case_view(plan, rec)
    raw = {q["qid"]: _reply(q) for q in (rec or {}).get("questions", [])}
    out: dict[str, Any] = {"key_id": plan["case_id"], "qa_path": CSV_PATH_NAMES[plan["path"]]}
    by_stage: dict[int, list[dict[str, Any]]] = {}
    for q in view["questions"]:
        by_stage.setdefault(q["stage"], []).append(q)
    for stage, questions in sorted(by_stage.items()):
        key = REFERENCE_STAGE_KEYS[stage]
        if stage <= 2:
            (q,) = questions
            text = raw.get(q["qid"])
            name = "response" if stage == 1 else "responses"
            out[key] = {name: _parsed(text), "ground_truth": _gt(q), "correct": q["correct"], f"raw_{name}": text}
        else:
            order = REVISION_QIDS if stage == 3 else ATTRIBUTE_QIDS
            asked = sorted(questions, key=lambda q: order.index(q["qid"]))
            names = {q["qid"]: CSV_QUESTION_NAMES.get(q["qid"], q["qid"]) for q in asked}
            block: dict[str, Any] = {"responses": {names[q["qid"]]: _parsed(raw.get(q["qid"])) for q in asked},
                                     "ground_truth": {names[q["qid"]]: _gt(q) for q in asked},
                                     "correct": view["raw"][stage],
                                     "raw_responses": {names[q["qid"]]: raw.get(q["qid"]) for q in asked}}
            for q in asked:
                block[names[q["qid"]]] = {"correct": q["correct"]}
            out[key] = block
    return out


def reference_results(plans: Sequence[dict[str, Any]], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{key_id: record}`` of the reference evaluator for the selected cases ``plans`` and one repeat's result
    ``records`` (by case id; a case without one is missing and counts wrong)."""
    return {plan["case_id"]: _case(plan, records.get(plan["case_id"])) for plan in plans}


def export_results(runs: Sequence[str | Path], out: str | Path, repeat: int = 0, overwrite: bool = False
                   ) -> list[Path]:
    """Write each run's ``all_results.json`` (its repeat ``repeat``) under ``out`` in the reference layout
    (:func:`reference_folder`); returns the files written. Two runs that map to one folder (the same model and
    oracle setting), a repeat the run does not have and, unless ``overwrite``, a file an earlier export wrote there
    are a :class:`ConfigError`, before anything is written."""
    jobs: dict[str, tuple[Path, dict[str, Any]]] = {}
    for run in map(Path, runs):
        cfg, plans, per_repeat, _lines = run_records(run)
        if not 0 <= repeat < len(per_repeat):
            raise ConfigError(f"--repeat {repeat}: run {run} has {len(per_repeat)} repeat(s) (0 to "
                              f"{len(per_repeat) - 1})")
        folder = reference_folder(str(cfg["model"]), str(cfg["oracle"]))
        if folder in jobs:
            raise ConfigError(f"runs {jobs[folder][0]} and {run} both go to {folder} (same model and oracle "
                              "setting); export them to different folders")
        jobs[folder] = (run, reference_results(plans, per_repeat[repeat]))
    existing = [Path(out) / folder / REFERENCE_RESULTS_FILE for folder in jobs]
    existing = [path for path in existing if path.exists()]
    if existing and not overwrite:
        raise ConfigError(f"{', '.join(map(str, existing))} exist{'s' if len(existing) == 1 else ''} (an earlier "
                          "export); choose another folder or pass --overwrite")
    written = []
    for folder, (_run, results) in jobs.items():
        path = Path(out) / folder / REFERENCE_RESULTS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(results, indent=2) + "\n")
        written.append(path)
    return written
