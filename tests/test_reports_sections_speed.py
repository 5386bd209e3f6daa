"""The faster forms of the section parser and section choice give what the plain forms give (issue 16)."""

from __future__ import annotations

import random
import re

from cxrground.evaluation.report_quality import synthetic_cases
from cxrground.reports import (
    MERGED_SECTION,
    find_headings,
    make_section_choice,
    merge_sections,
    parse_report_text,
    parse_sections,
    select_section,
)
from cxrground.reports import sections as sections_module
from cxrground.reports.sections import HEADINGS, sections_and_headings

#: The inline-heading pattern as first written; ``sections._INLINE_HEADING`` takes its first blank out in front.
_INLINE_PLAIN = re.compile(
    r"(?:(?<=[.!?;])[ \t]+|[ \t]{2,})(?P<name>"
    + "|".join(re.escape(k.upper()) for k in sorted(HEADINGS, key=len, reverse=True))
    + r")[ \t]*:(?=\s|$)"
)
_PIECES = [" ", "  ", "\t", ".", ";", "!", "?", "\n", "\n\n", ":", "FINDINGS", "IMPRESSION", "COMPARISON",
           "FINDINGS/IMPRESSION", "Impression", "x", "X", "XX", "XXXX", "_", "___", "a", "7", "No effusion.",
           ". IMPRESSION:", ".  FINDINGS :", "  CONCLUSION:", "; COMPARISON:\t", ". \tWET READ: "]


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 14))) for _ in range(n)]


def _synthetic_texts() -> list[str]:
    return [c.text for c in synthetic_cases(60, seed=3)]


def test_inline_heading_pattern_matches_as_first_written() -> None:
    texts = _random_texts(5000) + _synthetic_texts()
    found = 0
    for text in texts:
        plain = [(m.span(), m.span("name")) for m in _INLINE_PLAIN.finditer(text)]
        assert [(m.span(), m.span("name")) for m in sections_module._INLINE_HEADING.finditer(text)] == plain, text
        found += bool(plain)
    assert found > 50


def test_has_words_as_with_blanks_removed() -> None:
    for text in _random_texts(5000):
        plain = bool(sections_module._WORD.search(sections_module._BLANKS.sub(" ", text)))
        assert sections_module._has_words(text) == plain, text
    assert not sections_module._has_words("XXXX ___ XX.")
    assert sections_module._has_words("XXXX ___ 7")


def test_sections_and_headings_in_one_pass() -> None:
    for text in _random_texts(500) + _synthetic_texts():
        assert sections_and_headings(text) == (parse_sections(text), find_headings(text))


def test_merged_choice_equals_merging_the_single_choices() -> None:
    merged = 0
    for text in _synthetic_texts():
        report = parse_report_text(text, "r")
        singles = [c for name in ("findings", "impression")
                   if (c := make_section_choice(name, report.sections.get(name, ""))) is not None]
        choice = select_section(report, MERGED_SECTION)
        if singles:
            assert choice == merge_sections(singles)
            merged += len(singles) == 2
    assert merged > 10
