"""Rules version 49 (bench/records/rules_v49_preregistration.md): a lesion resolved at one place and persisting at
another, a heart range "top-normal in size to mildly enlarged", normal hearts in more words, a normal heart that is no
normal examination, and an attributed consolidation that states a consolidation. Every sentence of the record's table,
and its counter-examples. Change 6 (label sides only from location phrases) was reverted by check 1 (the MeSH side
agreement fell): its table rows keep version 48's sides here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cxrground.reports.labels import ReportLabels, label_report
from cxrground.reports.reading import reads_the_film
from cxrground.reports.structure import RULES_VERSION, structure_text
from cxrground.reports.structure.lexicon import HEART_NORMAL_RE, NORMAL_STATEMENT_RE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_structure_rules import _v44_rows as _rows  # the "sentence | findings" table reader
from test_structure_rules_v47 import _read, findings  # one reading of a sentence for every version's table

#: The record's table, changes 1 and 2: sentence | what version 49 reads (in order; places ";"-joined).
_TABLE = """
Pleural effusion has resolved on the right but persists on the left. \
    | effusion absent right lung, effusion present left lung
The pleural effusion has resolved on the right and persists on the left. \
    | effusion absent right lung, effusion present left lung
Pneumonia has cleared in the right lower lobe but persists in the left lower lobe. \
    | pneumonia absent right lung base, pneumonia present left lung base
Atelectasis has resolved at the right base; it persists at the left base. \
    | atelectasis absent right lung base, atelectasis present left lung base
The heart is top-normal in size to mildly enlarged. | cardiomegaly uncertain heart
"""

#: Further forms the record's changes 1 and 2 name.
_FORMS = """
The effusion has cleared on the left while it remains on the right. \
    | effusion absent left lung, effusion present right lung
Pleural effusion has resolved on the right, whereas it is unchanged on the left. \
    | effusion absent right lung, effusion present left lung
Consolidation has resolved in the right upper lobe but is still present in the left upper lobe. \
    | consolidation absent right upper zone lung, consolidation present left upper zone lung
Atelectasis has resolved at the left base but is stable at the right base. \
    | atelectasis absent left lung base, atelectasis present right lung base
Pleural effusion has resolved on the right but likely persists on the left. \
    | effusion absent right lung, effusion uncertain left lung
The heart is upper normal in size to mildly enlarged. | cardiomegaly uncertain heart
The heart is top normal in size to mildly enlarged. | cardiomegaly uncertain heart
"""

#: The record's counter-examples (check 4) for the findings, which keep their readings, and a few more that mark where
#: a change stops.
_COUNTER = """
Pleural effusion has resolved. | effusion absent right lung;left lung
The right effusion has resolved while the left is unchanged. | effusion absent right lung, effusion present left lung
Pneumonia has resolved on the right. | pneumonia absent right lung
Heart size is enlarged and mediastinum normal. | cardiomegaly present heart
Heart size is top-normal. | -
Consolidation of the left lower lobe. | consolidation present left lung base
No consolidation to suggest pneumonia. \
    | consolidation absent right lung;left lung, pneumonia absent right lung;left lung
Resolved on the right, the pleural effusion persists on the left. \
    | effusion absent right lung, effusion present left lung
The effusion has resolved and the lungs are clear. | effusion absent right lung;left lung
Pleural effusion has resolved on the right and the left lung is clear. | effusion absent right lung
Pleural effusion has partially resolved on the right but persists on the left. | effusion present right lung
The effusion has resolved on the right; the effusion persists on the left. \
    | effusion absent right lung, effusion present left lung
The effusion has resolved on the right and the effusion persists on the left. \
    | effusion absent right lung, effusion present left lung
