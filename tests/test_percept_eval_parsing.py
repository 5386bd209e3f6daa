"""Answer parsing (CHEXPERCEPT.md §14): the reference parser's edge cases and the parse labels."""

from __future__ import annotations

import pytest

from cxrground.evaluation.percept.parsing import is_correct, parse_answer, reference_parse

YES_NO = ["Yes", "No"]
POINTS = ["red point", "orange point", "None"]
DIST = ["1 zone", "2 zones", "3 zones", "4 zones or more"]
SEV = ["Less than 1/3 of the left lung area", "1/3 or more but less than 2/3 of the left lung area",
       "2/3 or more of the left lung area"]
LOC = ["the left costophrenic angle", "the intersection of the right lateral lung and the right lower zone lung",
       "the intersection of the left medial lung and the left mid zone lung", "None of the above (options 1-3)"]


@pytest.mark.parametrize(("text", "expected"), [
    ("Answer: 1 and 3", [1]),
    ("Answer: 1; 3", [1]),
    ("Answer: None", [-1]),
    ("Yes", [-1]),
    ("None", [-1]),
    ("zone 2 and 3", [2, 3]),
    ("**Answer:** 2", [2]),
    ("Answer: 1,3", [1, 3]),
    ("Answer: (2)", [2]),
    ("answer : 1 , 3", [1, 3]),
    ("Answer: 1\nlater text. Answer: 2", [2]),  # the last match
    ("<think>Answer: 1</think>Answer: 2", [2]),
    ("<think>long reasoning with Answer: 1 inside</think>\nThe lesion is absent.", [-1]),
    ("<unused94>thought<unused95>Answer: 2", [2]),
    ("<|begin_of_box|>2<|end_of_box|>", [2]),
    ("The final answer is $\\boxed{2}$", [2]),
    ("The final answer is $\\boxed{1,3}$", [1]),  # rule 4 takes "then digits" literally (reference)
    ("\\boxed{1, 3}", [1, 3]),
    ("\\boxed{2}", [2]),
    ("My final answer: option 4", [4]),
    ("1, 3", [1, 3]),
    ("2.", [2]),
    ("The answer is 3 because of the shape", [3]),
    ("Looking at it\n2\nDone", [2]),
    ("", [-1]),
    ("   ", [-1]),
    (None, [-1]),
    ("1/3 or more but less than 2/3 of the left lung area", [1, 3, 2, 3]),
    ("None of the above (options 1-3)", [1, 3]),
    ("reasoning</think>Answer: 1", [1]),
])
def test_reference_parser(text, expected):
    assert reference_parse(text) == expected


def test_labels_parsed_matched_unparseable():
    assert parse_answer("Answer: 2", YES_NO, False).label == "parsed"
    yes = parse_answer("Yes", YES_NO, False)
    assert yes.label == "matched-by-text" and yes.matched == (1,) and yes.numbers == (-1,)
    assert parse_answer("**No.**", YES_NO, False).matched == (2,)
    assert parse_answer("Answer: None", POINTS, True).matched == (3,)
    both = parse_answer("red point, orange point", POINTS, True)
    assert both.label == "matched-by-text" and both.matched == (1, 2)
    # an echoed option text with digits: canonical numbers are spurious, the text match is exact
    sev = parse_answer(SEV[1], SEV, False)
    assert sev.numbers == (1, 3, 2, 3) and sev.label == "matched-by-text" and sev.matched == (2,)
    assert parse_answer(LOC[3], LOC, True).matched == (4,)
    # "1 zone" parses canonically to option 1 (a valid single number)
    assert parse_answer("1 zone", DIST, False).label == "parsed"
    assert parse_answer("Answer: 7", YES_NO, False).label == "unparseable"
    assert parse_answer("Maybe", YES_NO, False).label == "unparseable"
    assert parse_answer(None, YES_NO, False).label == "unparseable"
    assert parse_answer("", YES_NO, False).label == "unparseable"
    # a multi-number answer to a single-answer question is not cleanly parsed
    assert parse_answer("Answer: 1,2", YES_NO, False).label == "unparseable"
    assert parse_answer("Answer: 1,2", POINTS, True).label == "parsed"


def test_ambiguous_option_text_is_not_matched():
    assert parse_answer("same", ["same", "same", "None"], True).label == "unparseable"
    assert parse_answer("red point, blue point", POINTS, True).label == "unparseable"


def test_scoring_rules():
    assert is_correct([1, 3], [1], False)  # single answer: the first number
    assert not is_correct([3, 1], [1], False)
    assert is_correct([3, 1], [1, 3], True)  # multi-select: set equality
    assert not is_correct([1], [1, 3], True)
    assert not is_correct([-1], [3], True)
    assert not is_correct([], [1], False)
    assert is_correct(parse_answer("Yes", YES_NO, False).effective, [1], False)
    assert not is_correct(parse_answer("Yes", YES_NO, False).numbers, [1], False)
