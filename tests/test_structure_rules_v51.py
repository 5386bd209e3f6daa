"""Rules version 51 (bench/records/rules_v51_preregistration.md): places joined by "and" and a sign after "with" do
not break an observation's link to its lesion, "upper lobe diversion" is a vascular sign that places nothing, and a
paragraph written as a list ends a sentence at every item line. Every sentence of the record's table, and its
counter-examples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cxrground.reports.sentences import split_sentences
from cxrground.reports.structure import RULES_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_structure_rules import _v44_rows as _rows  # the "sentence | findings" table reader
from test_structure_rules_v47 import _read  # one reading of a sentence for every version's table

#: The record's table: sentence | what version 51 reads (in order; places ";"-joined; "~" = non-target).
_TABLE = """
Patchy airspace opacities in the right lower lobe and lingula, consistent with pneumonia. \
    | pneumonia present right lung base;left mid zone lung
Opacities at both lung bases and the right mid zone, concerning for pneumonia. \
    | pneumonia uncertain right lung base;left lung base;right mid zone lung
Right upper lobe opacity with volume loss, compatible with atelectasis. \
    | ~volume loss present right upper zone lung, atelectasis present right upper zone lung
There is bilateral perihilar airspace shadowing with upper lobe diversion, in keeping with pulmonary oedema. \
    | ~upper lobe diversion present right mid zone lung;left mid zone lung, \
edema present right mid zone lung;left mid zone lung
"""

#: Further forms of the changes.
_FORMS = """
Opacities in the right upper, middle and lower lobes, consistent with pneumonia. \
    | pneumonia present right upper zone lung;right mid zone lung;right lung base
Opacity in the left lower lobe with volume loss, likely atelectasis. \
    | ~volume loss present left lung base, atelectasis uncertain left lung base
Opacity with associated volume loss in the left lower lobe, likely atelectasis. \
    | ~volume loss present left lung base, atelectasis uncertain left lung base
Perihilar haziness with cephalization, consistent with edema. \
    | ~cephalization present right mid zone lung;left mid zone lung, \
edema present right mid zone lung;left mid zone lung
Upper lobe diversion. | ~upper lobe diversion present right lung;left lung
"""

#: Counter-examples: findings joined by "and" keep their own readings; a sign without a link stays apart.
_COUNTER = """
Opacity in the right lower lobe and left effusion. | opacity present right lung base, effusion present left lung
Left lower lobe opacity with volume loss. | opacity present left lung base, ~volume loss present left lung base
Right lower lobe pneumonia. | pneumonia present right lung base
"""


def _lines(table: str) -> str:
    """The table with its continued lines joined."""
    return table.replace("\\\n", " ")


def test_the_version_is_51_or_later() -> None:
    assert int(RULES_VERSION) >= 51


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param(text, [(les.replace("_", " "), a, p) for les, a, p in expected], id=f"{name}: {text[:40]}")
    for name, table in {"table": _TABLE, "form": _FORMS, "counter": _COUNTER}.items()
    for text, expected in _rows(_lines(table).replace("~volume loss", "~volume_loss")
                                .replace("~upper lobe diversion", "~upper_lobe_diversion"))])
def test_findings_read_as_the_record_says(text: str, expected: list) -> None:
    """The record's table, further forms of its changes, and counter-examples that keep their readings."""
    assert _read(text) == expected


def test_a_paragraph_written_as_a_list_ends_a_sentence_at_each_line() -> None:
    text = ("No focal consolidation or pleural effusion identified in this study\nMild cardiomegaly\n"
            "Bibasilar atelectasis")
    assert split_sentences(text) == ["No focal consolidation or pleural effusion identified in this study",
                                     "Mild cardiomegaly", "Bibasilar atelectasis"]
    assert ("cardiomegaly", "present", ("heart",)) in _read(text)
    wrapped = ("The lungs are well expanded and there is a new opacity in the right lower\nLobe which is "
               "concerning for pneumonia and no effusion is seen on this study today\nas before.")
    assert len(split_sentences(wrapped)) == 1  # wrapped running text: no short item line, no split