Heart size is top-normal to mildly enlarged. | cardiomegaly uncertain heart
The heart is top-normal in size. | -
"""

#: Labels (changes 1, 3 and 5): sentence | field code [sides] (";"-joined fields; "-": no field labelled).
_LABELS_TABLE = """
Pleural effusion has resolved on the right but persists on the left. | effusion 1 left
Heart size and pulmonary vascularity appear within normal limits. | cardiomegaly 0
The heart and mediastinum are normal. | cardiomegaly 0
Heart and mediastinum normal. | cardiomegaly 0
Normal size and configuration of the cardiac silhouette. | cardiomegaly 0
The cardiomediastinal silhouette and pulmonary vasculature are within normal limits. | cardiomegaly 0
Heart size and mediastinal contours are normal. | cardiomegaly 0
The heart is top-normal in size to mildly enlarged. | cardiomegaly -1
Consolidation of the left lower lobe, consistent with pneumonia. | pneumonia 1 left; consolidation 1 left
"""

_LABELS_FORMS = """
The heart and mediastinum are within normal limits. | cardiomegaly 0
Heart and mediastinum are unremarkable. | cardiomegaly 0
The heart size and mediastinal contours are within normal limits. | cardiomegaly 0
Cardiac size and mediastinal contours are normal. | cardiomegaly 0
Normal size of the heart. | cardiomegaly 0
Normal size and contour of the heart. | cardiomegaly 0
Right lower lobe consolidation, likely pneumonia. | pneumonia -1 right; consolidation 1 right
Consolidation in the right upper lobe may represent pneumonia. | pneumonia -1 right; consolidation 1 right
Consolidation at the left base, atelectasis versus pneumonia. \
    | atelectasis -1 left; pneumonia -1 left; consolidation 1 left
"""

_LABELS_COUNTER = """
Heart size is enlarged and mediastinum normal. | cardiomegaly 1
The heart is enlarged; the mediastinum is normal. | cardiomegaly 1
Heart size is top-normal. | -
Heart size normal. | cardiomegaly 0
The heart size is within normal limits. | cardiomegaly 0
Heart size is normal to mildly enlarged. | cardiomegaly -1
The mediastinum and heart are normal. | cardiomegaly 0
Consolidation of the left lower lobe. | consolidation 1 left
No consolidation to suggest pneumonia. | pneumonia 0; consolidation 0
Right lower lobe opacity, likely pneumonia. | pneumonia -1 right; opacity_observed 1 right
Right pleural effusion. | effusion 1 right
Bilateral pleural effusions. | effusion 1 right+left
Pleural effusion has resolved. | effusion 0
Consolidation is not consistent with pneumonia. | pneumonia 0; consolidation 1 right+left
Bibasilar atelectasis. Pneumonia cannot be excluded. | pneumonia -1 right+left; atelectasis 1 right+left
Right lower lobe opacity. This may represent pneumonia. | pneumonia -1 right; opacity 1 right; opacity_observed 1 right
Left basilar atelectasis and effusion. | atelectasis 1 left; effusion 1 left
"""

#: Change 6 is reverted (check 1: the MeSH side agreement fell, CXR1829 "minimal posterior pleural effusions" coded
#: bilateral among them): an unplaced finding keeps the sides of its default location, both lungs, as in version 48.
_CHANGE_6_REVERTED = """
Small pleural effusion. | effusion 1 right+left
Pneumonia cannot be excluded. | pneumonia -1 right+left
Pleural effusion. | effusion 1 right+left
Possible pneumonia. | pneumonia -1 right+left
Pulmonary edema. | edema 1 right+left
Diffuse opacities. | opacity 1 right+left; opacity_observed 1 right+left
"""


def _label_rows(table: str) -> list[tuple[str, dict[str, tuple[int, str]]]]:
    rows = []
    for line in table.replace("\\\n", " ").strip().splitlines():
        text, read = (part.strip() for part in line.split("|"))
        expected: dict[str, tuple[int, str]] = {}
        if read != "-":
            for item in read.split(";"):
                name, code, *sides = item.split()
                expected[name] = (int(code), sides[0] if sides else "")
        rows.append((text, expected))
    return rows


def _labels(text: str) -> ReportLabels:
    return label_report(structure_text(text))


def _label_read(text: str) -> dict[str, tuple[int, str]]:
    labels = _labels(text)
    return {name: (label.code(), label.sides_text()) for name, label in
            ((name, labels.label(name)) for name in (*labels.lesions, "opacity_observed")) if label is not None}


def test_the_version_is_at_least_49() -> None:
    assert int(RULES_VERSION) >= 49  # version 50 keeps these readings


def _cases(reader, **tables: str) -> list:
    """``pytest.param(text, expected)`` of every row of the named tables, with the table's name in the id."""
    return [pytest.param(text, expected, id=f"{name}: {text[:40]}")
            for name, table in tables.items() for text, expected in reader(table)]


