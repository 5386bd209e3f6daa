"""Sentence splitting of radiology text, ILS §6 numbering and its inverse."""

from __future__ import annotations

import pytest

from cxrground.reports import (
    Sentence,
    make_sentences,
    normalise_whitespace,
    number_sentences,
    parse_numbered,
    split_sentences,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # decimals never split
        (
            "There is a 1.5 cm nodule. It measured 1.2 cm before.",
            ["There is a 1.5 cm nodule.", "It measured 1.2 cm before."],
        ),
        # titles and Latin abbreviations
        (
            "Findings were discussed with Dr. ___ at 9 am. No change.",
            ["Findings were discussed with Dr. ___ at 9 am.", "No change."],
        ),
        (
            "Opacity, e.g. pneumonia, i.e. infection. Effusion vs. atelectasis at the base.",
            ["Opacity, e.g. pneumonia, i.e. infection.", "Effusion vs. atelectasis at the base."],
        ),
        (
            "Nodule approx. 2 cm in size. Patient from St. Mary's hospital.",
            ["Nodule approx. 2 cm in size.", "Patient from St. Mary's hospital."],
        ),
        (
            "P.A. and lateral views of the chest. A.P. portable view was also obtained.",
            ["P.A. and lateral views of the chest.", "A.P. portable view was also obtained."],
        ),
        # dotted initialisms split only before a capitalised word
        (
            "Dr. ___ was paged at 3:12 p.m. on ___. Findings were discussed at 4 p.m. No pneumothorax.",
            ["Dr. ___ was paged at 3:12 p.m. on ___.", "Findings were discussed at 4 p.m.", "No pneumothorax."],
        ),
        # numbered list on separate lines, items without final periods
        (
            "1. Mild cardiomegaly\n2. Small right pleural effusion\n3. No pneumothorax.",
            ["Mild cardiomegaly", "Small right pleural effusion", "No pneumothorax."],
        ),
        # numbered list on one line (IU style), with a decimal right after a marker
        (
            "1. Negative for acute disease. 2. 1.4 cm right lower lobe nodule.",
            ["Negative for acute disease.", "1.4 cm right lower lobe nodule."],
        ),
        (
            "1. No acute process 2. Stable cardiomegaly.",
            ["No acute process", "Stable cardiomegaly."],
        ),
        # a number ending a sentence is not a list marker
        ("Heart size grade 1. Lungs are clear.", ["Heart size grade 1.", "Lungs are clear."]),
        # hard line breaks inside a sentence, blank-line paragraphs always split
        (
            "The lungs are clear\n without consolidation or\n   effusion\n\nHeart size is normal",
            ["The lungs are clear without consolidation or effusion", "Heart size is normal"],
        ),
        # de-identification blanks
        (
            "___ year old man with ___.  XXXX XXXX are normal. No XXXX.",
            ["___ year old man with ___.", "XXXX XXXX are normal.", "No XXXX."],
        ),
        # free-standing question marks and bullets
        (
            "Eval for ? pneumonia.\n- Small left effusion\n- No pneumothorax",
            ["Eval for ? pneumonia.", "Small left effusion", "No pneumothorax"],
        ),
        ("Is there pneumonia? No.", ["Is there pneumonia?", "No."]),
        # side abbreviations: "rt." / "lt." end a sentence only before a capital
        ("Small effusion at the lt. base. Opacity in the rt. lower zone.",
         ["Small effusion at the lt. base.", "Opacity in the rt. lower zone."]),
        ("Post surgery on the rt. Lungs are clear.", ["Post surgery on the rt.", "Lungs are clear."]),
        # Windows line ends, tabs and repeated spaces
        ("Heart\tnormal.  \r\nLungs   clear.", ["Heart normal.", "Lungs clear."]),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_split_sentences_drops_empty_and_punctuation_only_pieces() -> None:
    assert split_sentences("") == []
    assert split_sentences("  \n \n ") == []
    assert split_sentences("No active disease.. . ") == ["No active disease.."]


def test_normalise_whitespace() -> None:
    assert normalise_whitespace("  a\n b\t\tc  ") == "a b c"


def test_make_sentences_numbers_from_one() -> None:
    sentences = make_sentences("Heart normal. Lungs clear.")
    assert sentences == (Sentence(1, "Heart normal."), Sentence(2, "Lungs clear."))


def test_number_sentences_exact_format() -> None:
    assert number_sentences(["A.", "B."]) == "(1) A. (2) B."
    sentences = [Sentence(1, "First."), Sentence(2, "Second\n line.")]
    assert number_sentences(sentences) == "(1) First. (2) Second line."
    assert number_sentences([]) == ""


def test_number_sentences_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="sentence 2 is empty"):
        number_sentences(["A.", "  "])
    with pytest.raises(ValueError, match="position 1 has index 2"):
        number_sentences([Sentence(2, "A.")])
    with pytest.raises(ValueError):
        Sentence(0, "A.")


