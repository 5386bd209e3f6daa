"""Sentence splitting for radiology text and the ``(1) … (2) …`` numbering of ILS §6.

Rules of :func:`split_sentences`, in order:

1. A blank line (paragraph break) always ends a sentence.
2. Numbered-list markers (``1.``, ``2)``) and bullets (``-``, ``*``, ``•``) start a new sentence and are
   removed from its text. A number counts as a list marker at the start of a line or paragraph,
   after sentence punctuation (not after an abbreviation such as ``Fig.``), or when it continues the previous
   marker (``1. a 2. b``); a ``4)`` that closes an open parenthesis (``(Fig. 4)``) is never a marker.
3. Otherwise a sentence ends at ``.``, ``!`` or ``?`` that is attached to a word and followed by
   whitespace (so ``1.5 cm`` and ``? pneumonia`` never split), or at a period that stands alone between spaces
   (``No effusion . Heart is normal.``), except after abbreviations:
   titles and Latin forms (``Dr.``, ``St.``, ``e.g.``, ``i.e.``, ``vs.``, ``approx.``, ``cf.``),
   ``P.A.``/``A.P.`` and single-letter initials never split; dotted initialisms (``a.m.``,
   ``U.S.``) and short forms such as ``pt.``, ``yrs.``, ``etc.``, ``rt.`` / ``lt.`` (right / left) split only
   when the next word starts with an upper-case letter, a digit or a de-identification blank.
4. Line breaks inside a sentence and runs of whitespace become single spaces; de-identification
   blanks (``___``, ``XXXX``) are kept verbatim. Pieces without any letter, digit or ``_`` are dropped.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Final

from cxrground.reports.model import Sentence

__all__ = [
    "make_sentences",
    "normalise_whitespace",
    "number_sentences",
    "parse_numbered",
    "split_sentences",
]

#: Abbreviations after which a period never ends a sentence (lower case, without the final period).
NEVER_SPLIT: Final[frozenset[str]] = frozenset(
    {
        "dr", "drs", "mr", "mrs", "ms", "prof", "st", "sr", "jr",
        "e.g", "eg", "i.e", "ie", "vs", "approx", "cf", "viz", "fig", "figs", "incl",
        "p.a", "a.p",
    }
)  # fmt: skip
#: Abbreviations that end a sentence only when the next word looks like a sentence start.
SPLIT_IF_CAPITAL: Final[frozenset[str]] = frozenset(
    {"pt", "pts", "etc", "yr", "yrs", "y.o", "hr", "hrs", "min", "mins", "sec", "wk", "wks", "mo", "mos", "rt", "lt"}
)

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
#: The longest line that may be one item of a list written one per line without punctuation; wrapped lines of
#: running text are longer (about 70-80 characters in MIMIC-CXR's report files).
MAX_ITEM_LINE: Final[int] = 50
#: Words that end a line which the next line continues ("... no focal consolidation, effusion or⏎pneumothorax").
_JOINING_WORDS: Final[frozenset[str]] = frozenset(
    {"and", "or", "nor", "of", "the", "a", "an", "with", "without", "to", "in", "at", "on", "for", "by", "from",
     "is", "are", "was", "were", "be", "been", "no", "not", "than", "versus", "vs", "which", "that", "as", "into",
     "within", "along", "left", "right", "both", "small", "moderate", "large", "mild", "new", "there", "has",
     "have", "may", "likely", "possible", "probable", "could", "can", "cannot", "also", "again", "then", "but"}
)
_ITEM_START = re.compile(r"[ \t]*[A-Z][a-z]")
#: The longest sentence kept whole; a longer run of text without a sentence end (about twice the longest sentence
#: of real reports) is cut at its last comma, semicolon or space before this length, so that reading it stays
#: linear in its length.
MAX_SENTENCE_CHARS: Final[int] = 1_000
_MARKER = re.compile(r"(?<!\S)(?:(?P<num>\d{1,2})[.)]|(?P<bullet>[-*•]))[ \t]+(?=\S)")
_TERMINATOR = re.compile(r"[.!?]+[\"')\]]*(?=\s)")
_DOTTED = re.compile(r"(?:[a-z]\.)+[a-z]")
_SINGLE_LETTER = re.compile(r"[a-z]")
_CONTENT = re.compile(r"[A-Za-z0-9_]")
_NUMBERED = re.compile(r"(?:^|(?<= ))\((\d+)\) ")
_SENTENCE_END = re.compile(r"[.!?:;][\"')\]]*$")


def normalise_whitespace(text: str) -> str:
    """Return ``text`` with every run of whitespace (line breaks included) replaced by one space, stripped."""
    return " ".join(text.split())


def _marker_starts(block: str) -> list[tuple[int, int]]:
    """Return (start, end) spans of the list markers of one paragraph that open a new sentence."""
    spans: list[tuple[int, int]] = []
    last_number: int | None = None
    for m in _MARKER.finditer(block):
        start = m.start()
        line_start = block.rfind("\n", 0, start) + 1
        at_line_start = not block[line_start:start].strip()
        if m.group("bullet"):
            if at_line_start:
                spans.append((start, m.end()))
            continue
        number = int(m.group("num"))
        before = block[:start].rstrip()
        if m.group(0).rstrip().endswith(")") and before.count("(") > before.count(")"):
            continue  # "(Fig. 4) shows": the number closes an open parenthesis, it is no list marker
        last_word = before[before.rfind(" ") + 1 :].lstrip("([\"'").lower().removesuffix(".")
        after_punct = bool(_SENTENCE_END.search(before)) and last_word not in NEVER_SPLIT
        continues = last_number is not None and number == last_number + 1
        if at_line_start or after_punct or continues:
            spans.append((start, m.end()))
            last_number = number
    return spans


def _split_item_lines(block: str) -> list[str]:
    """Split one paragraph where a line is an item of a list written one per line without punctuation.

    A line break is an item break when the line before it ends without punctuation and without a joining word
    (:data:`_JOINING_WORDS`) and the next line starts with a capital and a small letter ("No pneumothorax⏎Small
    left effusion": two sentences). It ends a sentence when the line before it is at most :data:`MAX_ITEM_LINE`
    characters, or at any length when another item break of the paragraph is that short: a paragraph written as a
    list ("No focal consolidation or pleural effusion identified in this study⏎Mild cardiomegaly⏎Bibasilar
    atelectasis"), where wrapped running text has no short line but its last.
    """
    lines = block.split("\n")
    items = [_item_break(before, line) for before, line in itertools.pairwise(lines)]
    listed = any(length <= MAX_ITEM_LINE for length in items if length is not None)
    pieces: list[str] = [lines[0]]
    for line, length in zip(lines[1:], items, strict=True):
        if length is not None and (listed or length <= MAX_ITEM_LINE):
            pieces.append(line)
        else:
            pieces[-1] += "\n" + line
    return pieces


def _item_break(before: str, line: str) -> int | None:
    """The length of the line ``before`` when the break between it and ``line`` may end an item (``before`` ends
    without punctuation and without a joining word, ``line`` starts with a capital and a small letter), else None."""
    before = before.strip()
    words = before.split()
    if words and before[-1].isalnum() and words[-1].lower() not in _JOINING_WORDS and _ITEM_START.match(line):
        return len(before)
    return None


def _split_list_items(block: str) -> list[str]:
    """Split one paragraph at its list markers; the markers themselves are dropped."""
    pieces: list[str] = []
    position = 0
    for start, end in _marker_starts(block):
        pieces.append(block[position:start])
        position = end
    pieces.append(block[position:])
    return pieces


def _is_boundary(piece: str, term_start: int, term: str, sentence_start: int) -> bool:
    """Decide whether the terminator ``term`` at ``term_start`` of ``piece`` ends a sentence."""
    if term_start == 0:
        return False
    if piece[term_start - 1].isspace():
        # "with ? pneumonia": a free-standing "?" or "!" is not an end; a free-standing period is ("effusion . The")
        return term.startswith(".") and bool(piece[:term_start].strip())
    if not term.startswith(".") or len(term.rstrip("\"')]")) > 1:
        return True  # "!", "?", "..", "?!" always end
    word_start = piece.rfind(" ", 0, term_start) + 1
    word = piece[word_start:term_start].lstrip("([\"'").lower()
    if word.isdigit() and not piece[sentence_start:word_start].strip():
        return False  # "2. " at the start of a sentence is a list marker that was not recognised as one
    if word in NEVER_SPLIT or _SINGLE_LETTER.fullmatch(word):
        return False
    if word in SPLIT_IF_CAPITAL or _DOTTED.fullmatch(word):
        following = piece[term_start + len(term) :].lstrip()
        return bool(following) and (following[0].isupper() or following[0].isdigit() or following[0] in "_(\"'")
    return True


def _split_on_terminators(piece: str) -> list[str]:
    """Split whitespace-normalised text at sentence-ending punctuation."""
    sentences: list[str] = []
    start = 0
    for m in _TERMINATOR.finditer(piece):
        if _is_boundary(piece, m.start(), m.group(), start):
            sentences.append(piece[start : m.end()])
            start = m.end()
    sentences.append(piece[start:])
    return [s.strip() for s in sentences]


def _cut_long(sentence: str) -> list[str]:
    """``sentence`` in pieces of at most :data:`MAX_SENTENCE_CHARS` characters, cut at a comma, semicolon or
    space."""
    pieces: list[str] = []
    while len(sentence) > MAX_SENTENCE_CHARS:
        head = sentence[:MAX_SENTENCE_CHARS]
        cut = max(head.rfind(","), head.rfind(";"))
        cut = cut + 1 if cut > 0 else (head.rfind(" ") if head.rfind(" ") > 0 else MAX_SENTENCE_CHARS)
        pieces.append(sentence[:cut].strip())
        sentence = sentence[cut:].strip()
    return [*pieces, sentence]


def split_sentences(text: str) -> list[str]:
    """Return the sentences of ``text`` (whitespace-normalised, list markers removed, empty pieces dropped)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    sentences: list[str] = []
    for block in _PARAGRAPH_BREAK.split(text.strip()):
        for piece in (p for lines in _split_item_lines(block) for p in _split_list_items(lines)):
            flat = normalise_whitespace(piece)
            if flat:
                sentences.extend(p for s in _split_on_terminators(flat) for p in _cut_long(s) if _CONTENT.search(p))
    return sentences


def make_sentences(text: str) -> tuple[Sentence, ...]:
    """Return the sentences of ``text`` as :class:`Sentence` records numbered from 1."""
    return tuple(Sentence(i, s) for i, s in enumerate(split_sentences(text), start=1))


def number_sentences(sentences: Sequence[str | Sentence]) -> str:
    """Return ``"(1) First. (2) Second."``: each sentence prefixed ``(n) `` (1-based), joined by single spaces.

    Sentences are numbered by position; a :class:`Sentence` whose ``index`` differs from its
    position, or an empty sentence, raises ``ValueError``.
    """
    parts: list[str] = []
    for position, item in enumerate(sentences, start=1):
        if isinstance(item, Sentence):
            if item.index != position:
                raise ValueError(f"sentence at position {position} has index {item.index}")
            item = item.text
        text = normalise_whitespace(item)
        if not text:
            raise ValueError(f"sentence {position} is empty")
        parts.append(f"({position}) {text}")
    return " ".join(parts)


def parse_numbered(section_content: str) -> list[tuple[int, str]]:
    """Invert :func:`number_sentences`: return ``[(1, "First."), (2, "Second."), ...]``.

    Markers must run 1, 2, 3, ...; a ``(n)`` inside a sentence (``two (2) views``) is told apart from
    the real marker by preferring a candidate that follows sentence punctuation. Text that does
    not start with ``(1) `` raises ``ValueError``.
    """
    content = section_content.strip()
    if not content:
        return []
    if not content.startswith("(1) "):
        raise ValueError(f"numbered section content must start with '(1) ': {content[:40]!r}")
    candidates: dict[int, list[re.Match[str]]] = {}
    for m in _NUMBERED.finditer(content):
        candidates.setdefault(int(m.group(1)), []).append(m)
    starts: list[re.Match[str]] = [candidates[1][0]]
    expected = 2
    while expected in candidates:
        after = [m for m in candidates[expected] if m.start() > starts[-1].end()]
        if not after:
            break
        # a real marker follows sentence punctuation; otherwise fall back to the first candidate
        ending = [m for m in after if _SENTENCE_END.search(content[: m.start()].rstrip())]
        starts.append(ending[0] if ending else after[0])
        expected += 1
    result: list[tuple[int, str]] = []
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(content)
        result.append((i + 1, content[m.end() : end].strip()))
    return result