@pytest.mark.parametrize(("text", "expected"), _cases(_rows, table=_TABLE, form=_FORMS, counter=_COUNTER))
def test_findings_read_as_the_record_says(text: str, expected: list) -> None:
    """The record's table, further forms of its changes, and counter-examples that keep their readings."""
    assert _read(text) == expected


@pytest.mark.parametrize(("text", "expected"), _cases(_label_rows, table=_LABELS_TABLE, form=_LABELS_FORMS,
                                                      counter=_LABELS_COUNTER, change_6_reverted=_CHANGE_6_REVERTED))
def test_labels_read_as_the_record_says(text: str, expected: dict) -> None:
    """The labels of the record's table, further forms, counter-examples, and change 6 reverted (label sides stay
    those of the reported location)."""
    assert _label_read(text) == expected


def test_the_persisting_lesion_is_a_present_finding_of_its_own_place() -> None:
    """Change 1: the absent finding keeps only its own place, and the present one is no hedge."""
    rows = findings("Pleural effusion has resolved on the right but persists on the left.")
    assert [(f.entity, f.assertion, f.location_phrases, f.hedge) for f in rows] == [
        ("Pleural effusion", "absent", ("right",), None), ("Pleural effusion", "present", ("left",), None)]
    assert not any(f.assertion == "absent" and "left lung" in f.reported_location for f in rows)


@pytest.mark.parametrize("text", [
    "Heart size and pulmonary vascularity appear within normal limits.",
    "The heart and mediastinum are normal.",
    "Normal size and configuration of the cardiac silhouette.",
])
def test_a_normal_heart_in_more_words_gives_no_finding(text: str) -> None:
    """Change 3 is a labels-only rule, as the normal heart size of before: no finding, so no ILS pair."""
    assert HEART_NORMAL_RE.search(text.lower()) is not None
    assert findings(text) == []


@pytest.mark.parametrize("text", [
    "Heart size is enlarged and mediastinum normal.",
    "The heart is enlarged; the mediastinum is normal.",
    "Heart size and mediastinum are enlarged.",
    "Heart size and lung volumes are decreased but normal.",
])
def test_no_normal_heart_where_a_finding_is_stated(text: str) -> None:
    assert HEART_NORMAL_RE.search(text.lower()) is None


@pytest.mark.parametrize(("text", "reads"), [
    ("The heart size is within normal limits.", False),
    ("Heart size normal.", False),
    ("The heart is unremarkable.", False),
    ("Heart size and pulmonary vascularity appear within normal limits.", False),
    ("The heart size is within normal limits. The lungs are clear.", True),
    ("Heart size is normal. No acute cardiopulmonary process.", True),
    ("Mediastinal contours are within normal limits.", True),
    ("Examination within the limits of the norm.", True),
    # change 7 (post hoc): lungs "normally inflated (and clear)" read the film without the heart sentence
    ("The heart is normal in size. The lungs are normally inflated and clear.", True),
    ("Lungs are normally inflated.", True),
    ("The lungs are well aerated and clear.", True),
])
def test_a_normal_heart_is_not_a_normal_examination(text: str, reads: bool) -> None:
    """Change 4: a report whose only sentence is "The heart size is within normal limits." says nothing about the
    lungs, as "Heart size normal." does not."""
    assert reads_the_film(structure_text(text)) is reads
    assert (NORMAL_STATEMENT_RE.search(text.lower()) is not None) is reads


def test_an_attributed_consolidation_is_labelled_and_its_finding_does_not_change() -> None:
    """Change 5 is labels only: the finding keeps its lesion (ILS §7: the predicted type)."""
    (f,) = findings("Consolidation of the left lower lobe, consistent with pneumonia.")
    assert (f.entity, f.lesion, f.assertion) == ("Consolidation", "pneumonia", "present")
    labels = _labels("Consolidation of the left lower lobe, consistent with pneumonia.")
    assert labels.lesions["consolidation"] is not None and labels.lesions["consolidation"].sentences == (1,)


def test_an_attributed_consolidation_is_no_mesh_opacity() -> None:
    """The consolidation mention of change 5 says nothing about the opacity observation, and a negated attributed
    consolidation states none."""
    read = _label_read("Consolidation of the left lower lobe, consistent with pneumonia.")
    assert "opacity_observed" not in read
    assert _label_read("No consolidation to suggest pneumonia.")["consolidation"] == (0, "")
