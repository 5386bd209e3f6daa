"""Rules version 50 (bench/records/rules_v50_preregistration.md): "midzone(s)" is the mid zone, and a zone word joined
to its noun by a hyphen ("right mid-zone", "upper-lobe") reads as the spaced form. Every sentence of the record's
table, and its counter-examples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cxrground.reports.structure import RULES_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_structure_rules import _v44_rows as _rows  # the "sentence | findings" table reader
from test_structure_rules_v47 import _read  # one reading of a sentence for every version's table

#: The record's table: sentence | what version 50 reads (in order; places ";"-joined).
_TABLE = """
Patchy consolidation in peripheral right midzone. | consolidation present right mid zone lung
Patchy opacity in the right mid-zone. | opacity present right mid zone lung
Patchy opacities in both midzones. | opacity present right mid zone lung;left mid zone lung
AP chest X-ray demonstrates bilateral upper-lobe predominant patchy and confluent airspace opacities. \
    | opacity present right upper zone lung;left upper zone lung
"""

#: Further forms of the change: lists, "of the right lung", and each hyphenated noun.
_FORMS = """
Consolidation in the right upper-lobe and left lower-zone. \
    | consolidation present right upper zone lung;left lung base
Opacity in the midzone of the right lung. | opacity present right mid zone lung
Opacity in the left mid-zone and lower-zone. | opacity present left mid zone lung;left lung base
Atelectasis in the right lower-lobe. | atelectasis present right lung base
Opacity in the left upper-zone. | opacity present left upper zone lung
Opacities in the right mid-lung field. | opacity present right mid zone lung
"""

#: Counter-examples: the spaced forms and hyphenated words that name no zone keep their readings.
_COUNTER = """
Opacity in the right mid zone. | opacity present right mid zone lung
Left midlung opacity. | opacity present left mid zone lung
Right mid-lung opacity. | opacity present right mid zone lung
Consolidation in the right upper lobe. | consolidation present right upper zone lung
Right-sided effusion. | effusion present right lung
Well-defined opacity in the right lung. | opacity present right lung
Mid-sized right effusion. | effusion present right lung
Atelectasis in the lower-lobe. | atelectasis present right lung base;left lung base
"""


def test_the_version_is_50_or_later() -> None:
    assert int(RULES_VERSION) >= 50


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param(text, expected, id=f"{name}: {text[:40]}")
    for name, table in {"table": _TABLE, "form": _FORMS, "counter": _COUNTER}.items()
    for text, expected in _rows(table)])
def test_findings_read_as_the_record_says(text: str, expected: list) -> None:
    """The record's table, further forms of its change, and counter-examples that keep their readings."""
    assert _read(text) == expected


@pytest.mark.parametrize("spaced", ["right mid zone", "left upper lobe", "right lower zone", "left mid lung"])
def test_a_hyphen_reads_as_a_space(spaced: str) -> None:
    """The hyphenated form of a zone phrase reads exactly as its spaced form."""
    hyphenated = spaced.rsplit(" ", 1)[0] + "-" + spaced.rsplit(" ", 1)[1]
    assert _read(f"Opacity in the {hyphenated}.") == _read(f"Opacity in the {spaced}.")
