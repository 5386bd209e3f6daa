"""``replay:ALL_RESULTS``: the answers another evaluator recorded, replayed through cxrground's harness.

The reference repository's evaluator writes one ``all_results.json`` per model and oracle setting (the layout
:func:`~cxrground.evaluation.percept.reference_results.export_results` writes too): per case (``key_id``, the
benchmark's case id) the raw response of every question it asked. ``percept eval --model replay:FILE`` asks the
benchmark's questions as for any model, and this client answers each with the response recorded for that case and
question, so ``percept score`` and ``percept report`` (bootstrap intervals, failure analysis, HTML) score runs made
elsewhere by the same rules as cxrground's own. A Stage-1 or Stage-2 block recorded without a response (the
reference evaluator's record of a reply that parsed to nothing, after which it goes on with the case) is answered
``""``: that question is wrong and the case goes on. Any other question the file has no response for fails its
case (recorded, scored wrong), as a model that never answered. Replay with the ``--oracle`` setting the responses
were made under: the reference keeps it in the folder name (``oracle_<setting>``), and a run whose ``--oracle``
contradicts that folder is refused (:meth:`ReplayClient.check_oracle`). A recorded ground truth that differs from
the benchmark's for the same case and question (the file answered another build of the benchmark) fails that case.

Identity: the file's SHA-256 (another file at the same path is another model for the response cache); the cache
context is the case and question id, since the answer does not depend on the messages.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cxrground.errors import ConfigError, InputError
from cxrground.evaluation.percept.reference_names import recorded_ground_truth, recorded_response
from cxrground.io.files import sha256_file
from cxrground.llm import Completion, PermanentError

if TYPE_CHECKING:
    from cxrground.evaluation.percept.conversation import Question

__all__ = ["ReplayClient", "load_recorded_results"]


def load_recorded_results(path: str | Path) -> dict[str, dict[str, Any]]:
    """The ``{key_id: record}`` object of an ``all_results.json``; an :class:`InputError` naming the file when it
    is not one (not JSON, not an object of objects) and a :class:`ConfigError` when it is missing."""
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"replay:{file} is a folder; name its all_results.json")
    if not file.is_file():
        raise ConfigError(f"replay:{file}: no such file")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not a JSON file of recorded results ({exc})", file) from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise InputError("not an all_results.json: expected an object of case records keyed by key_id", file)
    return data


class ReplayClient:
    """Answers with the responses an ``all_results.json`` recorded; looks at no image."""

    kind = "replay"
    max_images = 10**6

    def __init__(self, model: str) -> None:
        self.path = Path(model)
        self.records = load_recorded_results(self.path)
        self.model = str(self.path)
        self.decoding: dict[str, Any] = {}
        self._sha256 = sha256_file(self.path)

    @property
    def identity(self) -> dict[str, Any]:
        """Kind and the file's SHA-256."""
        return {"kind": self.kind, "sha256": self._sha256}

    def recorded_oracle(self) -> str | None:
        """The oracle setting the file's folder names (``.../oracle_<setting>/all_results.json``, a setting of
        :data:`~cxrground.evaluation.percept.conversation.ORACLE_SETTINGS`), None when its folder names none."""
        from cxrground.evaluation.percept.conversation import ORACLE_SETTINGS

        folder = self.path.resolve().parent.name
        setting = folder.removeprefix("oracle_")
        return setting if setting != folder and setting in ORACLE_SETTINGS else None

    def check_oracle(self, oracle: str) -> None:
        """A :class:`ConfigError` when the file's folder names another oracle setting than ``oracle``: the replayed
        answers were made under that setting, and the run (and its export) would be labelled with the other."""
        recorded = self.recorded_oracle()
        if recorded is not None and recorded != oracle:
            raise ConfigError(f"replay:{self.path} lies in an oracle_{recorded} folder (responses made with --oracle "
                              f"{recorded}); replay it with --oracle {recorded}")

    def cache_context(self, question: Question, case_id: str) -> dict[str, Any]:
        """The case and question the response is looked up by."""
        return {"case_id": case_id, "qid": question.qid}

    async def complete(self, messages: Sequence[dict[str, Any]], question: Question, case_id: str = "",
                       seed: int | None = None) -> Completion:
        """The recorded response of ``case_id``'s question; a :class:`PermanentError` when there is none."""
        record = self.records.get(case_id)
        if record is None:
            raise PermanentError(f"{self.path} has no record of case {case_id}")
        truth = recorded_ground_truth(record, question.stage, question.qid)
        if truth is not None and truth != tuple(sorted(question.gt)):
            raise PermanentError(f"{self.path} recorded the ground truth {list(truth)} for question {question.qid} of "
                                 f"case {case_id}, the benchmark has {sorted(question.gt)}: the responses answered "
                                 "another build of the benchmark")
        text = recorded_response(record, question.stage, question.qid)
        if text is None:
            raise PermanentError(f"{self.path} has no response to question {question.qid} of case {case_id}")
        return Completion(text, {}, self.kind)

    async def aclose(self) -> None:
        """Nothing to release."""
