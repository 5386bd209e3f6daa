"""The CheXpercept conversation of one case (CHEXPERCEPT.md §13): turn plan, oracle settings, OpenAI messages.

A case is planned into :class:`Question` records in turn order (§13.2): detection (CXR); contour evaluation
(overlay); RR only: ``{initial_context}\\n\\n{expansion}`` (overlay with points), contraction (no image),
revision result (one image per option, in option order); RF and RR of lung lesions: distribution,
location, severity/measurement, comparison (text only). Cardiomegaly has no Stage 4. LF cases have one turn.
The path comes from the ground truth (never from the model's answers) and every turn of it is asked.

The benchmark file is untrusted input. :func:`plan_benchmark` refuses it as a whole, with one message naming
the file and the first offending cases, when it has no cases, when a case's lesion is unknown (or missing:
the key's prefix is not a lesion), when a case lacks a question its path asks (or its path contradicts the
detection answer), when a ground truth lies outside its options, or when an image path is absolute, has a
``..`` component or resolves (symlinks followed) outside the benchmark folder: such a file must never make
the harness send local files to a remote API. :func:`safe_image_path` repeats the path check when an image
is read.

Each request is the system prompt, then every earlier turn as a user message (its text + its images, re-sent
in full as PNG data URLs) and an assistant message (the stored response), then the current user message.
User content is a list of parts: the text part first, then the images in order (choice: the spec says
"text + that turn's images" without an order). The history holds the **raw** response (thinking included).

Oracle settings (§13.3) fire only when the relevant earlier answer is not correct (missing = not correct):

- ``none``: own answers carry forward.
- ``implicit``: the relevant earlier assistant text is replaced by ``Answer: {gt}`` (sets: sorted indices
  joined by ``,``) from the firing turn on; the raw response stays in the record for inspection.
- ``explicit``: O1 (before Stage 2), O2 (before Stage 3, prefixed to the initial context), O3 (before 3c),
  O4 / O5 (RF / RR, before the first Stage-4 turn) + ``\\n\\n`` is prepended to the current user text.
  O3 names the GT points' colours in the benchmark's stored ``answer_index`` order ("colours in GT index
  order"; the reference's order), which need not be ascending.
"""

from __future__ import annotations

import base64
import functools
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from cxrground.errors import ImageReadError, InputError
from cxrground.percept.paths import safe_image_path, unsafe_reason
from cxrground.percept.schema import Benchmark, Case, ground_truth_problems, with_root_paths
from cxrground.vocab import percept_templates as pt
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.traits import lesions_where

__all__ = [
    "ATTRIBUTE_QIDS",
    "MAX_LISTED",
    "MULTI_SELECT",
    "ORACLE_SETTINGS",
    "QIDS",
    "STAGE_OF",
    "CasePlan",
    "Conversation",
    "Question",
    "format_gt",
    "image_data_url",
    "plan_benchmark",
    "plan_case",
    "safe_image_path",
    "user_message",
]

OracleSetting = Literal["none", "implicit", "explicit"]
ORACLE_SETTINGS: Final[tuple[str, str, str]] = ("none", "implicit", "explicit")
ATTRIBUTE_QIDS: Final[tuple[str, ...]] = ("distribution", "location", "severity", "comparison")
REVISION_QIDS: Final[tuple[str, ...]] = ("expansion", "contraction", "revision_result")
QIDS: Final[tuple[str, ...]] = ("detection", "contour_eval", *REVISION_QIDS, *ATTRIBUTE_QIDS)
STAGE_OF: Final[dict[str, int]] = {"detection": 1, "contour_eval": 2, **dict.fromkeys(REVISION_QIDS, 3),
                                   **dict.fromkeys(ATTRIBUTE_QIDS, 4)}
MULTI_SELECT: Final[frozenset[str]] = frozenset({"expansion", "contraction", "location"})
#: Lesions whose RF/RR cases have no Stage 4 (cardiomegaly).
_NO_STAGE4: Final[tuple[str, ...]] = lesions_where(lambda t: not t.percept.attributes)
#: Offending cases named in the message of a refused benchmark.
MAX_LISTED: Final[int] = 5


