"""Built-in baselines (no model): ``random``, ``first-option``, ``always-yes`` and ``oracle``.

They read the question (options, GT) from the runner's side channel, never from the messages, and answer
in the system prompt's format (``Answer: 1`` / ``Answer: 1,3``).

- ``random``: uniform over the valid answers of §16, seeded per (seed, case conversation, question):
  single answer → one of the ``n`` options; expansion / contraction with ``k`` points → one of the ``2^k``
  answers (a non-empty subset of the points, or None alone); location → one of the 8 answers (a non-empty
  subset of options 1-3, or option 4 alone). The draw depends only on the sample's seed (the run's
  ``seed`` for the first repeat), the case id and the question id, so it is the same at any concurrency
  and on resume, and differs between repeats.
- ``first-option``: option 1.
- ``always-yes``: the ``Yes`` option where present, else option 1.
- ``oracle``: the ground truth.

They go through the response cache like model clients: identity ``{kind, seed}``, and what they read of the
side channel as the key's context (case id, question id, option texts; the ground truth for ``oracle``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from cxrground.evaluation.percept.conversation import Question, format_gt
from cxrground.llm import Completion
from cxrground.vocab.percept_templates import IMPLICIT_ANSWER, YES_NO

__all__ = ["BaselineClient", "random_answer"]


def random_answer(q: Question, rng: random.Random) -> tuple[int, ...]:
    """A uniform draw over the valid answers of ``q`` (§16)."""
    if not q.multi:
        return (rng.randint(1, q.n_options),)
    k = q.n_options - 1  # point options (or the three location regions) + the None option
    code = rng.randrange(2**k)  # 0 -> None alone; else the subset given by the bits
    if code == 0:
        return (q.n_options,)
    return tuple(i + 1 for i in range(k) if code >> i & 1)


class BaselineClient:
    """A model-free answerer; ``max_images`` is unbounded (it looks at no image)."""

    max_images = 10**6

    def __init__(self, kind: str, seed: int = 0) -> None:
        self.kind = kind
        self.model = kind
        self.seed = int(seed)
        self.decoding: dict[str, Any] = {"seed": self.seed} if kind == "random" else {}

    @property
    def identity(self) -> dict[str, Any]:
        """Kind and seed."""
        return {"kind": self.kind, "seed": self.seed}

    def cache_context(self, question: Question, case_id: str) -> dict[str, Any]:
        """What the answer depends on besides the messages: the case id, question id and option texts, and for
        ``oracle`` the ground truth (a benchmark whose answers changed is answered afresh)."""
        context: dict[str, Any] = {"case_id": case_id, "qid": question.qid, "options": list(question.options)}
        if self.kind == "oracle":
            context["gt"] = list(question.gt)
        return context

    def _answer(self, q: Question, case_id: str, seed: int) -> tuple[int, ...]:
        if self.kind == "oracle":
            return q.gt
        if self.kind == "first-option":
            return (1,)
        if self.kind == "always-yes":
            return (q.options.index(YES_NO[0]) + 1,) if YES_NO[0] in q.options else (1,)
        digest = hashlib.sha256(f"{seed}|{case_id}|{q.qid}".encode()).digest()
        return random_answer(q, random.Random(int.from_bytes(digest[:8], "big")))

    async def complete(self, messages: Sequence[dict[str, Any]], question: Question, case_id: str = "",
                       seed: int | None = None) -> Completion:
        """``Answer: {numbers}`` of this baseline (``random`` draws with ``seed``, default the client's)."""
        answer = self._answer(question, case_id, self.seed if seed is None else int(seed))
        return Completion(IMPLICIT_ANSWER.format(gt=format_gt(answer)), {}, self.kind)

    async def aclose(self) -> None:
        """Nothing to release."""
