"""A structurer's findings are checked where the toolkit calls it: a lesion, assertion, sentence number or location
outside the vocabulary is a BackendError naming the structurer, the report and the value; ``ils build`` records it
for the study and goes on, ``reports structure`` for the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cxrground.errors import BackendError
from cxrground.ils.build import BackendSpec, build_dataset
from cxrground.ils.config import IlsConfig
from cxrground.reports import parse_report_text, select_section
from cxrground.reports.findings import report_problem
from cxrground.reports.structure import STRUCTURERS, RuleStructurer, structure_reports, structure_section
from runtime_backend_helpers import WrongStructurer

TEXT = ("FINDINGS: Small left pleural effusion. There is no pneumothorax. Possible right basilar atelectasis. "
        "Heart size is mildly enlarged. Lungs are otherwise clear.")


def _section(text: str = TEXT, report_id: str = "r1") -> Any:
    section = select_section(parse_report_text(text, report_id=report_id))
    assert section is not None
    return section


@pytest.mark.parametrize(("mode", "said"), [
    ("lesion", "finding {n} ('pneumothorax') with lesion 'pneumothorax', not one of cardiomegaly, pneumonia, "
               "atelectasis, opacity, consolidation, edema, effusion or None"),
    ("assertion", "finding {n} ('effusion') with assertion 'maybe', not one of present, absent, uncertain"),
    ("sentence", "finding {n} ('effusion') with sentence 99, not one of the section's sentences 1..5"),
    ("location", "finding {n} ('effusion') with reported location ('left lower lobe',), not a tuple of ILS "
                 "location labels or 'heart'"),
    ("location-type", "finding {n} ('effusion') with reported location ['left lung'], not a tuple of ILS location "
                      "labels or 'heart'"),
])
def test_a_wrong_finding_is_a_backend_error_naming_structurer_report_and_value(mode, said):
    section = _section()
    n = len(RuleStructurer().structure("r1", section).findings) + 1
    expected = f"structurer 't-wrong': structure() of report 'r1' returned {said.format(n=n)}"
    with pytest.raises(BackendError) as caught:
        structure_section(WrongStructurer(mode), "r1", section)
    assert str(caught.value) == expected


def test_the_built_in_structurer_passes_the_check(tiny_ils_tasks):
    tasks, _ = tiny_ils_tasks
    texts = [TEXT, "IMPRESSION: Cardiomegaly with mild pulmonary edema. Right upper lobe consolidation, likely "
                   "pneumonia. Bibasilar opacities may represent atelectasis. No effusion."]
    texts += [Path(t.report_path).read_text() for t in tasks if t.report_path]
    rules = RuleStructurer()
    for i, text in enumerate(texts):
        section = select_section(parse_report_text(text, report_id=f"r{i}"))
        if section is None:
            continue
        found = rules.structure(f"r{i}", section)
        assert report_problem(found) is None
        assert structure_section(rules, f"r{i}", section).findings  # through the checked call site


def test_reports_structure_records_the_wrong_report_and_keeps_the_others():
    reports = [parse_report_text(TEXT, report_id=k) for k in ("good", "bad", "also-good")]
    done, failures = structure_reports(reports, WrongStructurer("assertion", only=("bad",)), progress=False)
    assert [d.report_id for d in done] == ["good", "also-good"]
    assert len(failures) == 1 and failures[0].error == "BackendError"
    assert "structurer 't-wrong': structure() of report 'bad' returned" in failures[0].reason
    assert "assertion 'maybe'" in failures[0].reason


@pytest.mark.parametrize("synthesizer", ["normative", "pseudo-normal"])
def test_ils_build_records_a_wrong_structurer_output_per_study_and_goes_on(tiny_ils_tasks, tmp_path, synthesizer):
    tasks, failures = tiny_ils_tasks
    bad = tasks[0].study_key
    STRUCTURERS.register("t-wrong", WrongStructurer, help="a test structurer")
    try:
        spec = BackendSpec(structurer="t-wrong", structurer_kwargs={"mode": "lesion", "only": [bad]},
                           synthesizer=synthesizer)
        summary = build_dataset(tasks, tmp_path / "ils", IlsConfig(seed=0), spec, scan_failures=failures,
                                progress=False)
    finally:
        del STRUCTURERS._backends["t-wrong"]
    recorded = [json.loads(line) for line in (tmp_path / "ils" / "failures.jsonl").read_text().splitlines()]
    assert [f["study"] for f in recorded] == [bad], recorded
    failure = recorded[0]
    assert failure["error"] == "BackendError" and failure["stage"] == "structure"
    assert f"structurer 't-wrong': structure() of report '{bad}' returned" in failure["reason"]
    assert "lesion 'pneumothorax'" in failure["reason"]
    assert summary.failures == 1 and summary.processed == len(tasks) and not summary.every_failed


def test_structure_report_takes_text_and_a_structurer_name():
    from cxrground.reports.structure import structure_report

    got = structure_report("FINDINGS: Right lower lobe consolidation. No effusion.", "rules")
    assert [(f.lesion, f.assertion) for f in got.findings] == [("consolidation", "present"), ("effusion", "absent")]
