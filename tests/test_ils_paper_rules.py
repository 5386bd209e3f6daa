"""`ils build --paper-rules`: ILS.md's rules read literally where the build departs from them by default, and the
card's "Rules" section saying which rules a build used."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cxrground.errors import ConfigError
from cxrground.ils.card import rules_lines
from cxrground.ils.compose import WITHHELD_HEART_DESCRIBED, compose_pairs
from cxrground.ils.config import IlsConfig
from cxrground.ils.request import BuildRequest
from cxrground.reports.structure import structure_text
from cxrground.vocab.locations import ILS_LOCATION_LABELS

LITERAL = {"zone_guide": "none", "silent_report_negatives": True, "grounded_location": "boxes",
           "prominent_heart_negative": True}


def test_paper_rules_set_the_four_literal_rules_whatever_the_options_say(tmp_path) -> None:
    default = BuildRequest(images=tmp_path, out=tmp_path / "o")
    assert default.rule_options() == {"zone_guide": "zone_prior_v2", "silent_report_negatives": False,
                                      "grounded_location": "mask", "prominent_heart_negative": False}
    paper = BuildRequest(images=tmp_path, out=tmp_path / "o", paper_rules=True, zone_guide="zone_prior_v3")
    assert paper.rule_options() == LITERAL
    with pytest.raises(ConfigError, match="grounded-location source 'zones'"):
        IlsConfig(grounded_location="zones")


def test_a_prominent_heart_gets_the_ctr_negative_under_the_literal_rule() -> None:
    prominent = list(structure_text("The cardiac silhouette is prominent.").findings)
    withheld = compose_pairs("s1", prominent, [], list(ILS_LOCATION_LABELS), 0.40, None, IlsConfig())
    assert withheld.dropped == Counter({WITHHELD_HEART_DESCRIBED: 1})
    literal = compose_pairs("s1", prominent, [], list(ILS_LOCATION_LABELS), 0.40, None,
                            IlsConfig(prominent_heart_negative=True))
    assert "cardiomegaly" in {n["target"] for n in literal.negative_pairs} and not literal.dropped


def test_rules_section_lists_each_departure() -> None:
    text = "\n".join(rules_lines("zone_prior_v2", "mask", False, False))
    assert text.count("\n- ") == 4 and "`zone_prior_v2`" in text and "--paper-rules" in text
    literal = "\n".join(rules_lines("none", "boxes", True, True))
    assert "read literally" in literal and "\n- " not in literal
    one = rules_lines("none", "boxes", False, True)
    assert [x for x in one if x.startswith("- ")] == [
        "- no lung or pleural negatives from a report that says nothing about the film (`--silent-report-negatives`)"]


def test_build_with_paper_rules_records_them(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "cxrground"]
    subprocess.run([*cli, "synth", "--out", str(tmp_path / "c"), "--studies", "4", "--seed", "2", "--width", "256",
                    "--quiet"], check=True, capture_output=True)
    subprocess.run([*cli, "ils", "build", "--images", str(tmp_path / "c" / "files"), "--out", str(tmp_path / "ils"),
                    "--paper-rules", "--zone-guide", "zone_prior_v3", "--quiet"], check=True, capture_output=True)
    card = (tmp_path / "ils" / "card.md").read_text(encoding="utf-8")
    assert "ILS.md's rules read literally" in card and "guided by the zone reader" not in card
    config = json.loads((tmp_path / "ils" / "provenance.json").read_text(encoding="utf-8"))["config"]
    assert {k: config[k] for k in LITERAL} == LITERAL
