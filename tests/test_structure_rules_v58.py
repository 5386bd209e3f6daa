"""Rules version 58 (bench/records/rules_v58_preregistration.md): one lesion named twice in a sentence, with one
assertion and places that agree, is one finding; two lesions, two assertions, two sides or two places stay apart.
Sentences written for the tests, as (lesion or "~" + non-target entity, assertion, places)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.reports.structure import RULES_VERSION, structure_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_structure_rules_v47 import _read, findings  # one reading of a sentence for every version's table

HEART = ("heart",)
LUNGS = ("right lung", "left lung")
RB, LB = ("right lung base",), ("left lung base",)
RL, LL = ("right lung",), ("left lung",)

#: One lesion named twice: one finding.
_ONE = [
    ("The heart is enlarged, consistent with cardiomegaly.", [("cardiomegaly", "present", HEART)]),
    ("Enlarged cardiac silhouette consistent with cardiomegaly.", [("cardiomegaly", "present", HEART)]),
    ("Heart size is enlarged, cardiomegaly.", [("cardiomegaly", "present", HEART)]),
    ("Mild cardiomegaly, the heart is enlarged.", [("cardiomegaly", "present", HEART)]),
    ("CTR is 0.58, indicating mild cardiomegaly.", [("cardiomegaly", "present", HEART)]),
    ("The heart is not enlarged and there is no cardiomegaly.", [("cardiomegaly", "absent", HEART)]),
    ("Enlarged cardiac silhouette, which may reflect cardiomegaly or pericardial effusion.",
     [("cardiomegaly", "uncertain", HEART), ("~pericardial effusion", "uncertain", ())]),
    ("Right lower lobe pneumonia, the pneumonia is unchanged.", [("pneumonia", "present", RB)]),
    ("Small left pleural effusion, the effusion is unchanged.", [("effusion", "present", LL)]),
    ("Small left pleural effusion, left effusion is small.", [("effusion", "present", LL)]),
    ("Left effusion and right effusion; the effusions are small.", [("effusion", "present", LL),
                                                                    ("effusion", "present", RL)]),
    ("Left basilar atelectasis, atelectasis at the left base.", [("atelectasis", "present", LB)]),
    ("No focal opacity or infiltrate.", [("opacity", "absent", LUNGS)]),
    ("No pleural effusion or pleural fluid.", [("effusion", "absent", LUNGS)]),
    ("Opacity/infiltrate at the right base.", [("opacity", "uncertain", RB)]),
    ("Multifocal airspace opacities and ground-glass opacities.", [("opacity", "present", LUNGS)]),
    ("Possible pneumonia, atelectasis, or aspiration.",
     [("pneumonia", "uncertain", LUNGS), ("atelectasis", "uncertain", LUNGS)]),
    ("Left lower lobe opacity could be atelectasis, aspiration, or pneumonia.",
     [("atelectasis", "uncertain", LB), ("pneumonia", "uncertain", LB)]),
]

#: Two findings stay two: other lesions, assertions, sides or places (an unplaced absent finding too), non-target.
_TWO = [
    ("Right lower lobe opacity, likely pneumonia.", [("pneumonia", "uncertain", RB)]),  # attributed: one finding
    ("Right lower lobe opacity and consolidation.", [("opacity", "present", RB), ("consolidation", "present", RB)]),
    ("Opacity at the right base, atelectasis versus pneumonia.",
     [("atelectasis", "uncertain", RB), ("pneumonia", "uncertain", RB)]),
    ("Left effusion and right effusion.", [("effusion", "present", LL), ("effusion", "present", RL)]),
    ("Small right effusion and moderate left effusion.", [("effusion", "present", RL), ("effusion", "present", LL)]),
    ("No effusion on the right, small effusion on the left.", [("effusion", "absent", RL),
                                                               ("effusion", "present", LL)]),
    ("Pleural effusion has resolved on the right but persists on the left.",
     [("effusion", "absent", RL), ("effusion", "present", LL)]),
    ("The heart is enlarged, which may represent cardiomegaly.",
     [("cardiomegaly", "present", HEART), ("cardiomegaly", "uncertain", HEART)]),
    ("Small right juxtahilar opacity may represent infiltrate.", [("opacity", "present", RL),
                                                                  ("opacity", "uncertain", RL)]),
    ("Cleared left lower lobe airspace disease with persistent right middle lobe airspace disease.",
     [("opacity", "absent", LB), ("opacity", "present", ("right mid zone lung",))]),
    ("Bilateral opacification, including a rounded opacity in the right lower zone.",
     [("opacity", "present", LUNGS), ("opacity", "present", RB)]),
    ("Opacity in the right upper lobe and opacity in the left lower lobe.",
     [("opacity", "present", ("right upper zone lung",)), ("opacity", "present", LB)]),
    ("No effusion on the right and no effusion elsewhere.", [("effusion", "absent", RL),
                                                             ("effusion", "absent", LUNGS)]),  # absent: equal places
    ("Right lower lobe opacity; no opacity elsewhere.", [("opacity", "present", RB), ("opacity", "absent", LUNGS)]),
    ("Left pneumothorax and right pneumothorax.", [("~pneumothorax", "present", LL),
                                                   ("~pneumothorax", "present", RL)]),
]


def test_the_version_is_58_or_later() -> None:
    assert int(RULES_VERSION) >= 58


@pytest.mark.parametrize(("text", "expected"), _ONE, ids=[t[:40] for t, _ in _ONE])
def test_one_lesion_named_twice_is_one_finding(text: str, expected: list) -> None:
    assert _read(text) == expected


@pytest.mark.parametrize(("text", "expected"), _TWO, ids=[t[:40] for t, _ in _TWO])
def test_other_lesions_assertions_sides_and_places_stay_apart(text: str, expected: list) -> None:
    assert _read(text) == expected


def test_the_merged_finding_keeps_the_first_phrase_and_both_places() -> None:
    """The first phrase stands for the lesion; the location phrases of both are kept, in the order written."""
    (heart,) = findings("The heart is enlarged, consistent with cardiomegaly.")
    assert (heart.entity, heart.sent_idx, heart.location_phrases) == ("heart is enlarged", 1, ())
    (atelectasis,) = findings("Left basilar atelectasis, atelectasis at the left base.")
    assert atelectasis.location_phrases == ("Left basilar", "left base")
    (pneumonia,) = findings("Pneumonia, right lower lobe pneumonia.")  # the unplaced phrase first: the place is kept
    assert (pneumonia.entity, pneumonia.location_phrases, pneumonia.reported_location) == (
        "Pneumonia", ("right lower lobe",), RB)


@pytest.mark.parametrize(("text", "hedge"), [
    ("Likely pneumonia, probably pneumonia.", "likely"),
    ("Likely pneumonia, possibly pneumonia.", "possible"),
])
def test_a_merged_hedge_is_likely_only_when_both_are(text: str, hedge: str) -> None:
    assert [(f.lesion, f.assertion, f.hedge) for f in findings(text)] == [("pneumonia", "uncertain", hedge)]


def test_only_one_sentence_is_merged() -> None:
    """The same lesion in two sentences is two findings here (the report-level rules place the second)."""
    rows = structure_text("Right lower lobe pneumonia. The pneumonia is unchanged.").findings
    assert [(f.lesion, f.sent_idx) for f in rows] == [("pneumonia", 1), ("pneumonia", 2)]


def test_reports_structure_lists_the_lesion_once(tmp_path: Path) -> None:
    from cxrground.cli import main

    path = tmp_path / "r1.txt"
    path.write_text("FINDINGS: The heart is enlarged, consistent with cardiomegaly. Right lower lobe opacity, likely "
                    "pneumonia. Small left effusion and small right effusion.\n")
    res = CliRunner().invoke(main, ["reports", "structure", str(path)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.output.splitlines()]
    assert [(r["sent_idx"], r["lesion"], r["assertion"], r["reported_location"]) for r in rows] == [
        (1, "cardiomegaly", "present", ["heart"]), (2, "pneumonia", "uncertain", ["right lung base"]),
        (3, "effusion", "present", ["left lung"]), (3, "effusion", "present", ["right lung"])]
