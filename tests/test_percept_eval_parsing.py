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
    ("The final answer is $\\boxed{1,3}$", [1, 3]),  # rule 4 takes a comma list (reference)
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


# Hand-written expectations; each was checked against the reference implementation's behaviour (its pass-1 parser
# and pass-2 normaliser run on the same string), none of its code is used here.
@pytest.mark.parametrize(("text", "expected"), [
    # pass 1 rule 4: "final answer", then any "$", then a comma list
    ("The final answer is $1,3$", [1, 3]),
    ("final answer is 1, 3 because", [1, 3]),
    ("Final answer: 1,3", [1, 3]),
    ("The final answer is $$2$$", [2]),
    ("FINAL ANSWER: $ 2 $", [2]),
    ("final answer\n\n2", [2]),
    ("The finalanswer is 2", [2]),
    ("The answer is 2. Final answer: 3", [3]),  # pass 1 (final answer) before pass 2 (answer is)
    # pass 2: "answer(s) is/are", then digits, commas and any whitespace (spaces, newlines)
    ("The answer is 1 3", [1, 3]),
    ("The answers are: 1, 3", [1, 3]),
    ("The answers are 1 and 3.", [1]),  # the digit run stops at "and"
    ("The answer is 2\n3 zones", [2, 3]),
    ("The answer is 1\n\n\n3", [1, 3]),
    ("The answeris 2", [2]),
    ("the ANSWER ARE 4", [4]),
    ("answer isn't 2 but 3", [2, 3]),  # no digit after "answer is": every number
    # pass 2: the last line of digits/commas/spaces, every number on it
    ("I choose\n1 3", [1, 3]),
    ("I choose\n1, 3", [1, 3]),
    ("I choose\n1,3\nthanks", [1, 3]),
    ("blah\n, ,\n2", [2]),  # a line without digits is skipped
    ("blah 5\r2", [5, 2]),  # only "\n" ends a line
    ("x\r\n2\r\n", [2]),
    # thinking: complete blocks only; text before an unmatched </think> stays
    ("reasoning 4 and 5</think>\nThe lesion is absent.", [4, 5]),
    ("Answer: 3 … </think> lesion absent", [3]),
    ("<think>unclosed 1 2", [1, 2]),
    ("<think>a</think><think>b 3</think>2", [2]),
    ("<unused94>thought 7<unused95>absent", [7]),
    # \boxed{} needs at least one digit, comma or space to be unwrapped
    ("\\boxed{}", [-1]),
    ("$\\boxed{4}$", [4]),
    ("Answer: \\boxed{2}", [2]),
    # other shapes
    ("Answer: 1, 2 and Answer: 3", [3]),
    ("Answer: 0", [0]),
    ("Answer: -1", [1]),
    ("Answer: A", [-1]),
    ("Option B", [-1]),
    ("1\n3", [1, 3]),  # a bare-number reply (pass 1 rule 5)
    ("1 3", [1, 3]),
    (". . .", [-1]),
    ("x" * 20000 + " Answer: 2", [2]),
    ("reason " * 5000 + "\n1, 3", [1, 3]),
])
def test_reference_parser_matches_reference_behaviour(text, expected):
    assert reference_parse(text) == expected


def test_glm_box_tags_are_unwrapped_for_every_model():
    # the reference unwraps them only for GLM model ids; the tags carry no digits
    assert reference_parse("<|begin_of_box|>2<|end_of_box|>") == [2]
    assert reference_parse("<|begin_of_box|>Answer: 1,3<|end_of_box|>") == [1, 3]


def test_labels():
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
    # an option text is matched by text (CHEXPERCEPT.md §14: `2nd mask`), even where its digits parse canonically
    # to the same option ("1 zone" -> [1])
    zone = parse_answer("1 zone", DIST, False)
    assert zone.label == "matched-by-text" and zone.numbers == (1,) and zone.matched == (1,)
    second = parse_answer("2nd mask", ["1st mask", "2nd mask", "3rd mask"], False)
    assert second.label == "matched-by-text" and second.numbers == (2,) and second.matched == (2,)
    assert parse_answer("Answer: 2", ["1st mask", "2nd mask", "3rd mask"], False).label == "parsed"
    # numbers extracted, but not a valid answer: invalid-format (scored as the reference scores it)
    assert parse_answer("Answer: 7", YES_NO, False).label == "invalid-format"
    assert parse_answer("Answer: 1,2", YES_NO, False).label == "invalid-format"
    assert parse_answer("Answer: 1,2", POINTS, True).label == "parsed"
    # nothing extracted: unparseable
    assert parse_answer("Maybe", YES_NO, False).label == "unparseable"
    assert parse_answer(None, YES_NO, False).label == "unparseable"
    assert parse_answer("", YES_NO, False).label == "unparseable"
    assert parse_answer("Answer: None", YES_NO, False).label == "unparseable"
    # an unmatched </think> is ignored for the option-text match only (the canonical numbers keep it)
    think = parse_answer("thinking about 3 zones</think>\nNo", YES_NO, False)
    assert think.numbers == (3,) and think.label == "matched-by-text" and think.matched == (2,)


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
    assert not is_correct([-1], [1], False)


# label / score consistency: what each answer scores against every possible GT of a Yes/No question
@pytest.mark.parametrize(("text", "label", "correct_for"), [
    ("Answer: 1", "parsed", {1}),
    ("Answer: 1,2", "invalid-format", {1}),  # the reference scores the first number
    ("I see 1 opacity and 2 effusions", "invalid-format", {1}),
    ("Answer: 7", "invalid-format", set()),
    ("Yes", "matched-by-text", set()),  # canonical [-1]; correct in the lenient view only
    ("I cannot tell.", "unparseable", set()),
    ("Answer: None", "unparseable", set()),
    ("", "unparseable", set()),
    (None, "unparseable", set()),
])
def test_label_and_score_agree(text, label, correct_for):
    p = parse_answer(text, YES_NO, False)
    assert p.label == label
    assert {gt for gt in (1, 2) if is_correct(p.numbers, [gt], False)} == correct_for


def test_unextractable_answers_are_wrong_for_every_question_kind():
    for text in ("", "   ", None, "I cannot tell.", "Answer: none of them", "<think>2</think>"):
        for options, multi in ((YES_NO, False), (POINTS, True), (LOC, True), (DIST, False)):
            p = parse_answer(text, options, multi)
            assert p.numbers == (-1,) and p.label in ("unparseable", "matched-by-text")
            n = len(options)
            gts = [[g] for g in range(1, n + 1)] + ([[1, 2], [1, 3], list(range(1, n + 1))] if multi else [])
            assert not any(is_correct(p.numbers, gt, multi) for gt in gts)

