"""First-character dispatch of a large regular-expression alternation: the same matches, found faster.

Python's ``re`` tries every alternative of a pattern such as ``\\b(?:(?P<e0>...)|(?P<e1>...)|...)\\b`` at every
position of the text. :class:`Alternation` takes the same pattern as :class:`Branch` es (each a named group of
phrase patterns with an optional prefix and suffix; a phrase pattern with top-level ``|`` is split into its
alternatives) and works out from the parsed patterns (:func:`prefixes`) the first three characters a match of each
phrase pattern can start with. :meth:`Alternation.matches` then

1. scans the text once for the positions where some phrase can start (one compiled pattern: a trie of the
   prefixes behind a lookahead, with ``\\b`` in front when the branches begin with ``\\b``), and
2. at each such position matches the smaller pattern of that position's first character, which holds only the
   phrase patterns (and groups) that can start with it, in their original order (compiled on first use).

Dropping alternatives that cannot match at a position never changes which alternative matches first, so the
result equals ``Alternation.regex.finditer`` match for match (span, text and ``lastgroup``). Everything is derived
from the pattern strings: a phrase added to a lexicon list is covered without further code. A phrase pattern
whose start cannot be bounded (``.``, ``\\w``, a negated class) is tried at every position; if one can match the
empty string the dispatch is switched off and :meth:`~Alternation.matches` runs the full pattern.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

try:  # Python >= 3.11
    from re import _constants as _sre  # type: ignore[attr-defined]
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older layouts
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

__all__ = ["Alternation", "Branch", "first_chars", "prefixes", "split_alternatives"]

_PREFIX_LEN = 3  #: characters of each match the scan checks (fewer when the prefix sets grow too large)
_MAX_PREFIXES = 4096
_MAX_RANGE = 256  #: character ranges wider than this count as any character
_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", _sre.MAX_REPEAT))
_ZERO_WIDTH = (_sre.AT, _sre.ASSERT, _sre.ASSERT_NOT)

#: A prefix: (text, closed). Every match starts with the text of one prefix of its set. An open prefix is all the
#: match has read so far (what follows in the pattern continues it); a closed one is final: it reached the prefix
#: length, or the next character is unknown (``\\s``, ``.``, ...).
Prefix = tuple[str, bool]
_EMPTY: frozenset[Prefix] = frozenset({("", False)})  # matches the empty string
_UNKNOWN: frozenset[Prefix] = frozenset({("", True)})  # may start with any character


class _TooMany(Exception):
    """A prefix set outgrew :data:`_MAX_PREFIXES`."""


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


def _concat(head: frozenset[Prefix], tail: frozenset[Prefix], k: int) -> frozenset[Prefix]:
    """Prefixes of a match of ``head`` followed by a match of ``tail``, cut at ``k`` characters."""
    out: set[Prefix] = set()
    for text, closed in head:
        if closed or len(text) >= k:
            out.add((text, True))
            continue
        for more, more_closed in tail:
            joined = text + more
            out.add((joined[:k], True) if len(joined) >= k else (joined, more_closed))
    if len(out) > _MAX_PREFIXES:
        raise _TooMany
    return frozenset(out)


def _item_prefixes(op: object, av: object, k: int) -> frozenset[Prefix]:
    """Prefixes of the matches of one parsed regular-expression item."""
    if op is _sre.LITERAL:
        return frozenset({(chr(av), False)})  # type: ignore[arg-type]
    if op is _sre.IN:
        chars: set[str] = set()
        for iop, iav in av:  # type: ignore[attr-defined]
            if iop is _sre.LITERAL:
                chars.add(chr(iav))
            elif iop is _sre.RANGE and iav[1] - iav[0] <= _MAX_RANGE:
                chars.update(chr(c) for c in range(iav[0], iav[1] + 1))
            else:  # NEGATE, CATEGORY (\w, \s, ...), wide ranges
                return _UNKNOWN
        return frozenset((c, False) for c in chars)
    if op in _ZERO_WIDTH:
        return _EMPTY
    if op is _sre.SUBPATTERN:
        _group, add_flags, _del_flags, sub = av  # type: ignore[misc]
        return _UNKNOWN if add_flags & re.IGNORECASE else _seq_prefixes(sub, k)
    if op is getattr(_sre, "ATOMIC_GROUP", None):
        return _seq_prefixes(av, k)  # type: ignore[arg-type]
    if op is _sre.BRANCH:
        out: set[Prefix] = set()
        for sub in av[1]:  # type: ignore[index]
            out |= _seq_prefixes(sub, k)
        return frozenset(out)
    if op in _REPEATS:
        low, high, sub = av  # type: ignore[misc]
        once = _seq_prefixes(sub, k)
        # n repetitions for n in low..high; beyond k repetitions the first k characters are those of k of them
        # (a repetition that matches nothing adds nothing, and those of k repetitions include that case)
        power, out = _EMPTY, set()
        for n in range(min(high, k) + 1):
            if n >= min(low, k):
                out |= power
            power = _concat(power, once, k)
        return frozenset(out)
    return _UNKNOWN  # ANY, NOT_LITERAL, group references, ...


def _seq_prefixes(items: Sequence[tuple[object, object]], k: int) -> frozenset[Prefix]:
    """Prefixes of the matches of a parsed sequence."""
    acc = _EMPTY
    for op, av in items:
        if all(closed or len(text) >= k for text, closed in acc):
            break
        acc = _concat(acc, _item_prefixes(op, av, k), k)
    return acc


def prefixes(pattern: str, k: int = _PREFIX_LEN) -> frozenset[Prefix]:
    """(text, closed) pairs, at most ``k`` characters: every match of ``pattern`` starts with one of the texts.

    The set has ``("", True)`` when a match may start with any character, and ``("", False)`` when ``pattern``
    can match the empty string. ``k`` shrinks when the set would grow beyond a few thousand prefixes.
    """
    parsed = _sre_parse.parse(pattern)
    if parsed.state.flags & re.IGNORECASE:
        return _UNKNOWN
    for size in range(k, 0, -1):
        try:
            return _seq_prefixes(list(parsed), size)
        except _TooMany:
            continue
    return _UNKNOWN


def first_chars(pattern: str) -> tuple[frozenset[str] | None, bool]:
    """(characters a match of ``pattern`` can start with or None for any, whether it can match the empty string)."""
    found = prefixes(pattern, 1)
    empty = ("", False) in found
    if empty or ("", True) in found:
        return None, empty
    return frozenset(text for text, _ in found), False


def _starts_with_boundary(source: str) -> bool:
    """Whether every match of ``source`` starts at a ``\\b`` word boundary (a leading zero-width ``\\b``)."""
    for op, av in _sre_parse.parse(source):
        if op is _sre.AT and av is _sre.AT_BOUNDARY:
            return True
        if op not in _ZERO_WIDTH:
            return False
    return False


def _by_first(texts: set[str]) -> dict[str, set[str]]:
    """``texts`` (non-empty strings) grouped by their first character: first character -> the rests."""
    by_first: dict[str, set[str]] = {}
    for text in texts:
        by_first.setdefault(text[0], set()).add(text[1:])
    return by_first


def _trie(texts: set[str]) -> str:
    """A regular expression that matches each of ``texts`` (non-empty strings) and nothing shorter."""
    by_first = _by_first(texts)
    arms = []
    for first in sorted(by_first):
        rests = by_first[first]
        if "" in rests:  # a shorter prefix covers the longer ones
            arms.append(re.escape(first))
        else:
            arms.append(re.escape(first) + "(?:" + _trie(rests) + ")")
    return "|".join(arms)


def _scan_source(texts: set[str]) -> str:
    """Alternation matching the first character of each of ``texts`` when the rest follows (lookahead)."""
    by_first = _by_first(texts)
    arms = []
    for first in sorted(by_first):
        rests = by_first[first]
        arms.append(re.escape(first) if "" in rests else re.escape(first) + "(?=" + _trie(rests) + ")")
    return "|".join(arms)


_WORD_CHAR = re.compile(r"\w")


class Alternation:
    """``|``-joined :class:`Branch` es: a prefix scan and one pattern per first character (module docstring)."""

    def __init__(self, branches: Sequence[Branch], prefix_len: int = _PREFIX_LEN) -> None:
        # per branch and phrase pattern: first characters (None = any)
        firsts: list[list[frozenset[str] | None]] = []
        bounded: set[str] = set()  # prefixes of branches that begin with \b and a word character
        other: set[str] = set()
        self._dispatch = True
        self._wild = False
        split: list[Branch] = []
        for b in branches:
            row: list[frozenset[str] | None] = []
            texts: set[str] = set()
            patterns, found_sets = _split_with_prefixes(b, prefix_len)
            split.append(Branch(b.name, patterns, b.prefix, b.suffix))
            for found in found_sets:
                if ("", False) in found:
                    self._dispatch = False  # an empty match: leave it to the full pattern
                if any(not text for text, _ in found):
                    row.append(None)
                    self._wild = True
                else:
                    row.append(frozenset(text[0] for text, _ in found))
                    texts |= {text for text, _ in found}
            firsts.append(row)
            if _starts_with_boundary(b.prefix) and all(_WORD_CHAR.fullmatch(t[0]) for t in texts):
                bounded |= texts
            else:
                other |= texts
        self.branches = tuple(split)
        self._firsts = firsts
        self._chars = frozenset(t[0] for t in bounded | other)
        if self._wild:
            scan = r"(?s:.)"
        else:
            scan = "|".join(([rf"\b(?:{_scan_source(bounded)})"] if bounded else [])
                            + ([f"(?:{_scan_source(other)})"] if other else [])) or r"(?!)"
        self._scan = re.compile(scan)
        self._by_char: dict[str, re.Pattern[str] | None] = {}

    @property
    def prefiltered(self) -> bool:
        """Whether :meth:`matches` skips positions (False: some phrase can start anywhere or match nothing)."""
        return self._dispatch and not self._wild

    @cached_property
    def regex(self) -> re.Pattern[str]:
        """The full pattern: the branches joined by ``|``."""
        return re.compile("|".join(b.source() for b in self.branches))

    def _pattern_for(self, char: str) -> re.Pattern[str] | None:
        """The alternation of the branches / phrase patterns that can start with ``char`` (None if there is none)."""
        if char in self._by_char:
            return self._by_char[char]
        key = char if char in self._chars else None
        parts = []
        for b, row in zip(self.branches, self._firsts, strict=True):
            keep = [p for p, chars in zip(b.patterns, row, strict=True)
                    if chars is None or (key is not None and key in chars)]
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

    def sub(self, repl: str, text: str) -> str:
        """``regex.sub(repl, text)`` for a plain replacement text ``repl`` (no group references)."""
        if "\\" in repl:
            raise ValueError(f"replacement {repl!r} has a backslash: use regex.sub")
        pieces, pos = [], 0
        for m in self.matches(text):
            pieces.append(text[pos:m.start()])
            pieces.append(repl)
            pos = m.end()
        if not pieces:
            return text
        pieces.append(text[pos:])
        return "".join(pieces)


def _split_with_prefixes(branch: Branch, k: int) -> tuple[tuple[str, ...], list[frozenset[Prefix]]]:
    """The phrase patterns of ``branch``, each split into its top-level alternatives (kept whole when a part is no
    pattern on its own), and the :func:`prefixes` of each in the branch."""
    patterns: list[str] = []
    found: list[frozenset[Prefix]] = []
    for p in branch.patterns:
        parts = split_alternatives(p)
        try:
            sets = [prefixes(f"{branch.prefix}(?:{part}){branch.suffix}", k) for part in parts]
        except re.error:
            parts, sets = (p,), [prefixes(f"{branch.prefix}(?:{p}){branch.suffix}", k)]
        patterns.extend(parts)
        found.extend(sets)
    return tuple(patterns), found


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
