"""The rule structurer on the hand-checked tricky sentences (negation, hedges, alternatives, laterality, history,
recommendations, splitting) of :mod:`tricky_sentences`, under both alternatives policies, and on its broad set of
common phrasings (:data:`tricky_sentences.BROAD`)."""

from __future__ import annotations

import pytest

from cxrground.errors import ConfigError
from cxrground.reports import make_section_choice
from cxrground.reports.structure import ALTERNATIVE_POLICIES, RULES_VERSION, RuleStructurer, get_structurer
from tricky_sentences import ALTERNATIVES_PRESENT, BROAD, HEDGE_GRADES, LOOKALIKES, MIMIC_STYLE, ROUND5, TRICKY


def _read(structurer: RuleStructurer, sentence: str) -> list[tuple[str, str, tuple[str, ...]]]:
    section = make_section_choice("findings", sentence)
    assert section is not None
    return [(f.lesion or f.entity.lower(), f.assertion, f.reported_location)
            for f in structurer.structure("t", section).findings]


@pytest.mark.parametrize(("kind", "sentence", "expected"), TRICKY, ids=[f"{k}:{s[:40]}" for k, s, _ in TRICKY])
def test_tricky_sentence_default_policy(kind: str, sentence: str, expected: list) -> None:
    assert _read(RuleStructurer(), sentence) == expected


@pytest.mark.parametrize(("kind", "sentence", "expected"), BROAD, ids=[f"{k}:{s[:40]}" for k, s, _ in BROAD])
def test_broad_phrasing_default_policy(kind: str, sentence: str, expected: list) -> None:
    assert _read(RuleStructurer(), sentence) == expected


def test_broad_set_is_large_weighted_and_distinct() -> None:
    kinds = [k for k, _, _ in BROAD]
    assert len(BROAD) >= 50
    # weighted toward the lesions the pack's reports can hardly test
    assert min(kinds.count(k) for k in ("pneumonia", "edema", "consolidation")) >= 10
    sentences = [s for _, s, _ in TRICKY + LOOKALIKES + BROAD + ROUND5 + MIMIC_STYLE]
    assert len(set(sentences)) == len(sentences)
    # every assertion value occurs for the under-represented lesions
    for lesion in ("pneumonia", "edema", "consolidation"):
        seen = {a for _, _, exp in BROAD for name, a, _ in exp if name == lesion}
        assert seen == {"present", "uncertain", "absent"}, lesion


@pytest.mark.parametrize(("kind", "sentence", "expected"), MIMIC_STYLE, ids=[s[:40] for _, s, _ in MIMIC_STYLE])
def test_mimic_style_phrasing_default_policy(kind: str, sentence: str, expected: list) -> None:
    assert _read(RuleStructurer(), sentence) == expected


@pytest.mark.parametrize(("kind", "sentence", "expected"), ROUND5, ids=[f"{k}:{s[:40]}" for k, s, _ in ROUND5])
def test_round5_rules_default_policy(kind: str, sentence: str, expected: list) -> None:
    assert _read(RuleStructurer(), sentence) == expected


@pytest.mark.parametrize(("sentence", "expected"), HEDGE_GRADES, ids=[s[:40] for s, _ in HEDGE_GRADES])
def test_hedge_grades(sentence: str, expected: list) -> None:
    section = make_section_choice("findings", sentence)
    assert section is not None
    findings = RuleStructurer().structure("t", section).findings
    assert [(f.lesion or f.entity.lower(), f.hedge) for f in findings] == expected
    # the grade is extra information: the ILS assertion of every graded finding is uncertain
    assert all((f.hedge is not None) == (f.assertion == "uncertain") for f in findings)


@pytest.mark.parametrize(("kind", "sentence", "expected"), LOOKALIKES, ids=[s[:40] for _, s, _ in LOOKALIKES])
def test_lookalike_phrases_are_not_lesions(kind: str, sentence: str, expected: list) -> None:
    assert _read(RuleStructurer(), sentence) == expected


@pytest.mark.parametrize("sentence", sorted(ALTERNATIVES_PRESENT))
def test_tricky_sentence_alternatives_present(sentence: str) -> None:
    assert _read(RuleStructurer(alternatives="present"), sentence) == ALTERNATIVES_PRESENT[sentence]


def test_table_covers_every_kind_and_is_large_enough() -> None:
    kinds = {k for k, _, _ in TRICKY}
    assert kinds >= {"negation", "hedge", "alternatives", "laterality", "history", "recommendation"}
    assert len(TRICKY) >= 40
    assert all(s in {t for _, t, _ in TRICKY} for s in ALTERNATIVES_PRESENT)


def test_alternatives_policy_is_validated_and_recorded() -> None:
    assert ALTERNATIVE_POLICIES == ("uncertain", "present")
    assert RuleStructurer().provenance == {"name": "rules", "version": RULES_VERSION, "alternatives": "uncertain"}
    assert get_structurer("rules", alternatives="present").provenance["alternatives"] == "present"
    with pytest.raises(ConfigError, match="alternatives"):
        RuleStructurer(alternatives="maybe")
    # a negated list stays absent under both policies
    for policy in ALTERNATIVE_POLICIES:
        both = ("right lung", "left lung")
        assert _read(RuleStructurer(alternatives=policy), "No effusion or pneumothorax.") == [
            ("effusion", "absent", both), ("pneumothorax", "absent", both)]