@dataclass(frozen=True)
class Question:
    """One asked question: id, stage, the question string as stored, images, option texts and the GT indices."""

    qid: str
    stage: int
    text: str
    images: tuple[str, ...]
    options: tuple[str, ...]
    gt: tuple[int, ...]
    prefix: str = ""  # sent before the question (Stage 3a: the initial context)
    #: The GT indices in the benchmark's stored order (expansion/contraction; empty: as ``gt``). ``gt`` is sorted;
    #: the O3 text names the GT points' colours in this order, as the reference does.
    gt_stored: tuple[int, ...] = ()

    @property
    def multi(self) -> bool:
        return self.qid in MULTI_SELECT

    @property
    def n_options(self) -> int:
        return len(self.options)

    def user_text(self) -> str:
        """The user text of this turn without any oracle text."""
        return f"{self.prefix}\n\n{self.text}" if self.prefix else self.text


@dataclass(frozen=True)
class CasePlan:
    """The planned conversation of one case: its id, path (``RR``/``RF``/``LF``), lesion and questions."""

    case_id: str
    path: str
    lesion: str
    questions: tuple[Question, ...]

    @property
    def stages(self) -> tuple[int, ...]:
        return tuple(sorted({q.stage for q in self.questions}))

    @property
    def total_images(self) -> int:
        """Images in the last request (every turn's images are re-sent)."""
        return sum(len(q.images) for q in self.questions)

    def summary(self) -> dict[str, Any]:
        """JSON-ready plan without texts (enough to score a case that never ran)."""
        return {"case_id": self.case_id, "path": self.path, "lesion": self.lesion,
                "questions": [{"qid": q.qid, "stage": q.stage, "gt": list(q.gt), "n_options": q.n_options,
                               "multi": q.multi} for q in self.questions]}


def format_gt(gt: Sequence[int]) -> str:
    """``{gt}`` of the oracle texts: the index, or sorted indices joined by ``,`` without spaces."""
    return ",".join(str(i) for i in sorted(gt))


def _point_texts(options: Sequence[Any]) -> tuple[str, ...]:
    colors = [o.color for o in options if o.point is not None or o.color != pt.NONE_OPTION]
    return tuple(pt.point_options(colors))


def _case_error(key: str, reason: str) -> InputError:
    return InputError(f"case {key}: {reason}")


def _lesion(key: str, case: Case) -> str:
    """The case's lesion; an unknown one (or a key prefix that is no lesion when ``lesion`` is absent) raises."""
    lesion = case.lesion_of(key)
    if lesion in LESIONS:
        return lesion
    if case.lesion:
        raise _case_error(key, f"unknown lesion {lesion!r} (expected one of {', '.join(LESIONS)})")
    raise _case_error(key, f"no lesion: no 'lesion' field and the key prefix {lesion!r} is not one of "
                           f"{', '.join(LESIONS)}")


def _path(key: str, case: Case) -> str:
    """The case's path abbreviation (RR/RF/LF); raises when it is missing, contradicts the detection answer or
    disagrees with the rest of the ground truth (:func:`~cxrground.percept.schema.ground_truth_problems`)."""
    try:
        name = case.path(key)
    except ValueError:
        raise _case_error(key, "positive case (detection answer Yes) without contour_qa") from None
    path = pt.PATH_ABBREVIATIONS[name]
    positive = case.detection_qa.answer == "Yes"
    if (path != "LF") != positive:
        raise _case_error(key, f"qa_path {case.qa_path} contradicts the detection answer {case.detection_qa.answer!r}")
    problems = ground_truth_problems(case, name)
    if problems:
        raise _case_error(key, "; ".join(problems))
    return path


def _check_question(key: str, q: Question) -> None:
    """A question must have text, options and a ground truth among its options."""
    if not q.text.strip():
        raise _case_error(key, f"{q.qid}: empty question")
    if len(q.options) < 2:
        raise _case_error(key, f"{q.qid}: {len(q.options)} answer option(s), expected at least 2")
    if not q.gt or any(not 1 <= i <= len(q.options) for i in q.gt):
        raise _case_error(key, f"{q.qid}: answer index {list(q.gt)} outside 1..{len(q.options)}")


