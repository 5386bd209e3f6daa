"""First-character dispatch of the lexicon's alternations (:mod:`cxrground.reports.structure.dispatch`).

The dispatch is a speed device only: it must find exactly the matches of the full regular expressions, and the
rule structurer must give the same findings with it and without it (the full patterns), on every hand-checked
sentence and on the pack's Open-i reports.
"""

from __future__ import annotations

import random
import re

import pytest

from cxrground.datasets.pack import Pack
from cxrground.reports import SECTION_POLICIES, make_section_choice, read_report, select_section
from cxrground.reports.structure import ALTERNATIVE_POLICIES, RuleStructurer
from cxrground.reports.structure import rules as rules_module
from cxrground.reports.structure.dispatch import Alternation, Branch, first_chars, prefixes, split_alternatives
from cxrground.reports.structure.lexicon import (
    CUE_MATCHER,
    CUE_RE,
    ENTITY_MATCHER,
    ENTITY_RE,
    LOCATION_MATCHER,
    LOCATION_RE,
)
from tricky_sentences import ALTERNATIVES_PRESENT, BROAD, LOOKALIKES, TRICKY

SENTENCES = [s for _, s, _ in (*TRICKY, *LOOKALIKES, *BROAD)] + list(ALTERNATIVES_PRESENT)
LEXICON = [("entity", ENTITY_RE, ENTITY_MATCHER), ("cue", CUE_RE, CUE_MATCHER), ("location", LOCATION_RE,
                                                                               LOCATION_MATCHER)]


def _key(matches) -> list[tuple[tuple[int, int], str | None, str]]:
    return [(m.span(), m.lastgroup, m.group()) for m in matches]


# --- prefix analysis -------------------------------------------------------------------------------------------


def test_prefixes_follow_the_pattern_structure() -> None:
    assert prefixes(r"abc|abd", 2) == {("ab", True)}
    assert prefixes(r"\bfoo\b", 3) == {("foo", True)}
    assert prefixes(r"(?<!consistent )(?<!seen )\bwith\b", 2) == {("wi", True)}
    # an optional first word: both starts; \s is any white space, so the prefix closes there
    assert prefixes(r"(?:mild\s+)?edema", 3) == {("mil", True), ("ede", True)}
    assert prefixes(r"(?:is\s+)?seen", 3) == {("is", True), ("see", True)}
    # repeats: every count from the minimum; open prefixes may end the match
    assert prefixes(r"a{0,2}b", 3) == {("b", False), ("ab", False), ("aab", True)}
    assert prefixes(r"(?:ab)+c", 3) == {("aba", True), ("abc", True)}
    assert prefixes(r"[xy]z", 2) == {("xz", True), ("yz", True)}


def test_prefixes_unknown_and_empty() -> None:
    assert prefixes(r"\w+ing", 3) == {("", True)}  # may start with any word character
    assert prefixes(r"[^a]b", 2) == {("", True)}
    assert prefixes(r"(?i)abc", 3) == {("", True)}
    assert prefixes(r"(?i:abc)d", 3) == {("", True)}
    assert ("", False) in prefixes(r"a?", 2)  # the empty match
    assert first_chars(r"\bno\s+(?:x|y)") == (frozenset("n"), False)
    assert first_chars(r"(?:a|b)?c") == (frozenset("abc"), False)
    assert first_chars(r"a*") == (None, True)
    assert first_chars(r".x") == (None, False)


def test_prefix_sets_stay_bounded() -> None:
    # 26^3 prefixes would exceed the bound: the analysis falls back to shorter prefixes
    letters = "abcdefghijklmnopqrstuvwxyz"
    assert prefixes(r"[a-z][a-z][a-z]", 3) == {(a + b, True) for a in letters for b in letters}


def test_split_alternatives_at_the_top_level_only() -> None:
    pattern = r"a|(b|c)|[|]|\|d|[]|]x|(?:e|f)g"
    parts = split_alternatives(pattern)
    assert parts == ("a", "(b|c)", "[|]", r"\|d", "[]|]x", "(?:e|f)g")
    assert "|".join(parts) == pattern


# --- Alternation = the full pattern ----------------------------------------------------------------------------

_TOKENS = ["no", "not", "with", "without", "mild", "edema", "pleural", "effusion", "effusions", "mass", "masslike",
           "consistent", "seen", "is", "a", "an", "x", "xx", " ", " ", " ", ",", ";", "?", ".", "-", "12", "cm",
           "b", "ab", "aab", "c", "abc", "_", "é"]


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_TOKENS) for _ in range(rng.randint(0, 16))) for _ in range(n)]


_BRANCHES = [
    Branch("g0", (r"pleural\s+effusions?", r"(?:mild\s+)?o?edema"), r"\b", r"\b"),
    Branch("g1", (r"effusions?", r"masslike", r"mass"), r"\b", r"\b"),
    Branch("g2", (r"(?:is\s+)?(?:not\s+)?seen",), r"\b", r"(?![\w-])"),
    Branch("g3", (r"(?<!consistent )\bwith\b|\bwithout\b", r"\bno\b"), r"\b"),
    Branch("g4", (r";|,\s+(?=(?:no|a)\b)", r"\?")),
    Branch(None, (r"a{0,2}b", r"(?:ab)+c")),
]


