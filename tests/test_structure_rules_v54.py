"""Rules version 54 and report-level rules version 10 (bench/records/rules_v54_preregistration.md): hyphenated places,
"upper" before a hilar word, a segment of a sided lobe, more predominance words, every place across "with", another
person's illness, and a pneumonia with no place of its own. The record's table and its counter-examples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cxrground.reports.structure import RULES_VERSION
from cxrground.reports.structure.resolve import RESOLVE_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structure_tables import table_params  # the "sentence | findings" tables as parameters
from test_structure_rules_v47 import _read  # one reading of a sentence for every version's table

_TABLE = """
There is mild left peri-hilar and upper lobe interstitial opacity. \
    | opacity present left mid zone lung;left upper zone lung
Consolidation in lower zone of the left-lung. | consolidation present left lung base
Retro-cardiac opacity. | opacity present left lung base
Opacity in the right upper and lower perihilar regions. \
    | opacity present right upper zone lung;right lung base;right mid zone lung
A small opacity in the right upper perihilar region. | opacity present right upper zone lung;right mid zone lung
Consolidations in the apical segment of the LUL and in the RLL. \
    | consolidation present left apical zone lung;left upper zone lung;right lung base
Large ground-glass opacity in the basal segment of the left lower lobe. | opacity present left lung base
Two areas of consolidation with possible inflammatory aetiology in the LUL and in the RLL. \
    | consolidation present left upper zone lung;right lung base
Diffuse consolidations, particularly visible in LUL. \
    | consolidation present right lung;left lung;left upper zone lung
Multiple faint alveolar opacities, predominantly peripheral with greater involvement of the upper lobes. \
    | opacity present right lung;left lung;right upper zone lung;left upper zone lung
Only sick contact was her husband who was recently hospitalized with presumed community-acquired pneumonia. | -
Her mother had pneumonia last year. | -
COVID-19 pneumonia manifesting as a single nodular lesion. Single nodular consolidation in the left lower lung zone. \
    | pneumonia present left lung base, consolidation present left lung base
"""

_COUNTER = """
Right lower lobe pneumonia. | pneumonia present right lung base
Her husband had pneumonia; she now has right lower lobe consolidation. | consolidation present right lung base
Her husband had pneumonia but the patient has a left effusion. | effusion present left lung
Left perihilar opacity. | opacity present left mid zone lung
Perihilar opacities. | opacity present right mid zone lung;left mid zone lung
Opacity at the base of the right lung. | opacity present right lung base
Pneumonia. Diffuse opacities. | pneumonia present right lung;left lung, opacity present right lung;left lung
Pneumonia. Left pleural effusion. | pneumonia present right lung;left lung, effusion present left lung
Right-sided consolidation. | consolidation present right lung
Improved aeration of the lung bases with small residual left basilar effusion. | effusion present left lung base
Relative to the prior study, there is increased opacity at the left base. | opacity present left lung base
There is relative elevation of the right hemidiaphragm with right basilar atelectasis. \
    | atelectasis present right lung base
Relative to the prior exam, there is no effusion. | effusion absent right lung;left lung
The heart is in close contact with a left lower lobe consolidation. | consolidation present left lung base
No sick contacts, presents with fever and bilateral opacities. | opacity present right lung;left lung
Her husband had pneumonia, and her chest radiograph shows bilateral opacities. | opacity present right lung;left lung
Husband with COVID, patient now with bilateral opacities. | opacity present right lung;left lung
4-year-old, parents report fever and cough, right upper lobe pneumonia. | pneumonia present right upper zone lung
Multifocal pneumonia. Right lower lobe consolidation. \
    | pneumonia present right lung;left lung, consolidation present right lung base
"""


def test_the_versions_are_54_and_10_or_later() -> None:
    assert int(RULES_VERSION) >= 54 and int(RESOLVE_VERSION) >= 10


@pytest.mark.parametrize(("text", "expected"), table_params({"table": _TABLE, "counter": _COUNTER}))
def test_findings_read_as_the_record_says(text: str, expected: list) -> None:
    assert _read(text) == expected


def test_places_written_with_a_hyphen_are_reported_as_written() -> None:
    from cxrground.reports.structure import structure_text

    (f,) = structure_text("There is mild Left peri-hilar and upper lobe interstitial opacity.").findings
    assert f.location_phrases == ("Left peri-hilar", "upper lobe")
    (g,) = structure_text("Consolidation in lower zone of the left-lung.").findings
    assert g.location_phrases == ("lower zone of the left-lung",)
