"""Rules version 48 (bench/records/rules_v48_preregistration.md): the cardiothoracic index, "condensation",
post-posed and phrasal hedges, a side before a size word, edematous lungs, "pleural a fusion", "not to be confused
with", foreign-body aspiration and one cardiomegaly per statement. Every sentence of the record's table, and its
counter-examples, read by the current rules: since version 58 a sentence that names one lesion twice ("CTR is 0.58,
indicating mild cardiomegaly.") gives one finding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cxrground.reports.structure import RULES_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_structure_rules import _v44_rows as _rows  # the "sentence | findings" table reader
from test_structure_rules_v47 import _read, findings  # one reading of a sentence for every version's table

#: The record's table: sentence | what version 48 reads (in order; places ";"-joined).
_TABLE = """
Cardiothoracic index increased. | cardiomegaly present heart
Increased cardiothoracic index. | cardiomegaly present heart
Condensation in the LLL. | consolidation present left lung base
Pulmonary condensation in the middle lobe. | consolidation present right mid zone lung
No pulmonary condensations are seen. | consolidation absent right lung;left lung
Bacterial pneumonia favored. | pneumonia uncertain right lung;left lung
atypical pneumonia in the differential | pneumonia uncertain right lung;left lung
Bilateral peripheral airspace opacities, atypical pneumonia in the differential. \
    | opacity present right lung;left lung, pneumonia uncertain right lung;left lung
Patchy bilateral opacities, can be seen with COVID-19 pneumonia. \
    | opacity present right lung;left lung, pneumonia uncertain right lung;left lung
atypical pneumonia to be considered | pneumonia uncertain right lung;left lung
Bilateral interstitial infiltrates, atypical pneumonia to be considered. \
    | opacity present right lung;left lung, pneumonia uncertain right lung;left lung
Dense consolidation in the left lower zone, atypical for COVID; bacterial pneumonia favored. \
    | consolidation present left lung base, pneumonia uncertain left lung base
Rt basal atelectasis, Lt small effusion. | atelectasis present right lung base, effusion present left lung
Right basal atelectasis, left small effusion. | atelectasis present right lung base, effusion present left lung
Lungs are oedematous. | edema present right lung;left lung
Lungs are edematous. | edema present right lung;left lung
Small left pleural a fusion. | effusion present left lung
No pleural a fusion. | effusion absent right lung;left lung
Prominent thymic shadow, not to be confused with consolidation. | consolidation absent right lung;left lung
Mild cardiomegaly (CTR 0.55). | cardiomegaly present heart
The heart is enlarged with a CTR of 0.6. | cardiomegaly present heart
"""

#: Further forms the record's changes name.
_FORMS = """
CTI 0.62. | cardiomegaly present heart
Condensation in the right upper lobe. | consolidation present right upper zone lung
Alveolar condensation in the right lower lobe. | consolidation present right lung base
Pneumonia favoured. | pneumonia uncertain right lung;left lung
Pneumonia is in the differential diagnosis. | pneumonia uncertain right lung;left lung
Opacities could be seen with pneumonia. | opacity present right lung;left lung, pneumonia uncertain right lung;left lung
Pneumonia is a consideration. | pneumonia uncertain right lung;left lung
Rt basal atelectasis, Lt moderate-sized effusion. | atelectasis present right lung base, effusion present left lung
Right basal atelectasis, L massive effusion. | atelectasis present right lung base, effusion present left lung
Edematous lungs. | edema present right lung;left lung
Cardiomegaly, CTR 0.6. | cardiomegaly present heart
"""

#: The record's counter-examples (check 4), which keep their readings, and a few more that mark where a change stops.
_COUNTER = """
Cardiothoracic ratio is normal. | -
CTR 0.45. | -
Consolidation in the LLL. | consolidation present left lung base
Pneumonia is likely. | pneumonia uncertain right lung;left lung
Pneumonia. | pneumonia present right lung;left lung
Right basal atelectasis and small left effusion. | atelectasis present right lung base, effusion present left lung
Right small effusion. | effusion present right lung
Bibasilar atelectasis, small effusions. \
    | atelectasis present right lung base;left lung base, effusion present right lung;left lung
Aspiration pneumonia in the right lower lobe. | pneumonia present right lung base
Possible aspiration. | pneumonia uncertain right lung;left lung
No pleural effusion. | effusion absent right lung;left lung
Cardiomegaly. | cardiomegaly present heart
Lungs are clear. | -
Cardiothoracic index within normal limits. | -
Cardiothoracic index 0.45. | -
Atelectasis favored over pneumonia. \
    | atelectasis uncertain right lung;left lung, pneumonia uncertain right lung;left lung
Opacity in the lingula is favored to represent atelectasis. | atelectasis uncertain left mid zone lung
In the differential, pneumonia. | pneumonia present right lung;left lung
No effusion on the right, small effusion on the left. | effusion absent right lung, effusion present left lung
Lungs are not edematous. | -
Edematous soft tissues. | -
Aspiration. | pneumonia present right lung;left lung
Foreign body aspiration pneumonia. | pneumonia present right lung;left lung
Cardiomegaly. CTR 0.55. | cardiomegaly present heart, cardiomegaly present heart
CTR is 0.58, indicating mild cardiomegaly. | cardiomegaly present heart
"""


def test_the_version_is_at_least_48() -> None:
    assert int(RULES_VERSION) >= 48  # version 49 keeps these readings


@pytest.mark.parametrize(("text", "expected"), _rows(_TABLE), ids=[t[:40] for t, _ in _rows(_TABLE)])
def test_the_record_table(text: str, expected: list) -> None:
    assert _read(text) == expected


@pytest.mark.parametrize(("text", "expected"), _rows(_FORMS), ids=[t[:40] for t, _ in _rows(_FORMS)])
def test_the_changes_other_forms(text: str, expected: list) -> None:
    assert _read(text) == expected


@pytest.mark.parametrize(("text", "expected"), _rows(_COUNTER), ids=[t[:40] for t, _ in _rows(_COUNTER)])
def test_counter_examples_keep_their_readings(text: str, expected: list) -> None:
    assert _read(text) == expected


@pytest.mark.parametrize("text", ["Foreign body aspiration.", "FB aspiration."])
def test_foreign_body_aspiration_is_no_pneumonia(text: str) -> None:
    (f,) = findings(text)
    assert (f.lesion, f.assertion, f.reported_location) == (None, "present", ())


def test_foreign_body_aspiration_suspected_keeps_the_negated_consolidation() -> None:
    rows = findings("Foreign body aspiration suspected; left lung hyperinflated, no consolidation.")
    assert [(f.lesion, f.assertion, f.reported_location) for f in rows] == [
        (None, "uncertain", ()), ("consolidation", "absent", ("left lung",))]


def test_favored_is_a_likely_hedge() -> None:
    (f,) = findings("Bacterial pneumonia favored.")
    assert (f.lesion, f.assertion, f.hedge) == ("pneumonia", "uncertain", "likely")


def test_one_cardiomegaly_per_statement() -> None:
    (f,) = findings("Mild cardiomegaly (CTR 0.55).")
    assert (f.entity, f.assertion) == ("cardiomegaly", "present")