@pytest.mark.parametrize("extra", [
    [],
    [Branch("wild", (r"\d+\s*cm",), r"\b")],  # a first character that cannot be bounded: every position is tried
    [Branch("empty", (r"x?",))],  # an empty match: the dispatch is switched off
], ids=["bounded", "wildcard", "empty-match"])
def test_alternation_finds_the_matches_of_the_full_pattern(extra: list[Branch]) -> None:
    alternation = Alternation([*_BRANCHES, *extra])
    for text in _random_texts(3000):
        assert _key(alternation.matches(text)) == _key(alternation.regex.finditer(text)), text
        assert alternation.sub(" ", text) == alternation.regex.sub(" ", text), text


def test_alternation_sub_refuses_group_references() -> None:
    with pytest.raises(ValueError, match="backslash"):
        Alternation(_BRANCHES).sub(r"\1", "mass")


def test_a_phrase_added_to_a_lexicon_list_is_found_without_other_changes() -> None:
    grown = Alternation([Branch(b.name, b.patterns + ((r"zebra\s+lesions?",) if b.name == "e0" else ()), b.prefix,
                                b.suffix) for b in ENTITY_MATCHER.branches])
    text = "small zebra lesions at the right base with a pleural effusion."
    assert [(m.group(), m.lastgroup) for m in grown.matches(text)][:1] == [("zebra lesions", "e0")]
    assert _key(grown.matches(text)) == _key(grown.regex.finditer(text))


@pytest.mark.parametrize(("name", "regex", "matcher"), LEXICON, ids=[n for n, _, _ in LEXICON])
def test_lexicon_phrases_have_bounded_starts(name, regex, matcher) -> None:
    """Speed guard: a lexicon phrase that can start with any character (``\\w...``, ``.``) or match nothing makes
    the dispatch try every position; start such a phrase with its literal words instead."""
    assert matcher.prefiltered, f"the {name} dispatch tries every position: see Alternation.prefiltered"
    assert not Alternation([Branch("x", (r"\w+ing",))]).prefiltered
    assert not Alternation([Branch("x", (r"a?",))]).prefiltered


@pytest.mark.parametrize(("name", "regex", "matcher"), LEXICON, ids=[n for n, _, _ in LEXICON])
def test_lexicon_matchers_equal_the_lexicon_patterns_on_the_hand_checked_sentences(name, regex, matcher) -> None:
    for sentence in SENTENCES:
        low = sentence.lower()
        assert _key(matcher.matches(low)) == _key(regex.finditer(low)), sentence


@pytest.mark.parametrize(("name", "regex", "matcher"), LEXICON, ids=[n for n, _, _ in LEXICON])
def test_lexicon_matchers_equal_the_lexicon_patterns_on_the_pack_reports(pack_dir, name, regex, matcher) -> None:
    texts = [text.lower() for p in Pack(pack_dir).iu_report_paths() for text in read_report(p).sections.values()]
    assert len(texts) > 300
    for text in texts:
        assert _key(matcher.matches(text)) == _key(regex.finditer(text)), text


# --- the structurer with and without the dispatch --------------------------------------------------------------


class _FullPattern:
    """The interface of :class:`Alternation` answered by the full regular expression (no dispatch)."""

    def __init__(self, regex: re.Pattern[str]) -> None:
        self.regex = regex

    def matches(self, text: str) -> list[re.Match[str]]:
        return list(self.regex.finditer(text))

    def sub(self, repl: str, text: str) -> str:
        return self.regex.sub(repl, text)


def _rows(sections: list[tuple[str, object]]) -> list[dict]:
    out = []
    for alternatives in ALTERNATIVE_POLICIES:
        structurer = RuleStructurer(alternatives=alternatives)
        for rid, section in sections:
            out.extend(structurer.structure(rid, section).finding_rows())  # type: ignore[arg-type]
    return out


def _with_and_without_dispatch(sections: list[tuple[str, object]], monkeypatch) -> tuple[list[dict], list[dict]]:
    fast = _rows(sections)
    with monkeypatch.context() as m:
        m.setattr(rules_module, "ENTITY_MATCHER", _FullPattern(ENTITY_RE))
        m.setattr(rules_module, "CUE_MATCHER", _FullPattern(CUE_RE))
        m.setattr(rules_module, "LOCATION_MATCHER", _FullPattern(LOCATION_RE))
        full = _rows(sections)
    return fast, full


def test_structurer_same_findings_without_dispatch_on_the_hand_checked_sentences(monkeypatch) -> None:
    sections = [(f"s{i}", make_section_choice("findings", s)) for i, s in enumerate(SENTENCES)]
    fast, full = _with_and_without_dispatch(sections, monkeypatch)
    assert len(fast) > 400
    assert fast == full


def test_structurer_same_findings_without_dispatch_on_the_pack_reports(pack_dir, monkeypatch) -> None:
    reports = [read_report(p) for p in Pack(pack_dir).iu_report_paths()]
    sections = [(r.report_id, s) for policy in SECTION_POLICIES for r in reports
                if (s := select_section(r, policy)) is not None]
    fast, full = _with_and_without_dispatch(sections, monkeypatch)
    assert len(fast) > 1000
    assert fast == full