def plan_case(key: str, case: Case) -> CasePlan:
    """Turn plan of ``case`` (§13.2); the path is the ground-truth path (§1.3).

    Image paths are relative to the benchmark folder (a reference-layout case is resolved by
    :func:`~cxrground.percept.schema.with_root_paths`). Raises :class:`InputError` naming the case when its
    lesion is unknown, when it lacks a question of its path or when a ground truth is outside its options.
    """
    case = with_root_paths(key, case)
    lesion = _lesion(key, case)
    path = _path(key, case)
    det = case.detection_qa
    if det.relative_path is None:  # with_root_paths fills it for reference-layout cases
        raise _case_error(key, "detection question names no image")
    qs = [Question("detection", 1, det.question, (det.relative_path,), tuple(det.answer_options),
                   (det.answer_index,))]
    if path != "LF":
        cq = case.contour_qa
        if cq is None:
            raise _case_error(key, f"{path} case without contour_qa")
        ce = cq.contour_eval_qa
        qs.append(Question("contour_eval", 2, ce.question, (ce.relative_path,), tuple(ce.answer_options),
                           (ce.answer_index,)))
        if path == "RR":
            exp, con, rev = cq.contour_revision_qa_expansion, cq.contour_revision_qa_contraction, \
                cq.contour_revision_qa_revision_result
            if exp is None or con is None or rev is None:
                raise _case_error(key, "RR case lacks a revision question (expansion, contraction or revision "
                                       "result)")
            if exp.relative_path is None:
                raise _case_error(key, "RR expansion question names no image")
            if any(o.relative_path is None for o in rev.answer_options):
                raise _case_error(key, "an RR revision option names no image")
            qs.append(Question("expansion", 3, exp.question, (exp.relative_path,),
                               _point_texts(exp.answer_options), tuple(sorted(exp.answer_index)),
                               prefix=cq.initial_context, gt_stored=tuple(exp.answer_index)))
            qs.append(Question("contraction", 3, con.question, (), _point_texts(con.answer_options),
                               tuple(sorted(con.answer_index)), gt_stored=tuple(con.answer_index)))
            qs.append(Question("revision_result", 3, rev.question,
                               tuple(o.relative_path for o in rev.answer_options),
                               tuple(pt.mask_options(len(rev.answer_options))), (rev.answer_index,)))
        attrs = case.attribute_extraction_qa
        if lesion not in _NO_STAGE4:
            if attrs is None:
                raise _case_error(key, f"{lesion} {path} case without attribute_extraction_qa (Stage 4)")
            for qid in ATTRIBUTE_QIDS:
                a = getattr(attrs, qid)
                gt = tuple(sorted(a.answer_index)) if isinstance(a.answer_index, list) else (a.answer_index,)
                qs.append(Question(qid, 4, a.question, (), tuple(a.answer_options), gt))
    for q in qs:
        _check_question(key, q)
    return CasePlan(key, path, lesion, tuple(qs))


@functools.lru_cache(maxsize=64)
def image_data_url(path: Path) -> str:
    """``data:image/png;base64,...`` of an image file (PNG bytes as stored; other formats re-encoded to PNG)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImageReadError(f"cannot read image ({exc.strerror})", path) from None
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as im:
                buf = io.BytesIO()
                im.save(buf, format="PNG")
        except (UnidentifiedImageError, OSError) as exc:
            raise ImageReadError(f"not an image ({exc})", path) from None
        data = buf.getvalue()
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def user_message(text: str, image_urls: Sequence[str]) -> dict[str, Any]:
    """An OpenAI user message: the text part, then one ``image_url`` part per image."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in image_urls]
    return {"role": "user", "content": parts}


@dataclass
class Turn:
    """A finished turn: the text sent, the raw response, the text kept in the history, its correctness."""

    question: Question
    sent_text: str
    raw: str | None
    correct: bool
    history_text: str
    oracle_prefix: str | None = None
    replaced: bool = False


