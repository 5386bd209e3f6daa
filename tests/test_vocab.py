"""Every template string pinned twice: to a literal snapshot here and to the text of the specs."""

from __future__ import annotations

import re

import pytest

from cxrground.vocab import ils_templates as ils
from cxrground.vocab import lesions, locations
from cxrground.vocab import percept_templates as pt

# --- snapshot: the exact strings ------------------------------------------------------------------
ILS_SNAPSHOT = {
    "BASIC_INSTRUCTION": "Segment the {target} in the {location}.",
    "BASIC_POSITIVE": "[SEG]",
    "BASIC_NEGATIVE": "[SEG] There is no {target} in the {location}.",
    "GLOBAL_INSTRUCTION": "Segment the {target}.",
    "GLOBAL_POSITIVE": "[SEG] It is located in the {location}.",
    "GLOBAL_POSITIVE_CARDIOMEGALY": "[SEG]",
    "GLOBAL_NEGATIVE": "[SEG] There is no {target}.",
    "LESION_INFERENCE_INSTRUCTION": "Segment the opacity in the {location} and predict its type.",
    "LESION_INFERENCE_DEFINITIVE": "[SEG] It is highly suggestive of {lesion}.",
    "LESION_INFERENCE_TENTATIVE": "[SEG] It possibly reflects {lesion}.",
    "LESION_INFERENCE_NEGATIVE": "[SEG] There is no opacity in the {location}.",
    "RADEDIT_PROMPT": "No acute cardiopulmonary process",
}


def test_ils_snapshot():
    for name, text in ILS_SNAPSHOT.items():
        assert getattr(ils, name) == text, name


def _spec_form(template: str) -> str:
    """ILS spec writes placeholders as [Target], [Location], [Lesion]."""
    return template.replace("{target}", "[Target]").replace("{location}", "[Location]").replace("{lesion}", "[Lesion]")


def test_ils_templates_appear_verbatim_in_spec(spec_text):
    text = spec_text["ils"]
    for name, template in ILS_SNAPSHOT.items():
        assert f"`{_spec_form(template)}`" in text, name
    assert ils.LLAVA_SYSTEM in text
    assert "{system} USER: <im_start><image><im_end>\\n{instruction} ASSISTANT: {answer}</s>" in text
    assert ils.LLAVA_TRAINING == "{system} USER: <im_start><image><im_end>\n{instruction} ASSISTANT: {answer}</s>"


def test_ils_vocabulary_matches_spec(spec_text):
    text = spec_text["ils"]
    assert lesions.LESIONS == ("cardiomegaly", "pneumonia", "atelectasis", "opacity", "consolidation", "edema",
                               "effusion")
    assert "`" + ", ".join(lesions.EVAL_ORDER) in text.replace("\n  ", " ")
    for label in locations.ILS_LOCATION_LABELS:
        assert f"| `{label}` |" in text, label
    assert len(set(locations.ILS_LOCATION_LABELS)) == 10
    assert "right lung apex" not in locations.ILS_LOCATION_LABELS


def test_ils_rendering_examples_from_spec():
    assert ils.instruction("basic", "pneumonia", ["right lung"]) == "Segment the pneumonia in the right lung."
    assert ils.positive_answer("global", "opacity", ["right lung base", "left lung base"]) == (
        "[SEG] It is located in the right lung base and left lung base."
    )
    assert ils.negative_answer("basic", "atelectasis", ["left lung base"]) == (
        "[SEG] There is no atelectasis in the left lung base."
    )
    assert ils.instruction("lesion_inference", "opacity", ["right lung"]) == (
        "Segment the opacity in the right lung and predict its type."
    )
    assert ils.positive_answer("lesion_inference", "pneumonia", ["right lung"], "tentative") == (
        "[SEG] It possibly reflects pneumonia."
    )
    assert ils.positive_answer("global", "cardiomegaly") == "[SEG]"
    assert ils.negative_answer("global", "cardiomegaly") == "[SEG] There is no cardiomegaly."
    assert ils.negative_answer("lesion_inference", "opacity", ["left apical zone lung"]) == (
        "[SEG] There is no opacity in the left apical zone lung."
    )
    with pytest.raises(ValueError):
        ils.instruction("basic", "edema", [])
    prompt = ils.llava_prompt("Segment the edema.")
    assert prompt.endswith("USER: <im_start><image><im_end>\nSegment the edema. ASSISTANT:")
    assert ils.llava_prompt("Segment the edema.", "[SEG]").endswith("ASSISTANT: [SEG]</s>")


def test_join_rules():
    assert locations.join_ils(["a"]) == "a"
    assert locations.join_ils(["right mid zone lung", "right lung base"]) == "right mid zone lung and right lung base"
    assert locations.join_ils(["a", "b", "c"]) == "a, b and c"
    assert locations.join_percept(["a", "b", "c"]) == "a, b, and c"
    assert locations.join_percept(["a", "b", "a"]) == "a and b"
    for labels in (["left lung base"], ["right lung", "left lung"], list(locations.ILS_LOCATION_LABELS[2:6])):
        assert locations.split_ils(locations.join_ils(labels)) == labels


