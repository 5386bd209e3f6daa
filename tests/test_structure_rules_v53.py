"""Rules version 53 (bench/records/rules_v53_preregistration.md): an atelectasis adjacent to (associated with) an
effusion of a whole lung lies at that lung's base. The record's table and its counter-examples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cxrground.reports.structure import RULES_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structure_tables import table_params  # the "sentence | findings" tables as parameters
from test_structure_rules_v47 import _read  # one reading of a sentence for every version's table

_TABLE = """
Small left pleural effusion with adjacent atelectasis. \
    | effusion present left lung, atelectasis present left lung base
Moderate right pleural effusion with associated atelectasis. \
    | effusion present right lung, atelectasis present right lung base
Bilateral effusions with adjacent atelectasis. \
    | effusion present right lung;left lung, atelectasis present right lung base;left lung base
"""

_COUNTER = """
Loculated fluid in the right minor fissure with adjacent atelectasis. \
    | effusion present right mid zone lung, atelectasis present right mid zone lung
Right lower lobe opacity with adjacent effusion. | opacity present right lung base, effusion present right lung base
Small left pleural effusion with associated basal atelectasis. \
    | effusion present left lung, atelectasis present left lung base
"""


def test_the_version_is_53_or_later() -> None:
    assert int(RULES_VERSION) >= 53


@pytest.mark.parametrize(("text", "expected"), table_params({"table": _TABLE, "counter": _COUNTER}))
def test_findings_read_as_the_record_says(text: str, expected: list) -> None:
    assert _read(text) == expected
