"""Section policies (findings / impression / findings+impression), merged sentence numbering, the report-level
rules (location anaphora, duplicates of a merged section) and the ``--sections`` / ``--alternatives`` options of
``reports structure``."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.errors import ConfigError
from cxrground.ils.config import IlsConfig
from cxrground.reports import (
    SECTION_POLICIES,
    SectionPart,
    make_section_choice,
    merge_sections,
    parse_numbered,
    parse_report_text,
    select_section,
)
from cxrground.reports.findings import Finding, StructuredReport
from cxrground.reports.structure import (
    RULES_VERSION,
    RuleStructurer,
    resolve_findings,
    structure_report,
    structure_reports,
)

RL, LL, RB, LB = "right lung", "left lung", "right lung base", "left lung base"

REPORT = """FINDINGS: Small right pleural effusion. Right lower lobe opacity, probable atelectasis. No pneumothorax.

IMPRESSION: 1. Right pleural effusion. 2. Right basilar atelectasis. 3. Pneumonia is not excluded.
"""


def _rows(rep: StructuredReport) -> list[tuple[int, str, str, tuple[str, ...]]]:
    return [(f.sent_idx, f.lesion or f.entity.lower(), f.assertion, f.reported_location) for f in rep.findings]


def test_policies_choose_sections() -> None:
    report = parse_report_text(REPORT, "r1")
    assert SECTION_POLICIES == ("findings", "impression", "findings+impression")
    findings = select_section(report, "findings")
    impression = select_section(report, "impression")
    merged = select_section(report, "findings+impression")
    assert findings is not None and impression is not None and merged is not None
    assert (findings.name, len(findings.sentences)) == ("findings", 3)
    assert (impression.name, len(impression.sentences)) == ("impression", 3)
    assert merged.name == "findings+impression"
    assert merged.parts == (SectionPart("findings", 1, 3), SectionPart("impression", 4, 6))
    assert [merged.part_of(i) for i in (1, 3, 4, 6)] == ["findings", "findings", "impression", "impression"]
    # findings keep their numbers, impression sentences are numbered on, and the numbering parses back
    assert merged.section_content.startswith(findings.section_content + " (4) Right pleural effusion.")
    assert [t for _, t in parse_numbered(merged.section_content)] == [s.text for s in merged.sentences]
    assert merged.to_dict()["parts"][1] == {"name": "impression", "first": 4, "last": 6}
    assert "parts" not in findings.to_dict()
    with pytest.raises(ValueError, match="section policy"):
        select_section(report, "everything")


def test_merged_policy_falls_back_to_the_section_there_is() -> None:
    only_impression = parse_report_text("IMPRESSION: Small left effusion.\n", "r2")
    choice = select_section(only_impression, "findings+impression")
    assert choice is not None and choice.name == "impression" and len(choice.parts) == 1
    plain = parse_report_text("Heart size is normal.\n\nSmall left pleural effusion.", "r3")
    for policy in SECTION_POLICIES:
        choice = select_section(plain, policy)
        assert choice is not None and choice.name == "last_paragraph"
    assert select_section(parse_report_text("INDICATION: cough\n", "r4"), "findings+impression") is None
    one = make_section_choice("findings", "No effusion.")
    assert one is not None and merge_sections([one]) is one


def test_merged_findings_count_once_and_findings_win() -> None:
    rep = structure_report(parse_report_text(REPORT, "r1"), RuleStructurer(), sections="findings+impression")
    assert rep is not None
    assert _rows(rep) == [
        (1, "effusion", "present", (RL,)),
        # "probable atelectasis" in the findings, stated plainly in the impression: one finding, now present
        (2, "atelectasis", "present", (RB,)),
        (3, "pneumothorax", "absent", (RL, LL)),
        # a hedged diagnosis right after the placed atelectasis lies there (report-level rules version 7)
        (6, "pneumonia", "uncertain", (RB,)),
    ]
    single = structure_report(parse_report_text(REPORT, "r1"), RuleStructurer())
    assert single is not None and [r[:3] for r in _rows(single)] == [
        (1, "effusion", "present"), (2, "atelectasis", "uncertain"), (3, "pneumothorax", "absent")]


def test_location_anaphora_uses_the_located_mention() -> None:
    section = make_section_choice("findings", "Small left pleural effusion. The effusion is unchanged. "
                                              "Pleural effusion on the right is new.")
    assert section is not None
    rep = RuleStructurer().structure("a", section)
    assert _rows(rep) == [(1, "effusion", "present", (LL,)), (2, "effusion", "present", (LL, RL)),
                          (3, "effusion", "present", (RL,))]
    # an absent finding, cardiomegaly and a lesion with no located mention keep their own labels
    section = make_section_choice("findings", "Left lower lobe pneumonia. No effusion. Edema. Cardiomegaly.")
    assert section is not None
    assert _rows(RuleStructurer().structure("b", section)) == [
        (1, "pneumonia", "present", (LB,)), (2, "effusion", "absent", (RL, LL)), (3, "edema", "present", (RL, LL)),
        (4, "cardiomegaly", "present", ("heart",))]


def test_resolve_is_idempotent_and_applies_to_any_structurer_output() -> None:
    section = select_section(parse_report_text(REPORT, "r1"), "findings+impression")
    assert section is not None
    raw = StructuredReport("x", section, (
        Finding("effusion", 1, "present", "effusion", ("right",), (RL,), "llm:m"),
        Finding("effusion", 4, "present", "effusion", (), (RL, LL), "llm:m"),
        Finding("effusion", 5, "absent", "effusion", (), (RL, LL), "llm:m"),
    ))
    once = resolve_findings(raw)
    assert [(f.sent_idx, f.assertion, f.reported_location) for f in once.findings] == [
        (1, "present", (RL,)), (5, "absent", (RL, LL))]
    assert resolve_findings(once) == once


def test_ils_config_validates_the_policy() -> None:
    assert IlsConfig().sections == "findings"
    assert IlsConfig(sections="findings+impression").to_dict()["sections"] == "findings+impression"
    assert IlsConfig(sections="impression").config_hash() != IlsConfig().config_hash()
    with pytest.raises(ConfigError, match="section policy"):
        IlsConfig(sections="all")


def test_structure_reports_and_cli_options(tmp_path: Path) -> None:
    reports = [parse_report_text(REPORT, "r1"), parse_report_text("INDICATION: cough\n", "r2")]
    done, failed = structure_reports(reports, RuleStructurer(), progress=False, sections="impression")
    assert [d.section.name for d in done] == ["impression"] and len(failed) == 1

    importlib.import_module("cxrground.cli.structure_cmds")  # registers `reports structure`
    from cxrground.cli import main

    path = tmp_path / "r1.txt"
    path.write_text("FINDINGS: Atelectasis or scarring at the left base.\n\nIMPRESSION: Left basilar atelectasis.\n")
    runner = CliRunner()
    result = runner.invoke(main, ["reports", "structure", str(path), "--sections", "findings+impression"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["section"], r["sent_idx"], r["lesion"] or r["entity"], r["assertion"]) for r in rows] == [
        ("findings+impression", 1, "atelectasis", "present"), ("findings+impression", 1, "scarring", "uncertain")]
    assert rows[0]["provenance"] == {"name": "rules", "version": RULES_VERSION, "alternatives": "uncertain"}
    result = runner.invoke(main, ["reports", "structure", str(path), "--alternatives", "present"])
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["section"], r["assertion"]) for r in rows] == [("findings", "present"), ("findings", "present")]
    assert rows[0]["provenance"]["alternatives"] == "present"
    result = runner.invoke(main, ["reports", "structure", str(path), "--structurer", "llm", "--alternatives",
                                  "present", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"])
    assert result.exit_code == 2 and "rules structurer only" in result.output