@dataclass
class Conversation:
    """The running conversation of one case under an oracle setting.

    Call :meth:`next_request` for the messages of the next turn, then :meth:`record` with the raw response
    and its correctness. ``image_url`` maps a benchmark-relative path to a data URL.
    """

    plan: CasePlan
    setting: str
    image_url: Callable[[str], str]
    turns: list[Turn] = field(default_factory=list)
    _pending_prefix: str | None = None

    def __post_init__(self) -> None:
        if self.setting not in ORACLE_SETTINGS:
            raise ValueError(f"oracle setting must be one of {ORACLE_SETTINGS}, got {self.setting!r}")

    @property
    def done(self) -> bool:
        return len(self.turns) >= len(self.plan.questions)

    @property
    def current(self) -> Question:
        return self.plan.questions[len(self.turns)]

    def _turn(self, qid: str) -> Turn | None:
        return next((t for t in self.turns if t.question.qid == qid), None)

    def _oracle(self, q: Question) -> tuple[list[Turn], str | None]:
        """The earlier turns whose answer the oracle corrects before ``q``, and the explicit text."""
        wrong = [t for t in self._triggers(q) if not t.correct]
        if not wrong:
            return [], None
        qid = q.qid
        if qid == "contour_eval":
            text = pt.ORACLE_O1
        elif qid == "expansion":
            text = pt.ORACLE_O2
        elif qid == "revision_result":
            exp, con = self._turn("expansion"), self._turn("contraction")
            assert exp is not None and con is not None
            text = pt.oracle_o3(_gt_colors(exp.question), _gt_colors(con.question))
        else:  # first attribute turn
            text = pt.ORACLE_O4 if self.plan.path == "RF" else pt.oracle_o5(wrong[0].question.gt[0])
        return wrong, text

    def _triggers(self, q: Question) -> list[Turn]:
        names: tuple[str, ...] = ()
        if q.qid == "contour_eval":
            names = ("detection",)
        elif q.qid == "expansion":
            names = ("contour_eval",)
        elif q.qid == "revision_result":
            names = ("expansion", "contraction")
        elif q.qid == ATTRIBUTE_QIDS[0]:
            names = ("contour_eval",) if self.plan.path == "RF" else ("revision_result",)
        return [t for t in (self._turn(n) for n in names) if t is not None]

    def next_request(self) -> list[dict[str, Any]]:
        """Messages of the next turn (applies the oracle of this setting first)."""
        q = self.current
        prefix = None
        if self.setting != "none":
            wrong, text = self._oracle(q)
            if self.setting == "implicit":
                for t in wrong:
                    t.history_text = pt.IMPLICIT_ANSWER.format(gt=format_gt(t.question.gt))
                    t.replaced = True
            elif text is not None:
                prefix = text
        self._pending_prefix = prefix
        messages: list[dict[str, Any]] = [{"role": "system", "content": pt.SYSTEM_PROMPT}]
        for t in self.turns:
            messages.append(user_message(t.sent_text, [self.image_url(p) for p in t.question.images]))
            messages.append({"role": "assistant", "content": t.history_text})
        messages.append(user_message(self._sent_text(q, prefix), [self.image_url(p) for p in q.images]))
        return messages

    @staticmethod
    def _sent_text(q: Question, prefix: str | None) -> str:
        return f"{prefix}\n\n{q.user_text()}" if prefix else q.user_text()

    def record(self, raw: str | None, correct: bool) -> Turn:
        """Store the answer to the current turn (``raw`` None = no answer; the history then holds ``""``)."""
        q = self.current
        turn = Turn(q, self._sent_text(q, self._pending_prefix), raw, bool(correct), raw or "",
                    self._pending_prefix)
        self.turns.append(turn)
        self._pending_prefix = None
        return turn


def _gt_colors(q: Question) -> list[str]:
    """Colours of the GT points of an expansion/contraction question in the stored GT order (empty when the GT is
    None)."""
    return [q.options[i - 1].removesuffix(" point") for i in (q.gt_stored or q.gt)
            if q.options[i - 1] != pt.NONE_OPTION]


def plan_benchmark(bench: Benchmark, source: str | Path | None = None) -> list[CasePlan]:
    """Plans of every case, in key order; raises :class:`InputError` (naming ``source``, the benchmark file,
    and the first :data:`MAX_LISTED` offending cases) for the problems of the module docstring."""
    if not bench.cases:
        raise InputError("the benchmark has no cases", source)
    plans: list[CasePlan] = []
    problems: list[str] = []
    for key in sorted(bench.cases):
        try:
            plans.append(plan_case(key, bench.cases[key]))
        except InputError as exc:
            problems.append(exc.reason)
    if problems:
        raise InputError(_listing(f"{len(problems)} of {len(bench.cases)} cases cannot be evaluated", problems),
                         source)
    if bench.root is not None:
        base = bench.root.resolve()
        unsafe = [f"case {p.case_id}: {rel!r} {reason}" for p in plans for q in p.questions for rel in q.images
                  if (reason := unsafe_reason(base, rel)) is not None]
        if unsafe:
            raise InputError(_listing(f"refusing the benchmark: {len(unsafe)} image path(s) point outside the "
                                      f"benchmark folder {bench.root}", unsafe), source)
    return plans


def _listing(head: str, problems: Sequence[str]) -> str:
    more = f"; ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    return f"{head}: " + "; ".join(problems[:MAX_LISTED]) + more
