"""Rules version 55 (bench/records/rules_v55_preregistration.md): the apex of a lower lobe is the lobe. The record's
test rows and its counter-examples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cxrground.reports.structure import RULES_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structure_tables import table_params  # the "sentence | findings" tables as parameters
from test_structure_rules_v47 import _read  # one reading of a sentence for every version's table

_TABLE = """
Consolidation in the apex of the right lower lobe. | consolidation present right lung base
Patchy opacity in the apical segment of the RLL. | opacity present right lung base
Apical and basal segments of the left lower lobe are consolidated. | consolidation present left lung base
"""

_COUNTER = """
Opacity in the superior segment of the left lower lobe. | opacity present left lung base
Consolidation in the apical segment of the LUL. | consolidation present left apical zone lung;left upper zone lung
Opacity at the right apex and left lower lobe. | opacity present right apical zone lung;left lung base
Opacity in the right apex and the right lower lobe. | opacity present right apical zone lung;right lung base
Opacity in the right apex and base of the right lower lobe. | opacity present right apical zone lung;right lung base
"""


def test_the_version_is_55_or_later() -> None:
    assert int(RULES_VERSION) >= 55


@pytest.mark.parametrize(("text", "expected"), table_params({"table": _TABLE, "counter": _COUNTER}))
def test_findings_read_as_the_record_says(text: str, expected: list) -> None:
    assert _read(text) == expected
