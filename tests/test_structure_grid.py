"""The rule structurer on a grid of sentence templates x finding phrases x places: every combination must read the
assertion and the place its template and place table say (a regression net for the lexicon's places and cues)."""

from __future__ import annotations

import pytest

from cxrground.reports.structure import structure_text

RB, LB, RM, LM = "right lung base", "left lung base", "right mid zone lung", "left mid zone lung"
RU, LU, RA, LA = "right upper zone lung", "left upper zone lung", "right apical zone lung", "left apical zone lung"
RL, LL = "right lung", "left lung"

#: Finding phrase -> lesion.
FINDINGS = {
    "opacity": "opacity", "airspace opacity": "opacity", "infiltrate": "opacity", "consolidation": "consolidation",
    "atelectasis": "atelectasis", "pneumonia": "pneumonia", "effusion": "effusion", "pleural effusion": "effusion",
}
#: Place phrase -> ILS labels.
PLACES = {
    "right lower lobe": (RB,), "left lower lobe": (LB,), "right middle lobe": (RM,), "lingula": (LM,),
    "right upper lobe": (RU,), "left upper lobe": (LU,), "right lung base": (RB,), "left lung base": (LB,),
    "right base": (RB,), "left base": (LB,), "right apex": (RA,), "left apex": (LA,), "right lung": (RL,),
    "left lung": (LL,), "right mid lung": (RM,), "left mid lung": (LM,), "right upper lung": (RU,),
    "left upper lung": (LU,), "right lower lung": (RB,), "left lower lung": (LB,), "right perihilar region": (RM,),
    "left perihilar region": (LM,), "right costophrenic angle": (RB,), "left costophrenic angle": (LB,),
    "right hemithorax": (RL,), "left hemithorax": (LL,), "right lower zone": (RB,), "left lower zone": (LB,),
    "right mid zone": (RM,), "left upper zone": (LU,),
}
#: Template ({F}: finding phrase, {P}: place) -> assertion of the finding.
TEMPLATES = {
    "{F} in the {P}.": "present", "There is {F} in the {P}.": "present", "No {F} in the {P}.": "absent",
    "Possible {F} in the {P}.": "uncertain", "{F} in the {P} has resolved.": "absent",
    "{F} in the {P} is unchanged.": "present", "Small {F} in the {P}.": "present",
    "There is no evidence of {F} in the {P}.": "absent", "{F} in the {P} cannot be excluded.": "uncertain",
    "Persistent {F} in the {P}.": "present", "Interval resolution of {F} in the {P}.": "absent",
    "{P} {F}.": "present", "{F} at the {P}.": "present", "{F} involving the {P}.": "present",
    "No evidence of {P} {F}.": "absent", "Probable {P} {F}.": "uncertain", "{P} {F} is not excluded.": "uncertain",
    "{P} {F}, unchanged.": "present", "Mild {P} {F} has improved.": "present", "{P} {F} has cleared.": "absent",
    "The {P} {F} is no longer seen.": "absent", "Increased {F} in the {P}.": "present",
}


@pytest.mark.parametrize(("template", "assertion"), list(TEMPLATES.items()))
def test_every_finding_and_place_of_a_template(template: str, assertion: str) -> None:
    wrong = []
    for phrase, lesion in FINDINGS.items():
        for place, labels in PLACES.items():
            if lesion == "effusion" and labels[0].endswith("zone lung"):
                continue  # an effusion in a mid or upper zone is no wording of reports
            text = template.format(F=phrase, P=place)
            text = text[0].upper() + text[1:]
            got = [(f.assertion, f.reported_location) for f in structure_text(text).findings if f.lesion == lesion]
            if got[:1] != [(assertion, labels)]:
                wrong.append((text, got))
    assert not wrong, wrong[:5]
