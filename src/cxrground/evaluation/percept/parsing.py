"""Answer parsing (CHEXPERCEPT.md §14): the reference parser (canonical score) plus parse labels.

:func:`reference_parse` is pass 1 + pass 2 of §14, giving the reference implementation's numbers. It never
raises (a None response parses to ``[-1]``, where the reference crashed). ``[-1]`` is the reference's "nothing
extracted" value; any other result is a list of non-negative integers. One difference: GLM box tags
(``<|begin_of_box|>…<|end_of_box|>``) are unwrapped for every model, where the reference unwraps them only when
the model id contains ``glm``; the tags hold no digits, so only a non-GLM reply that writes them can differ.

:func:`parse_answer` adds a label (§14; :data:`LABEL_ORDER`):

- ``matched-by-text``: the cleaned reply (thinking, also up to an unmatched ``</think>``, box tags, ``Answer:``
  prefix, markdown, ``(n)`` and trailing punctuation removed) equals one option text (case-insensitive), or, for
  multi-select questions, every comma/newline-separated piece equals exactly one option text; ``matched`` then
  holds those option numbers (e.g. ``Yes`` → [1], ``2nd mask`` → [2], ``None`` → the None option; an echoed
  ``None of the above (options 1-3)`` → [4] although its canonical numbers are the valid-looking [1, 3]);
- ``parsed``: otherwise, when the canonical numbers are a valid answer (option numbers ``1..n``, exactly one for a
  single-answer question), e.g. ``Answer: 2``;
- ``invalid-format``: neither, but the reference parser extracted numbers (e.g. ``Answer: 1,2`` or
  ``Answer: 7`` to a Yes/No question);
- ``unparseable``: neither, and the reference parser extracted nothing (``[-1]``).

Scoring (:func:`is_correct`) is the reference scorer's: a single-answer question compares the **first**
canonical number with the GT, a multi-select question needs set equality; ``[-1]`` (nothing extracted) is
wrong. So an ``unparseable`` answer is always wrong, and an ``invalid-format`` answer is scored as the reference
scores it (``Answer: 1,2`` to a Yes/No question with GT 1 is correct). ``matched`` feeds the lenient view only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["LABEL_ORDER", "NOTHING", "ParseLabel", "ParsedAnswer", "is_correct", "parse_answer",
           "reference_answer_text", "reference_parse"]

ParseLabel = Literal["parsed", "matched-by-text", "invalid-format", "unparseable"]
#: The parse labels of :func:`parse_answer`, best first.
LABEL_ORDER: Final[tuple[str, ...]] = ("parsed", "matched-by-text", "invalid-format", "unparseable")
#: The canonical numbers of an answer from which nothing can be extracted.
NOTHING: Final[tuple[int, ...]] = (-1,)

_GLM_BOX: Final = re.compile(r"<\|begin_of_box\|>(.*?)<\|end_of_box\|>", re.S)
_THINK: Final = re.compile(r"<think>.*?</think>", re.S)
_THINK_OPEN_TAIL: Final = re.compile(r"^.*?</think>", re.S)
_UNUSED: Final = re.compile(r"<unused\d+>")
_BOXED: Final = re.compile(r"\\boxed\{([\d,\s]+)\}")
_ANSWER: Final = re.compile(r"[Aa]nswer\s*:\s*\(?(\d+(?:\s*,\s*\d+)*)\)?")
# "final answer" as a word, then anything but a digit or "$", any "$", then a comma list of numbers
_FINAL: Final = re.compile(r"final answer\b[^$\d]*\$*\s*(\d+(?:\s*,\s*\d+)*)", re.I)
_ONLY_DIGITS: Final = re.compile(r"[\d,\s.]+")
# "answer(s) is/are", optional ":"/"-", then a run of digits, commas and whitespace (newlines included)
_ANSWER_IS: Final = re.compile(r"answers?\s*(?:is|are)\s*[:\-]?\s*(\d[\d,\s]*)", re.I)
_DIGIT_LINE: Final = re.compile(r"[\d,\s]+")
_NUMBER: Final = re.compile(r"\d+")
_PREFIX: Final = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)?\s*", re.I)
_OPTION_NO: Final = re.compile(r"^\(?\d+\)\s*")


def _strip_thinking(text: str) -> str:
    """Complete ``<think>…</think>`` blocks and ``<unusedNN>`` tokens removed (the reference's rule)."""
    return _UNUSED.sub("", _THINK.sub("", text))


def reference_answer_text(text: str | None) -> str:
    """The answer string the reference evaluator records for a raw response (§14 pass 1): comma-joined digits when
    a rule finds them, else the stripped text."""
    if text is None:
        return ""
    text = _GLM_BOX.sub(r"\1", text)
    text = _BOXED.sub(r"\1", _strip_thinking(text))
    matches = _ANSWER.findall(text)
    if matches:
        return ",".join(_NUMBER.findall(matches[-1]))
    final = _FINAL.search(text)
    if final:
        return ",".join(_NUMBER.findall(final.group(1)))
    stripped = text.strip()
    if _ONLY_DIGITS.fullmatch(stripped) and _NUMBER.search(stripped):
        return ",".join(_NUMBER.findall(stripped))
    return stripped


def _pass2(text: str) -> list[int]:
    """The reference's normalisation: the numbers of the first rule that finds any, else ``[-1]``."""
    text = _strip_thinking(text.strip())
    if not text:
        return list(NOTHING)
    found = _ANSWER_IS.search(text)
    if found:
        return [int(x) for x in _NUMBER.findall(found.group(1))]
    for line in reversed(text.split("\n")):  # "\n" only, as the reference splits
        line = line.strip()
        if line and _DIGIT_LINE.fullmatch(line) and _NUMBER.search(line):
            return [int(x) for x in _NUMBER.findall(line)]
    return [int(x) for x in _NUMBER.findall(text)] or list(NOTHING)


def reference_parse(text: str | None) -> list[int]:
    """The reference answer numbers of a raw response (§14, pass 1 then pass 2); ``[-1]``: nothing extracted."""
    return _pass2(reference_answer_text(text))


@dataclass(frozen=True)
class ParsedAnswer:
    """Canonical numbers, the parse label and (when matched by text) the option numbers matched."""

    numbers: tuple[int, ...]
    label: ParseLabel
    matched: tuple[int, ...] | None = None

    @property
    def effective(self) -> tuple[int, ...]:
        """The answer of the lenient view: ``matched`` when the label is ``matched-by-text``."""
        return self.matched if self.label == "matched-by-text" and self.matched else self.numbers


def _clean_for_text(text: str) -> str:
    """The reply for option-text matching: also without the thinking before an unmatched ``</think>`` (its
    ``<think>`` was in the chat template); this affects the label and the lenient view, not the canonical score."""
    text = _strip_thinking(_GLM_BOX.sub(r"\1", text))
    text = _BOXED.sub(r"\1", _THINK_OPEN_TAIL.sub("", text) if "</think>" in text else text)
    text = text.replace("*", "").replace("`", "").strip()
    text = _PREFIX.sub("", text).strip()
    return text


def _norm(text: str) -> str:
    text = _OPTION_NO.sub("", text.strip())
    return " ".join(text.strip().strip(".'\"").split()).lower()


def _match_options(text: str, options: Sequence[str], multi: bool) -> tuple[int, ...] | None:
    index: dict[str, list[int]] = {}
    for i, opt in enumerate(options, start=1):
        index.setdefault(_norm(opt), []).append(i)
    whole = index.get(_norm(text))
    if whole is not None:
        return tuple(whole) if len(whole) == 1 else None
    if not multi:
        return None
    pieces = [p for p in re.split(r"[,\n]", text) if p.strip()]
    picked: list[int] = []
    for p in pieces:
        hit = index.get(_norm(p))
        if hit is None or len(hit) != 1:
            return None
        picked.append(hit[0])
    return tuple(sorted(set(picked))) if picked else None


def parse_answer(text: str | None, options: Sequence[str], multi: bool) -> ParsedAnswer:
    """Canonical numbers plus the label (``parsed`` / ``matched-by-text`` / ``invalid-format`` / ``unparseable``)."""
    numbers = tuple(reference_parse(text))
    n = len(options)
    valid = bool(numbers) and all(1 <= x <= n for x in numbers) and (multi or len(numbers) == 1)
    matched = _match_options(_clean_for_text(text), options, multi) if text else None
    if matched:
        return ParsedAnswer(numbers, "matched-by-text", matched)
    if valid:
        return ParsedAnswer(numbers, "parsed")
    return ParsedAnswer(numbers, "unparseable" if numbers == NOTHING else "invalid-format")


def is_correct(numbers: Sequence[int], gt: Sequence[int], multi: bool) -> bool:
    """§14 scoring, as the reference scores: single answer → the first number equals the GT; multi-select → set
    equality. Nothing extracted (``[-1]``, or no numbers) is wrong."""
    if not numbers or tuple(numbers) == NOTHING:
        return False
    if multi:
        return set(numbers) == set(gt)
    return numbers[0] == gt[0]
