"""Agreement of the rule structurer with the synthetic report truth and with the IU MeSH major terms.

Floors are below the measured values (bench/structure.py: 1.000 on 500 report-only synthetic reports; on
the 300 IU reports MeSH recall cardiomegaly 0.96, atelectasis 1.00, effusion 1.00).
"""

from __future__ import annotations

import pytest

from cxrground.datasets.synthetic import generate_study
from cxrground.evaluation.report_quality import (
    cases_from_truth,
    format_scores,
    mesh_lesions,
    score_mesh,
    score_synthetic,
    synthetic_cases,
)
from cxrground.reports import read_report
from cxrground.reports.structure import RuleStructurer


def test_agreement_with_synthetic_truth() -> None:
    scores = score_synthetic(RuleStructurer(), synthetic_cases(300, seed=11))
    overall = scores["overall"]
    assert scores["unplaced_truth"] == 0
    assert overall["n_true"] > 300 and overall["n_assert"] > 700
    assert overall["recall"] >= 0.97
    assert overall["precision"] >= 0.97
    assert overall["assertion_acc"] >= 0.97
    assert overall["location_exact"] >= 0.95
    for lesion, row in scores["per_lesion"].items():
        assert row["n_true"] > 0, lesion
        assert row["recall"] >= 0.9, (lesion, row)
    assert "overall" in format_scores(scores, ["precision", "recall"])


def test_agreement_with_written_study_truth() -> None:
    studies = [generate_study(5, i) for i in range(3)]
    cases = cases_from_truth([s.truth for s in studies], {s.truth.study_id: s.report for s in studies})
    scores = score_synthetic(RuleStructurer(), cases)
    assert scores["unplaced_truth"] == 0
    assert scores["overall"]["assertion_acc"] == 1.0


def test_mesh_mapping() -> None:
    assert mesh_lesions(["Opacity/lung/base/left", "Pulmonary Atelectasis/base", "Calcified Granuloma"]) == {
        "opacity", "atelectasis"}
    assert mesh_lesions(["Airspace Disease/lung", "Pleural Effusion/bilateral", "Pulmonary Congestion"]) == {
        "opacity", "effusion"}
    assert mesh_lesions(["normal"]) == set()


@pytest.mark.pack
def test_agreement_with_iu_mesh(pack_dir) -> None:
    paths = sorted((pack_dir / "iu_reports").glob("*.xml"))
    scores = score_mesh(RuleStructurer(), (read_report(p) for p in paths))
    assert scores["n_reports"] >= 290
    rows = scores["per_lesion"]
    for lesion in ("cardiomegaly", "atelectasis", "effusion"):
        assert rows[lesion]["recall"] >= 0.9, (lesion, rows[lesion])
        assert rows[lesion]["precision"] >= 0.75, (lesion, rows[lesion])
    assert rows["opacity (incl. attributed)"]["recall"] >= 0.9
