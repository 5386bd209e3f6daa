"""Rules version 57 (bench/records/rules_v57_preregistration.md): a normal heart in more words (report labels), a
negated heart phrase with a joined mediastinum, and an uncertain pneumonia of a differential placed with its
alternatives (report-level rules version 11). Sentences written for the tests in the forms an audit found in Open-i
reports, not copied from them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cxrground.reports import make_section_choice
from cxrground.reports.labels import label_report
from cxrground.reports.structure import RULES_VERSION, RuleStructurer
from cxrground.reports.structure.lexicon import NORMAL_STATEMENT_RE
from cxrground.reports.structure.resolve import RESOLVE_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_structure_rules_v47 import _read  # one reading of a sentence for every version's table

LUNGS = ("right lung", "left lung")

#: Normal-heart statements: no finding for ILS, cardiomegaly absent (0) in the labels.
_NORMAL = [
    "Cardiomediastinal silhouettes are normal.",  # plural
    "Cardio mediastinal silhouette is within normal limits.",  # written apart
    "Cardio-mediastinal contours are unremarkable.",
    "The cardiac mediastinal silhouette is unremarkable.",
    "The heart silhouette is of normal size.",
    "Heart silhouette is normal in size and configuration.",
    "The cardiac contours are normal.",
    "Heart and mediastinum are of normal size and contour.",
    "Heart and hila of normal size.",
    "Cardiac size is within the limits of normal.",
    "Heart size and mediastinal contours appear within limits of normal.",
    "Cardiomediastinal size is normal.",
    "Heart size, mediastinal contours, and pulmonary vascularity are within normal limits.",  # a list subject
    "The heart, mediastinum and hila are normal.",
    "Cardiomediastinal silhouette, pulmonary vascular pattern are unremarkable.",
    "The heart size and mediastinal silhouette are grossly normal.",
    "Cardiomediastinal contour and hila stable and within normal limits.",
    "The cardiothymic silhouette is normal.",
    "Stable normal cardiomediastinal silhouettes.",
    "Heart size is normal, pulmonary vascularity is unremarkable.",  # version 49's form still reads
]

#: Not a normal heart: blank, or what a heart finding of the sentence says.
_NOT_NORMAL = [
    ("Heart size is upper limits of normal.", None),
    ("Heart size is at the upper limits of normal.", None),
    ("Heart size is within the upper limits of normal.", None),
    ("The heart is borderline in size.", "uncertain"),
    ("Heart size is borderline.", "uncertain"),
    ("The heart is top normal in size.", None),
    ("The mediastinal contours are normal; the heart is enlarged.", "present"),
    ("Mediastinum unremarkable. Stable cardiomegaly.", "present"),
    ("The cardiomediastinal silhouette is unremarkable except for cardiomegaly.", "present"),
    ("The cardiomediastinal silhouette is unremarkable except for a tortuous aorta.", None),
    ("Heart size is normal apart from left atrial prominence.", None),
    ("Normal heart size is not seen.", None),
    ("A normal cardiac silhouette cannot be confirmed on this rotated film.", None),
    ("Heart size is not normal.", None),
    ("Heart size is no longer normal.", None),
    ("Heart size is within normal limits to mildly enlarged.", None),
    ("The heart is of normal size to mildly enlarged.", None),
    ("Heart size is normal/borderline.", None),
    ("Heart size is normal or borderline.", None),
    ("The cardiomediastinal silhouette is unchanged.", None),
    ("Stable cardiomediastinal silhouette.", None),
    ("The heart, mediastinum, and lungs are unremarkable.", None),  # the lungs: a film reading, not a heart statement
]


def _cardiomegaly(text: str) -> str | None:
    label = label_report(RuleStructurer().structure("r", make_section_choice("findings", text))).lesions["cardiomegaly"]
    return None if label is None else label.status


def test_the_versions_are_57_and_11_or_later() -> None:
    assert int(RULES_VERSION) >= 57 and int(RESOLVE_VERSION) >= 11


@pytest.mark.parametrize("text", _NORMAL, ids=[t[:40] for t in _NORMAL])
def test_a_normal_heart_in_more_words_negates_cardiomegaly_in_the_labels(text: str) -> None:
    assert _read(text) == []  # no finding for ILS (§7.1: explicit negation only)
    assert _cardiomegaly(text) == "absent"


@pytest.mark.parametrize(("text", "status"), _NOT_NORMAL, ids=[t[:40] for t, _ in _NOT_NORMAL])
def test_what_is_no_normal_heart(text: str, status: str | None) -> None:
    assert _cardiomegaly(text) == status


def test_a_lung_statement_listed_with_the_heart_still_reads_the_film() -> None:
    assert NORMAL_STATEMENT_RE.search("the heart, mediastinum, and lungs are unremarkable.") is not None


@pytest.mark.parametrize(("text", "expected"), [
    ("The heart silhouette and mediastinal contours are not enlarged.", [("cardiomegaly", "absent", ("heart",))]),
    ("The heart shadow and the mediastinum are not significantly enlarged.", [("cardiomegaly", "absent", ("heart",))]),
    ("Cardio mediastinal silhouette is not enlarged.", [("cardiomegaly", "absent", ("heart",))]),
    ("The heart silhouette is mildly enlarged.", [("cardiomegaly", "present", ("heart",))]),
    ("Heart silhouette and mediastinal contours are enlarged.", [("cardiomegaly", "present", ("heart",))]),
], ids=lambda v: v[:40] if isinstance(v, str) else "")
def test_a_heart_phrase_with_a_joined_mediastinum(text: str, expected: list) -> None:
    assert _read(text) == expected
    assert _cardiomegaly(text) == expected[0][1]


def _places(text: str) -> dict[str, list[tuple[str, ...]]]:
    section = make_section_choice("findings", text)
    out: dict[str, list[tuple[str, ...]]] = {}
    for f in RuleStructurer().structure("r", section).findings:
        out.setdefault(f.lesion or f.entity.lower(), []).append(f.reported_location)
    return out


def test_a_pneumonia_of_a_differential_lies_where_its_alternatives_lie() -> None:
    """Report-level rules version 11: the opacity of another sentence does not place it (version 10 did)."""
    text = ("Bilateral interstitial prominence. Patchy retrocardiac opacity. No pneumothorax. The differential for the "
            "interstitial prominence could include interstitial edema, infectious process or interstitial disease.")
    places = _places(text)
    assert places["opacity"] == [("left lung base",)]
    assert places["edema"] == [LUNGS]
    assert places["pneumonia"] == [LUNGS]


def test_a_pneumonia_of_a_differential_takes_its_alternatives_placed_elsewhere() -> None:
    text = ("Left basilar atelectasis. Right upper lobe opacity. No effusion. "
            "Differential includes atelectasis or pneumonia.")
    places = _places(text)
    assert places["atelectasis"] == [("left lung base",), ("left lung base",)]
    assert places["pneumonia"] == [("left lung base",)]  # with its alternative, not the opacity's right upper zone


@pytest.mark.parametrize(("text", "pneumonia"), [
    # version 10 stays: a pneumonia alone (present, or hedged without alternatives) lies where the opacities lie
    ("Patchy retrocardiac opacity. Findings may represent pneumonia.", [("left lung base",)]),
    ("Consolidation in the left lower lobe. No effusion. Pneumonia.", [("left lung base",)]),
    ("Patchy retrocardiac opacity. No effusion. Pneumonia is possible.", [("left lung base",)]),
    # a diffuse pneumonia stays in both lungs
    ("Patchy retrocardiac opacity. No effusion. Multifocal pneumonia is possible.", [LUNGS]),
])
def test_a_pneumonia_without_a_differential_keeps_version_10(text: str, pneumonia: list) -> None:
    assert _places(text)["pneumonia"] == pneumonia