def test_parse_numbered_inverts_number_sentences() -> None:
    texts = [
        "Two (2) views of the chest were obtained.",
        "No acute process",
        "There is a 1.5 cm nodule (see (3) below).",
        "Stable (3) clips.",
    ]
    content = number_sentences(texts)
    assert parse_numbered(content) == list(enumerate(texts, start=1))


def test_parse_numbered_round_trip_on_split_text() -> None:
    text = (
        "IMPRESSION text: 1. Mild cardiomegaly\n2. Dr. ___ was paged at 3:12 p.m. on ___. "
        "Nodule measures approx. 1.5 cm vs. 1.2 cm before."
    )
    sentences = split_sentences(text)
    assert parse_numbered(number_sentences(sentences)) == list(enumerate(sentences, start=1))


def test_parse_numbered_prefers_markers_after_sentence_ends() -> None:
    content = "(1) A. (2) Two (2) views. (3) B."
    assert parse_numbered(content) == [(1, "A."), (2, "Two (2) views."), (3, "B.")]


def test_parse_numbered_rejects_unnumbered_text() -> None:
    assert parse_numbered("  ") == []
    with pytest.raises(ValueError, match=r"must start with '\(1\) '"):
        parse_numbered("(2) B.")


@pytest.mark.parametrize("text, expected", [
    ("Bilateral opacities (Fig. 4) demonstrated on day 3. No effusion.",
     ["Bilateral opacities (Fig. 4) demonstrated on day 3.", "No effusion."]),
    ("Opacity (see Fig. 2). 3) Effusion.", ["Opacity (see Fig. 2).", "Effusion."]),
    ("Findings: 1) opacity 2) effusion.", ["Findings:", "opacity", "effusion."]),
])
def test_figure_numbers_in_parentheses_are_not_list_markers(text: str, expected: list[str]) -> None:
    sentences = split_sentences(text)
    assert sentences == expected
    assert "(Fig. (" not in number_sentences(sentences)


@pytest.mark.parametrize(("text", "expected"), [
    # one item per line, no periods: each line is a sentence
    ("No pneumothorax\nSmall left pleural effusion\nHeart size normal",
     ["No pneumothorax", "Small left pleural effusion", "Heart size normal"]),
    # wrapped running text stays one sentence: long lines, a line ending in a joining word, a capitalised acronym
    ("There is no focal consolidation, pleural effusion or pneumothorax.  The\n cardiomediastinal silhouette is "
     "normal.",
     ["There is no focal consolidation, pleural effusion or pneumothorax.",
      "The cardiomediastinal silhouette is normal."]),
    ("There is no focal consolidation,\n effusion, or pneumothorax.",
     ["There is no focal consolidation, effusion, or pneumothorax."]),
    ("Interval placement of a left\n PICC line.", ["Interval placement of a left PICC line."]),
    ("There is a small effusion at the\n Right base.", ["There is a small effusion at the Right base."]),
])
def test_short_unpunctuated_lines_are_list_items(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_a_run_of_text_without_sentence_end_is_cut_into_bounded_pieces() -> None:
    """Reading stays linear in the text's length: a 60,000-character run without a period is cut at commas."""
    from cxrground.reports.sentences import MAX_SENTENCE_CHARS

    text = "small left effusion, " * 3000
    pieces = split_sentences(text)
    assert all(len(p) <= MAX_SENTENCE_CHARS for p in pieces) and all(p.endswith(",") for p in pieces[:-1])
    assert " ".join(pieces) == text.strip()
