"""Parsing of ILS answers into the tuple that §15.2 text accuracy compares (ILS.md §15.2).

GT and predicted answers are parsed into ``(type, target, location, presence)``. The parsing patterns are
derived from the answer templates of :mod:`cxrground.vocab.ils_templates` (lower-cased, ``[SEG]`` and the
final dot removed, first match anywhere in the answer, trailing dots ignored; the lesion-inference phrases are
§15.2's, the templates' last words before the lesion). :func:`lenient_match` and
:func:`unordered_match` are the two relaxed comparisons for global positives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cxrground.vocab.ils_templates import (
    BASIC_INSTRUCTION,
    BASIC_NEGATIVE,
    EOS,
    GLOBAL_NEGATIVE,
    GLOBAL_POSITIVE,
    LESION_INFERENCE_DEFINITIVE,
    LESION_INFERENCE_INSTRUCTION,
    LESION_INFERENCE_NEGATIVE,
    LESION_INFERENCE_TENTATIVE,
    LLAVA_PROMPT,
    SEG_TOKEN,
    TENTATIVE_WORD,
)
from cxrground.vocab.locations import SIDES, split_ils

__all__ = [
    "NONE_LOCATION",
    "NOT_EXTRACTED",
    "ParsedAnswer",
    "clean_answer",
    "lenient_match",
    "parse_answer",
    "question_type",
    "unordered_match",
]

NOT_EXTRACTED = "not extracted"
NONE_LOCATION = "none"

_ASSISTANT = LLAVA_PROMPT.rsplit(" ", 1)[-1]  # "ASSISTANT:"


def _template_body(template: str) -> str:
    return template.replace(SEG_TOKEN, "").strip().lower().rstrip(".")


def _template_regex(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", _template_body(template))
    body = "".join(f"(?P<{p}>.+?)" if i % 2 else re.escape(p) for i, p in enumerate(parts))
    return re.compile(body + r"\.*$")


def _prefix(template: str, word: str) -> str:
    body = _template_body(template)
    return body[: body.index(word)]


_BASIC_NEG = _template_regex(BASIC_NEGATIVE)  # there is no (target) in the (location)
_GLOBAL_POS = _template_regex(GLOBAL_POSITIVE)  # it is located in the (location)
_GLOBAL_NEG = _template_regex(GLOBAL_NEGATIVE)  # there is no (target)
#: §15.2's lesion-inference phrases ``(highly suggestive of | possibly reflects | is no) (X)``: the last words
#: before the lesion of each template, so "[SEG] Highly suggestive of pneumonia." is read as the spec reads it.
_LI_PHRASES = {
    "highly suggestive of ": "definite",
    "possibly reflects ": "tentative",
    "is no ": "absent",
}
for _template, _word, _phrase in ((LESION_INFERENCE_DEFINITIVE, "{lesion}", "highly suggestive of "),
                                  (LESION_INFERENCE_TENTATIVE, "{lesion}", "possibly reflects "),
                                  (LESION_INFERENCE_NEGATIVE, TENTATIVE_WORD, "is no ")):
    assert _prefix(_template, _word).endswith(_phrase), (_template, _phrase)  # one source of truth: the templates
_LI = re.compile("(?P<phrase>" + "|".join(re.escape(p) for p in _LI_PHRASES) + r")(?P<target>.+?)\.*$")
_LI_MARK = LESION_INFERENCE_INSTRUCTION.lower().rstrip(".").rsplit(" and ", 1)[-1]  # "predict its type"
_SEGMENT = BASIC_INSTRUCTION.lower().split(" ", 1)[0]  # "segment"
_IN_THE = BASIC_INSTRUCTION.lower().split("{target}")[1].split("{location}")[0].strip()  # "in the"


@dataclass(frozen=True)
class ParsedAnswer:
    """The tuple compared in §15.2."""

    type: str
    target: str
    location: str
    presence: str

    def astuple(self) -> tuple[str, str, str, str]:
        return (self.type, self.target, self.location, self.presence)


def clean_answer(text: str) -> str:
    """The answer part (after ``ASSISTANT:``, before ``</s>``), newlines removed, spaces collapsed."""
    if _ASSISTANT in text:
        text = text.rsplit(_ASSISTANT, 1)[1]
    text = text.split(EOS, 1)[0]
    text = text.replace("\r", "").replace("\n", "")  # ILS.md §15.2: newlines removed
    return re.sub(r" {2,}", " ", text).strip()


def question_type(instruction: str) -> str:
    """``lesion_inference`` / ``basic`` / ``global`` from the instruction text; ``unknown`` otherwise."""
    low = instruction.lower()
    if _LI_MARK in low:
        return "lesion_inference"
    if _SEGMENT in low and _IN_THE in low:
        return "basic"
    if _SEGMENT in low:
        return "global"
    return "unknown"


def parse_answer(answer: str, qtype: str) -> ParsedAnswer:
    """Parse one answer (GT or prediction) for a question of type ``qtype`` (§15.2)."""
    text = clean_answer(answer).lower()
    ne = NOT_EXTRACTED
    if qtype == "basic":
        m = _BASIC_NEG.search(text)
        if m:
            return ParsedAnswer(qtype, m["target"], m["location"], "absent")
        return ParsedAnswer(qtype, ne, ne, "present")
    if qtype == "global":
        m = _GLOBAL_POS.search(text)
        if m:
            return ParsedAnswer(qtype, ne, m["location"], "present")
        m = _GLOBAL_NEG.search(text)
        if m:
            return ParsedAnswer(qtype, m["target"], NONE_LOCATION, "absent")
        return ParsedAnswer(qtype, ne, ne, ne)
    if qtype == "lesion_inference":
        m = _LI.search(text)
        if m:
            return ParsedAnswer(qtype, m["target"], ne, _LI_PHRASES[m["phrase"]])
        return ParsedAnswer(qtype, ne, ne, ne)
    return ParsedAnswer(qtype, ne, ne, ne)


def unordered_match(gt: ParsedAnswer, pred: ParsedAnswer) -> bool:
    """Global positives: the same answer with the location labels in any order (ILS.md §18.14)."""
    if pred.astuple() == gt.astuple():
        return True
    same = pred.presence == gt.presence and pred.target == gt.target
    return same and frozenset(split_ils(pred.location)) == frozenset(split_ils(gt.location))


def lenient_match(gt: ParsedAnswer, pred: ParsedAnswer) -> bool:
    """Global positives: exact, or a predicted ``right lung`` / ``left lung`` whose side word is in the GT location."""
    if pred.astuple() == gt.astuple():
        return True
    sides = {f"{s} lung": s for s in SIDES}
    return (pred.presence == gt.presence and pred.target == gt.target and pred.location in sides
            and sides[pred.location] in gt.location)
