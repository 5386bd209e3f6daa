"""Rules version 52 (bench/records/rules_v52_preregistration.md): "more on the right" and its kin compare the lungs
and name no side, and a pointing-back sentence does not place edema. The record's table and its counter-examples."""

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
Perihilar opacities, more on the right, likely reflect edema. | edema uncertain right mid zone lung;left mid zone lung
Opacity at the right base. Findings are consistent with pulmonary edema. \
    | opacity present right lung base, edema present right lung;left lung
Bibasilar atelectasis, greater on the left. | atelectasis present right lung base;left lung base
Atelectasis, more prominent on the left than on the right. | atelectasis present right lung;left lung
"""

_COUNTER = """
Small effusion on the right. | effusion present right lung
Opacity at the right base. Findings are concerning for pneumonia. \
    | opacity present right lung base, pneumonia uncertain right lung base
Opacity in the left lower lobe, more on the lateral aspect. | opacity present left lung base
"""


def test_the_versions() -> None:
    assert int(RULES_VERSION) >= 52 and int(RESOLVE_VERSION) >= 8


@pytest.mark.parametrize(("text", "expected"), table_params({"table": _TABLE, "counter": _COUNTER}))
def test_findings_read_as_the_record_says(text: str, expected: list) -> None:
    assert _read(text) == expected