PERCEPT_STRINGS = [
    pt.DETECTION_PLAIN, pt.DETECTION_SUGGESTIVE, pt.CONTOUR_EVAL, pt.HEART_NOTE, pt.INITIAL_CONTEXT,
    pt.EXPANSION, pt.CONTRACTION, pt.REVISION_RESULT, pt.DISTRIBUTION, pt.LOCATION, pt.LOCATION_NONE_OPTION,
    pt.SUBREGION_TEXT, pt.CPA_TEXT, pt.SEVERITY, *pt.SEVERITY_OPTIONS, pt.COMPARISON, *pt.COMPARISON_OPTIONS,
    *pt.DISTRIBUTION_OPTIONS, pt.ORACLE_O1, pt.ORACLE_O2, pt.ORACLE_O3_NONE, pt.ORACLE_O3_POINTS, pt.ORACLE_O4,
    pt.SEQUENTIAL_MODIFY, pt.SEQUENTIAL_REGION, pt.SEQUENTIAL_CLOSEST,
]


def test_percept_strings_appear_verbatim_in_spec(spec_text):
    text = spec_text["percept"]
    for s in PERCEPT_STRINGS:
        assert s in text, s
    assert pt.SYSTEM_PROMPT in text
    # strings the spec writes with a literal "\n"
    assert pt.ORACLE_O5.replace("\n", "\\n") in text
    assert pt.ORACLE_O3_TAIL.replace("\n", "\\n") in text
    for color in pt.POINT_COLORS:
        assert f"`{color}`" in text
    assert "`, `".join(pt.ORDINALS) in text


def test_percept_snapshot_of_key_strings():
    assert pt.detection_stem("opacity") == "Is any opacity visible in the image?"
    assert pt.detection_stem("effusion") == "Is any finding suggestive of effusion visible in the image?"
    assert pt.contour_eval_stem("cardiomegaly") == (
        "The image shows a chest X-ray with a predicted mask for the cardiomegaly (shown in the overlay). "
        "Is any major revision needed?"
    )
    assert pt.contour_eval_stem("edema").endswith(
        "Is any major revision needed? Note that lesions overlapping with the heart do not need to be considered."
    )
    assert pt.format_question("Q?", ["Yes", "No"]) == "Q?\n\nOptions:\n(1) Yes\n(2) No"
    assert pt.point_options(["red", "orange"]) == ["red point", "orange point", "None"]
    assert pt.mask_options(4) == ["1st mask", "2nd mask", "3rd mask", "4th mask"]
    assert pt.ordinal(9) == "9th" and pt.oracle_ordinal(4) == "4th"
    assert pt.subregion_text("right lateral lung & right lung base") == (
        "the intersection of the right lateral lung and the right lower zone lung"
    )
    assert pt.subregion_text("left costophrenic angle") == "the left costophrenic angle"
    assert pt.severity_options("left lung")[0] == "Less than 1/3 of the left lung area"
    assert pt.oracle_o3(["red"], []) == (
        "Ground Truth Provided: The lesion mask is definitively needed to be revised using expansion operation "
        "at red point.\nGround Truth Provided: The lesion mask is definitively not needed to be revised using "
        "contraction operation.\nThese are the absolute facts. Disregard your previous answer and evaluate the "
        "following questions strictly based on these facts."
    )
    assert pt.oracle_o3_line("contraction", ["red", "blue", "green"]).endswith("at red, blue, and green points.")
    assert pt.oracle_o3_line("expansion", ["red", "blue"]).endswith("at red and blue points.")
    assert pt.oracle_o5(2).startswith("Ground Truth Provided: The lesion mask reflecting the modifications is the "
                                      "2nd mask.\nThis is an absolute fact.")


def test_candidate_instruction_rules():
    assert pt.candidate_instruction("cardiomegaly", ["heart"]) == "Segment the cardiomegaly."
    assert pt.candidate_instruction("edema", ["right lung", "left lung"]) == "Segment the edema."
    assert pt.candidate_instruction("edema", ["left lung", "right lung", "left lung"]) == "Segment the edema."
    assert pt.candidate_instruction("opacity", ["a", "b", "c"]) == "Segment the opacity in the a, b, and c."


def test_no_template_strings_outside_vocab():
    """Template sentences live only in cxrground.vocab (one source of truth)."""
    from pathlib import Path

    root = Path(ils.__file__).resolve().parents[1]
    needles = ["[SEG] There is no", "[SEG] It is located in", "It is highly suggestive of", "It possibly reflects",
               "Ground Truth Provided", "Is any finding suggestive", "Choose the mask that reflects",
               "and predict its type", "You are an expert radiologist"]
    offenders = []
    for path in root.rglob("*.py"):
        if "vocab" in path.relative_to(root).parts:
            continue
        text = path.read_text(encoding="utf-8")
        offenders += [f"{path.name}: {n}" for n in needles if re.search(re.escape(n), text)]
    assert not offenders, offenders
