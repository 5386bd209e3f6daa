"""Answer parsing (CHEXPERCEPT.md §14): the reference parser (canonical score) plus parse labels.

:func:`reference_parse` is pass 1 + pass 2 exactly as specified; it never raises (a None response parses
to ``[-1]``). One addition to pass 1: text up to an unmatched ``</think>`` (a thinking block whose opening
tag was in the chat template) is removed like a complete block.

:func:`parse_answer` adds a label:

- ``parsed``: the canonical numbers are all valid option numbers (``1..n``), for a single-answer
  question there is exactly one, and the reply is not an option text naming other options;
- ``matched-by-text``: otherwise, when the cleaned reply (thinking, box tags, ``Answer:`` prefix, markdown,
  ``(n)`` and trailing punctuation removed) equals one option text (case-insensitive), or, for
  multi-select questions, every comma/newline-separated piece equals exactly one option text;
  ``matched`` then holds those option numbers (e.g. ``Yes`` → [1], ``None`` → the None option; an echoed
  ``None of the above (options 1-3)`` → [4] although its canonical numbers are the valid-looking [1, 3]);
- ``unparseable``: neither.

Scoring uses the canonical numbers (single answer: the first number equals the GT; multi-select: set
equality); ``matched`` feeds the lenient view only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["ParseLabel", "ParsedAnswer", "is_correct", "parse_answer", "reference_parse"]

ParseLabel = Literal["parsed", "matched-by-text", "unparseable"]

_GLM_BOX: Final = re.compile(r"<\|begin_of_box\|>(.*?)<\|end_of_box\|>", re.S)
_THINK: Final = re.compile(r"<think>.*?</think>", re.S)
_THINK_OPEN_TAIL: Final = re.compile(r"^.*?</think>", re.S)
_UNUSED: Final = re.compile(r"<unused\d+>")
_BOXED: Final = re.compile(r"\\boxed\{([\d,\s]*)\}")
_ANSWER: Final = re.compile(r"[Aa]nswer\s*:\s*\(?(\d+(\s*,\s*\d+)*)\)?")
_FINAL: Final = re.compile(r"final answer[^\d$]*\$?(\d+)", re.I)
_ONLY_DIGITS: Final = re.compile(r"[\d,\s.]+")
_ANSWER_IS: Final = re.compile(r"answer (?:is|are)\s*[:\-]?\s*(\d+(?:\s*,\s*\d+)*)", re.I)
_DIGIT_LINE: Final = re.compile(r"[\d,\s]+")
_NUMBER: Final = re.compile(r"\d+")
_SIGNED: Final = re.compile(r"-?\d+")
_PREFIX: Final = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)?\s*", re.I)
_OPTION_NO: Final = re.compile(r"^\(?\d+\)\s*")


def _strip_thinking(text: str) -> str:
    text = _THINK.sub("", text)
    if "</think>" in text:
        text = _THINK_OPEN_TAIL.sub("", text)
    return _UNUSED.sub("", text)


def _pass1(text: str | None) -> str:
    if text is None:
        return ""
    text = _GLM_BOX.sub(r"\1", text)
    text = _BOXED.sub(r"\1", _strip_thinking(text))
    matches = list(_ANSWER.finditer(text))
    if matches:
        return ",".join(_NUMBER.findall(matches[-1].group(1)))
    final = _FINAL.search(text)
    if final:
        return final.group(1)
    stripped = text.strip()
    if stripped and _ONLY_DIGITS.fullmatch(stripped):
        return ",".join(_NUMBER.findall(stripped))
    return stripped


def _pass2(text: str) -> list[int]:
    if not text.strip():
        return [-1]
    text = _strip_thinking(text)
    found = _ANSWER_IS.search(text)
    if found:
        joined = found.group(1)
    else:
        lines = [ln for ln in text.splitlines() if ln.strip() and _DIGIT_LINE.fullmatch(ln)]
        if lines:
            joined = lines[-1]
        else:
            numbers = _NUMBER.findall(text)
            joined = ",".join(numbers) if numbers else "-1"
    out = []
    for piece in joined.split(","):
        m = _SIGNED.search(piece)
        out.append(int(m.group()) if m else -1)
    return out


def reference_parse(text: str | None) -> list[int]:
    """The reference answer numbers of a raw response (§14, pass 1 then pass 2)."""
    return _pass2(_pass1(text))


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
    text = _BOXED.sub(r"\1", _strip_thinking(_GLM_BOX.sub(r"\1", text)))
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
    """Canonical numbers plus the ``parsed`` / ``matched-by-text`` / ``unparseable`` label."""
    numbers = tuple(reference_parse(text))
    n = len(options)
    valid = bool(numbers) and all(1 <= x <= n for x in numbers) and (multi or len(numbers) == 1)
    matched = _match_options(_clean_for_text(text), options, multi) if text else None
    if valid and (matched is None or set(matched) == set(numbers)):
        return ParsedAnswer(numbers, "parsed")
    if matched:
        return ParsedAnswer(numbers, "matched-by-text", matched)
    return ParsedAnswer(numbers, "unparseable")


def is_correct(numbers: Sequence[int], gt: Sequence[int], multi: bool) -> bool:
    """§14 scoring: single answer → first number equals the GT; multi-select → set equality."""
    if not numbers:
        return False
    if multi:
        return set(numbers) == set(gt)
    return numbers[0] == gt[0]
