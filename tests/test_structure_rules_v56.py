"""Rules version 56 (bench/records/rules_v56_preregistration.md): post-posed soft-tissue edema, fronted negation, a
pericardial effusion named as the alternative of an enlarged heart, empyema, "Heart: normal". The record's test rows
and its counter-examples, as (lesion or "~" + non-target entity, assertion, places), read by the current rules: since
version 58 the enlarged heart and the cardiomegaly it may reflect are one finding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cxrground.reports import make_section_choice
from cxrground.reports.labels import label_report
from cxrground.reports.structure import RULES_VERSION, RuleStructurer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_structure_rules_v47 import _read  # one reading of a sentence for every version's table

LUNGS = ("right lung", "left lung")
CARDIO_UNC = ("cardiomegaly", "uncertain", ("heart",))
PERICARDIAL = "~pericardial effusion"

_TABLE = [
    ("Mild edema of the soft tissues of the chest wall.", [("~edema", "present", ())]),
    ("Edema in the subcutaneous tissues of the left arm.", [("~edema", "present", ())]),
    ("No longer seen is the previously noted right basilar consolidation.",
     [("consolidation", "absent", ("right lung base",))]),
    ("No longer visualized is the previously seen left pleural effusion.", [("effusion", "absent", ("left lung",))]),
    ("Gone is the previously noted left lower lobe opacity.", [("opacity", "absent", ("left lung base",))]),
    ("Enlarged cardiac silhouette, which may reflect cardiomegaly or pericardial effusion.",
     [CARDIO_UNC, (PERICARDIAL, "uncertain", ())]),
    ("Enlarged cardiac silhouette, cardiomegaly versus pericardial effusion.",
     [CARDIO_UNC, (PERICARDIAL, "uncertain", ())]),
    ("Moderate enlargement of the cardiac silhouette could reflect pericardial effusion.",
     [CARDIO_UNC, (PERICARDIAL, "uncertain", ())]),
    ("Empyema in the right hemithorax with a pigtail catheter in place.", [("effusion", "present", ("right lung",))]),
    ("Loculated right pleural empyema with pigtail catheter.", [("effusion", "present", ("right lung",))]),
]

_COUNTER = [
    ("Soft tissue edema is noted along the chest wall.", [("~soft tissue edema", "present", ())]),
    ("Interstitial edema in both lungs.", [("edema", "present", LUNGS)]),
    ("Edema in the right lower lobe.", [("edema", "present", ("right lung base",))]),
    ("The effusion is no longer seen.", [("effusion", "absent", LUNGS)]),
    ("No longer seen is the consolidation, but a new effusion is present.",
     [("consolidation", "absent", LUNGS), ("effusion", "present", LUNGS)]),
    ("Right effusion, gone is the left one.", [("effusion", "absent", LUNGS)]),
    ("Cardiomegaly without pericardial effusion.",
     [("cardiomegaly", "present", ("heart",)), (PERICARDIAL, "absent", ())]),
    ("Cardiomegaly with a small pericardial effusion.",
     [("cardiomegaly", "present", ("heart",)), (PERICARDIAL, "present", ())]),
    ("Cardiomegaly. No pericardial effusion.", [("cardiomegaly", "present", ("heart",)), (PERICARDIAL, "absent", ())]),
    ("Heart size: enlarged.", [("cardiomegaly", "present", ("heart",))]),
    ("Worsening edema in the face of renal failure.", [("edema", "present", LUNGS)]),
    ("Subdural empyema noted on prior CT.", []),
]


def test_the_version_is_56_or_later() -> None:
    assert int(RULES_VERSION) >= 56


@pytest.mark.parametrize(("text", "expected"), _TABLE + _COUNTER, ids=[t[:40] for t, _ in _TABLE + _COUNTER])
def test_findings_read_as_the_record_says(text: str, expected: list) -> None:
    assert _read(text) == expected


@pytest.mark.parametrize("text", ["Heart: normal size.", "Heart size: normal.", "Cardiac size: within normal limits.",
                                  "Heart size: normal, mediastinum unremarkable."])
def test_a_colon_heart_statement_is_a_normal_heart(text: str) -> None:
    assert _read(text) == []  # no finding for ILS (§7.1: explicit negation only)
    structured = RuleStructurer().structure("r", make_section_choice("findings", text))
    assert label_report(structured).lesions["cardiomegaly"].status == "absent"  # labels: a negated cardiomegaly


@pytest.mark.parametrize("text", ["Heart size: normal vs. mildly enlarged.", "Heart size: normal-mildly enlarged.",
                                  "Heart size: normal/mildly enlarged."])
def test_a_colon_heart_statement_that_goes_on_is_no_normal_heart(text: str) -> None:
    structured = RuleStructurer().structure("r", make_section_choice("findings", text))
    assert label_report(structured).lesions["cardiomegaly"] is None
