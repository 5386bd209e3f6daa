"""First-character dispatch of a large regular-expression alternation: the same matches, found faster.

Python's ``re`` tries every alternative of a pattern such as ``\\b(?:(?P<e0>...)|(?P<e1>...)|...)\\b`` at every
position of the text. :class:`Alternation` builds the same pattern from its alternatives (each a named group of
phrase patterns with an optional prefix and suffix), works out from the parsed patterns which characters a match
of each phrase pattern can start with, and keeps one smaller pattern per first character that holds only the
phrase patterns (and groups) that can start with it, in their original order. :meth:`Alternation.matches` visits
only the positions where some alternative can start (found by one character-class scan, with the word boundary
when every such alternative begins with ``\\b``) and matches there the pattern of that position's character.

Dropping alternatives that cannot match at a position never changes which alternative matches first, so the
result equals ``Alternation.regex.finditer`` match for match (span, text and ``lastgroup``). Everything is derived
from the pattern strings: a phrase added to a lexicon list is covered without further code. Phrase patterns
whose first character cannot be bounded (``.``, ``\\w``, a negated class, an empty match) go into every
dispatch pattern; if one of them can match the empty string the dispatch is switched off and
:meth:`~Alternation.matches` runs the full pattern.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

try:  # Python >= 3.11
    from re import _constants as _sre  # type: ignore[attr-defined]
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older layouts
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

__all__ = ["Alternation", "Branch", "first_chars", "split_alternatives"]

_ANY = None  #: first-character set meaning "any character"
_MAX_RANGE = 256  #: character ranges wider than this count as any character
_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", _sre.MAX_REPEAT))
_ZERO_WIDTH = (_sre.AT, _sre.ASSERT, _sre.ASSERT_NOT)


@dataclass(frozen=True)
class Branch:
    """One alternative of an :class:`Alternation`: ``prefix (?P<name>p1|p2|...) suffix``.

    ``name`` None makes the group non-capturing (``(?:...)``).
    """

    name: str | None
    patterns: tuple[str, ...]
    prefix: str = ""
    suffix: str = ""

    def source(self, patterns: Sequence[str] | None = None) -> str:
        """The regular expression of this branch, with only ``patterns`` (default: all) inside its group."""
        body = "|".join(self.patterns if patterns is None else patterns)
        group = f"(?P<{self.name}>{body})" if self.name is not None else f"(?:{body})"
        return f"{self.prefix}{group}{self.suffix}"


def _first_item(op: object, av: object) -> tuple[frozenset[str] | None, bool]:
    """(first characters, can be empty) of one parsed regular-expression item."""
    if op is _sre.LITERAL:
        return frozenset(chr(av)), False  # type: ignore[arg-type]
    if op is _sre.IN:
        chars: set[str] = set()
        for iop, iav in av:  # type: ignore[attr-defined]
            if iop is _sre.LITERAL:
                chars.add(chr(iav))
            elif iop is _sre.RANGE and iav[1] - iav[0] <= _MAX_RANGE:
                chars.update(chr(c) for c in range(iav[0], iav[1] + 1))
            else:  # NEGATE, CATEGORY (\w, \s, ...), wide ranges
                return _ANY, False
        return frozenset(chars), False
    if op in _ZERO_WIDTH:
        return frozenset(), True
    if op is _sre.SUBPATTERN:
        _group, add_flags, _del_flags, sub = av  # type: ignore[misc]
        if add_flags & re.IGNORECASE:
            return _ANY, False
        return _first_seq(sub)
    if op is getattr(_sre, "ATOMIC_GROUP", None):
        return _first_seq(av)  # type: ignore[arg-type]
    if op is _sre.BRANCH:
        out: set[str] = set()
        empty = False
        for sub in av[1]:  # type: ignore[index]
            first, sub_empty = _first_seq(sub)
            if first is _ANY:
                return _ANY, False
            out |= first
            empty |= sub_empty
        return frozenset(out), empty
    if op in _REPEATS:
        low, high, sub = av  # type: ignore[misc]
        if high == 0:
            return frozenset(), True
        first, sub_empty = _first_seq(sub)
        return first, sub_empty or low == 0
    return _ANY, False  # ANY, NOT_LITERAL, group references, ...


def _first_seq(items: Sequence[tuple[object, object]]) -> tuple[frozenset[str] | None, bool]:
    """(first characters, can be empty) of a parsed sequence; first characters None = any character."""
    out: set[str] = set()
    for op, av in items:
        first, empty = _first_item(op, av)
        if first is _ANY:
            return _ANY, False
        out |= first
        if not empty:
            return frozenset(out), False
    return frozenset(out), True


def first_chars(pattern: str) -> tuple[frozenset[str] | None, bool]:
    """(characters a match of ``pattern`` can start with or None for any, whether it can match the empty string)."""
    parsed = _sre_parse.parse(pattern)
    if parsed.state.flags & re.IGNORECASE:
        return _ANY, False
    return _first_seq(list(parsed))


def _starts_with_boundary(source: str) -> bool:
    """Whether every match of ``source`` starts at a ``\\b`` word boundary (a leading zero-width ``\\b``)."""
    for op, av in _sre_parse.parse(source):
        if op is _sre.AT and av is _sre.AT_BOUNDARY:
            return True
        if op not in _ZERO_WIDTH:
            return False
    return False


_WORD_CHAR = re.compile(r"\w")


class Alternation:
    """``|``-joined :class:`Branch` es compiled once in full (:attr:`regex`) and once per first character."""

    def __init__(self, branches: Sequence[Branch]) -> None:
        self.branches = tuple(Branch(b.name, _split_patterns(b.patterns), b.prefix, b.suffix) for b in branches)
        self.regex = re.compile("|".join(b.source() for b in self.branches))
        # per branch and phrase pattern: first characters (None = any)
        firsts: list[list[frozenset[str] | None]] = []
        self._dispatch = True
        for b in self.branches:
            row = []
            for p in b.patterns:
                chars, empty = first_chars(b.prefix + f"(?:{p})" + b.suffix)
                if empty:
                    self._dispatch = False  # an empty match: leave it to the full pattern
                row.append(chars)
            firsts.append(row)
        self._firsts = firsts
        bounded: set[str] = set()  # first characters of branches that begin with \b and a word character
        other: set[str] = set()
        self._wild = False
        for b, row in zip(self.branches, firsts, strict=True):
            if any(chars is _ANY for chars in row):
                self._wild = True
                continue
            chars = set().union(*row)
            if _starts_with_boundary(b.source()) and all(_WORD_CHAR.fullmatch(c) for c in chars):
                bounded |= chars
            else:
                other |= chars
        self._chars = frozenset(bounded | other)
        if self._wild:
            scan = r"(?s:.)"
        else:
            scan = "|".join(([rf"\b[{_char_class(bounded)}]"] if bounded else [])
                            + ([f"[{_char_class(other)}]"] if other else [])) or r"(?!)"
        self._scan = re.compile(scan)
        self._by_char: dict[str, re.Pattern[str] | None] = {}

    def _pattern_for(self, char: str) -> re.Pattern[str] | None:
        """The alternation of the branches / phrase patterns that can start with ``char`` (None if there is none)."""
        if char in self._by_char:
            return self._by_char[char]
        key = char if char in self._chars else None
        parts = []
        for b, row in zip(self.branches, self._firsts, strict=True):
            keep = [p for p, chars in zip(b.patterns, row, strict=True)
                    if chars is _ANY or (key is not None and key in chars)]
            if keep:
                parts.append(b.source(keep))
        pattern = re.compile("|".join(parts)) if parts else None
        self._by_char[char] = pattern
        return pattern

    def matches(self, text: str) -> list[re.Match[str]]:
        """The matches of :attr:`regex` in ``text``, as ``list(regex.finditer(text))`` gives them."""
        if not self._dispatch:
            return list(self.regex.finditer(text))
        out = []
        pos = 0
        by_char = self._by_char
        for cand in self._scan.finditer(text):
            p = cand.start()
            if p < pos:
                continue
            c = text[p]
            pattern = by_char[c] if c in by_char else self._pattern_for(c)
            if pattern is not None and (m := pattern.match(text, p)) is not None:
                out.append(m)
                pos = m.end()
        return out


def _char_class(chars: set[str]) -> str:
    """The characters ``chars`` escaped for use inside ``[...]``."""
    return "".join(re.escape(c) for c in sorted(chars))


def _split_patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    """``patterns`` with each one split into its top-level alternatives (kept whole if a part does not compile)."""
    out: list[str] = []
    for p in patterns:
        parts = split_alternatives(p)
        try:
            for part in parts:
                re.compile(part)
        except re.error:
            parts = (p,)
        out.extend(parts)
    return tuple(out)


def split_alternatives(pattern: str) -> tuple[str, ...]:
    """The top-level ``|`` alternatives of ``pattern`` (``"|".join`` of them gives ``pattern`` back)."""
    parts: list[str] = []
    depth, start, i, n = 0, 0, 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":  # a character class: skip to its end (a leading "]" or "^]" is literal)
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":
                i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return tuple(parts)
