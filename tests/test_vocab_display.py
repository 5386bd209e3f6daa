"""Readable names of internal keys (review pages) and the stem of a CheXpercept question, from the vocabulary."""

from __future__ import annotations

from cxrground.vocab.display import ils_item_type_label, path_label, section_label
from cxrground.vocab.percept_templates import detection_stem, format_question, question_stem


def test_internal_keys_have_readable_names_and_unknown_ones_stay_as_they_are() -> None:
    assert section_label("last_paragraph") == "last paragraph (the report has no findings or impression)"
    assert section_label("findings") == "findings" and section_label("odd_key") == "odd_key"
    assert ils_item_type_label("lesion_inference positive") == "lesion-inference instruction, positive pair"
    assert ils_item_type_label("global negative") == "global instruction, negative pair"
    assert ils_item_type_label("basic") == "basic" and ils_item_type_label("other positive") == "other positive"
    assert path_label("RR") == "revision required (RR)" and path_label("LF") == "lesion free (LF)"
    assert path_label("XX") == "XX"


def test_the_stem_of_a_question_is_the_exact_text_before_its_options() -> None:
    stem = detection_stem("edema")
    text = format_question(stem, ["Yes", "No"])
    assert question_stem(text, ["Yes", "No"]) == stem
    assert question_stem(text, ["No", "Yes"]) is None  # other options: not this layout
    assert question_stem(stem, ["Yes", "No"]) is None
