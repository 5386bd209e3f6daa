"""Scoring a structurer against the synthetic report truth and against Open-i (IU) MeSH major terms.

Synthetic truth (:func:`synthetic_cases`, :func:`cases_from_truth`): every reported present finding and
every negated lesion of a synthetic report, with its sentence, certainty and reported location (ILS §7.2
labels). :func:`synthetic_cases` uses the report-only route of the generator
(:func:`~cxrground.datasets.synthetic.study.plan_study` + :func:`~cxrground.datasets.synthetic.report.compose_report`,
no pixels; about 1 ms per report); its reports are drawn from ``default_rng([seed, index])`` like full
studies, but the random stream is not the one of :func:`~cxrground.datasets.synthetic.generate_study`, so the
texts differ from those of a written cohort with the same seed. :func:`cases_from_truth` scores written
cohorts (``load_truth`` + the report files).

Matching is per (sentence of the chosen section, lesion). Scores (:func:`score_synthetic`), per lesion and
overall:

- ``precision`` / ``recall`` of *present* findings: truth = present reported findings; prediction = findings
  with that lesion asserted present or uncertain.
- ``assertion_acc``: over truth findings (present, tentative or negated) that have a predicted finding of the
  same lesion in the same sentence, the share whose assertion is right (definitive -> present, tentative ->
  uncertain, negated -> absent).
- ``location_exact``: over matched present findings, the share whose reported location equals the truth
  labels in the same order; ``location_set`` ignores order.

MeSH (:func:`mesh_lesions`, :func:`score_mesh`): a report is positive for a lesion when one of its MeSH major
terms maps to it (:data:`MESH_TO_LESION`, on the term before the first ``/``); the prediction is positive when
the structurer finds the lesion present or uncertain in the FINDINGS and IMPRESSION text together (all
sentences, not only the ILS-chosen section, because the MeSH coders read the whole report). ``Airspace
Disease`` and ``Infiltrate`` count as opacity (they are opacity phrases of the lexicon); ``Pulmonary
Congestion``, ``Volume Loss``, ``Heart Failure`` and ``Density`` map to nothing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from cxrground.reports.findings import Finding, Structurer
from cxrground.reports.model import Report, SectionChoice
from cxrground.reports.readers import parse_report_text
from cxrground.reports.sections import choose_section, make_section_choice
from cxrground.reports.sentences import normalise_whitespace
from cxrground.vocab import LESIONS

__all__ = [
    "MESH_TO_LESION",
    "SyntheticCase",
    "TruthItem",
    "cases_from_truth",
    "format_scores",
    "mesh_lesions",
    "mesh_section",
    "score_mesh",
    "score_synthetic",
    "synthetic_cases",
]

#: MeSH major term (text before the first ``/``) -> lesion.
MESH_TO_LESION: Final[dict[str, str]] = {
    "Cardiomegaly": "cardiomegaly",
    "Pneumonia": "pneumonia",
    "Pulmonary Atelectasis": "atelectasis",
    "Atelectasis": "atelectasis",
    "Opacity": "opacity",
    "Airspace Disease": "opacity",
    "Infiltrate": "opacity",
    "Consolidation": "consolidation",
    "Pulmonary Edema": "edema",
    "Edema": "edema",
    "Pleural Effusion": "effusion",
}


@dataclass(frozen=True)
class TruthItem:
    """One true finding: lesion, assertion (present / uncertain / absent), sentence text, labels."""

    lesion: str
    assertion: str
    sentence: str
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class SyntheticCase:
    """A synthetic report and its truth items (for the section ILS would choose)."""

    report_id: str
    text: str
    truth: tuple[TruthItem, ...]


def synthetic_cases(n: int, seed: int = 0, config: Any = None) -> Iterator[SyntheticCase]:
    """``n`` synthetic reports with exact truth, from the generator's report-only route (no pixels)."""
    from cxrground.datasets.synthetic import SynthConfig
    from cxrground.datasets.synthetic.report import compose_report
    from cxrground.datasets.synthetic.study import plan_study, study_ids

    config = config or SynthConfig()
    for index in range(n):
        rng = np.random.default_rng([int(seed), int(index)])
        plan = plan_study(rng, config)
        ids = study_ids(int(seed), int(index))
        rep = compose_report(rng, plan.specs, plan.view, plan.heart_status, plan.sternotomy, plan.impression_only,
                             ids.has_prior)
        items: list[TruthItem] = []
        for i, spec in enumerate(plan.specs):
            if i not in rep.findings:
                continue
            sentence = rep.findings[i][0]
            assertion = "uncertain" if spec.certainty == "tentative" else "present"
            items.append(TruthItem(spec.lesion, assertion, normalise_whitespace(sentence), tuple(spec.site.labels)))
        for lesion, (sentence, _section) in rep.negations.items():
            items.append(TruthItem(lesion, "absent", normalise_whitespace(sentence)))
        yield SyntheticCase(ids.study_id, rep.text, tuple(items))


def cases_from_truth(records: Iterable[Any], reports: dict[str, str]) -> list[SyntheticCase]:
    """Cases of written synthetic studies: ``records`` are ``StudyTruth``; ``reports`` maps study id -> report text."""
    out = []
    for t in records:
        items = []
        for f in t.findings:
            if f.present and f.reported and f.sentence:
                assertion = "uncertain" if f.certainty == "tentative" else "present"
                items.append(TruthItem(f.lesion, assertion, normalise_whitespace(f.sentence),
                                       tuple(f.reported_location)))
            elif f.negated and f.sentence:
                items.append(TruthItem(f.lesion, "absent", normalise_whitespace(f.sentence)))
        out.append(SyntheticCase(t.study_id, reports[t.study_id], tuple(items)))
    return out


def _sentence_index(section: SectionChoice, sentence: str) -> int | None:
    texts = [normalise_whitespace(s.text) for s in section.sentences]
    for s, text in zip(section.sentences, texts, strict=True):
        if text == sentence:
            return s.index
    for s, text in zip(section.sentences, texts, strict=True):
        if sentence in text or text in sentence:
            return s.index
    return None


@dataclass
class _Tally:
    tp: int = 0
    pred: int = 0
    true: int = 0
    assert_n: int = 0
    assert_ok: int = 0
    loc_n: int = 0
    loc_exact: int = 0
    loc_set: int = 0
    confusion: Counter = field(default_factory=Counter)

    def add(self, other: _Tally) -> None:
        for name in ("tp", "pred", "true", "assert_n", "assert_ok", "loc_n", "loc_exact", "loc_set"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.confusion.update(other.confusion)

    def row(self) -> dict[str, Any]:
        def ratio(a: int, b: int) -> float | None:
            return a / b if b else None

        return {
            "n_true": self.true, "n_pred": self.pred, "tp": self.tp,
            "precision": ratio(self.tp, self.pred), "recall": ratio(self.tp, self.true),
            "n_assert": self.assert_n, "assertion_acc": ratio(self.assert_ok, self.assert_n),
            "n_loc": self.loc_n, "location_exact": ratio(self.loc_exact, self.loc_n),
            "location_set": ratio(self.loc_set, self.loc_n),
        }  # fmt: skip


def score_synthetic(structurer: Structurer, cases: Iterable[SyntheticCase]) -> dict[str, Any]:
    """Scores of ``structurer`` on synthetic ``cases`` (see the module docstring), plus error examples."""
    tallies: dict[str, _Tally] = {lesion: _Tally() for lesion in LESIONS}
    errors: list[dict[str, Any]] = []
    n_reports = unplaced = 0
    for case in cases:
        n_reports += 1
        section = choose_section(parse_report_text(case.text, report_id=case.report_id))
        if section is None:
            continue
        found = structurer.structure(case.report_id, section).findings
        by_key: dict[tuple[int, str], list[Finding]] = defaultdict(list)
        for f in found:
            if f.lesion is not None:
                by_key[(f.sent_idx, f.lesion)].append(f)
                if f.assertion != "absent":
                    tallies[f.lesion].pred += 1
        for item in case.truth:
            idx = _sentence_index(section, item.sentence)
            if idx is None:
                unplaced += 1
                continue
            tally = tallies[item.lesion]
            preds = by_key.get((idx, item.lesion), [])
            if item.assertion != "absent":
                tally.true += 1
                positive = [f for f in preds if f.assertion != "absent"]
                if positive:
                    tally.tp += 1
                    pred = positive.pop(0)
                    preds.remove(pred)
                    tally.loc_n += 1
                    tally.loc_exact += pred.reported_location == item.labels
                    tally.loc_set += set(pred.reported_location) == set(item.labels)
                    if pred.reported_location != item.labels and len(errors) < 200:
                        errors.append({"kind": "location", "sentence": item.sentence, "lesion": item.lesion,
                                       "true": list(item.labels), "pred": list(pred.reported_location)})
                    tally.assert_n += 1
                    tally.assert_ok += pred.assertion == item.assertion
                    tally.confusion[(item.assertion, pred.assertion)] += 1
                    if pred.assertion != item.assertion and len(errors) < 200:
                        errors.append({"kind": "assertion", "sentence": item.sentence, "lesion": item.lesion,
                                       "true": item.assertion, "pred": pred.assertion})
                elif len(errors) < 200:
                    errors.append({"kind": "missed", "sentence": item.sentence, "lesion": item.lesion,
                                   "true": item.assertion, "pred": [f.assertion for f in preds]})
            elif preds:
                pred = preds.pop(0)
                tally.assert_n += 1
                tally.assert_ok += pred.assertion == "absent"
                tally.confusion[("absent", pred.assertion)] += 1
                if pred.assertion != "absent" and len(errors) < 200:
                    errors.append({"kind": "assertion", "sentence": item.sentence, "lesion": item.lesion,
                                   "true": "absent", "pred": pred.assertion})
            else:
                tally.confusion[("absent", "missing")] += 1
    total = _Tally()
    for t in tallies.values():
        total.add(t)
    return {
        "n_reports": n_reports,
        "unplaced_truth": unplaced,
        "per_lesion": {lesion: t.row() for lesion, t in tallies.items()},
        "overall": total.row(),
        "confusion": {f"{a}->{b}": n for (a, b), n in sorted(total.confusion.items())},
        "errors": errors,
    }


def mesh_lesions(mesh_major: Sequence[str]) -> set[str]:
    """Lesions named by a report's MeSH major terms (:data:`MESH_TO_LESION`)."""
    out = set()
    for term in mesh_major:
        lesion = MESH_TO_LESION.get(term.split("/", 1)[0].strip())
        if lesion:
            out.add(lesion)
    return out


def mesh_section(report: Report) -> SectionChoice | None:
    """FINDINGS and IMPRESSION of ``report`` as one section (named ``findings``), or None when both are empty."""
    parts = [report.sections.get(name, "") for name in ("findings", "impression")]
    text = "\n\n".join(p for p in parts if p and p.strip())
    return make_section_choice("findings", text) if text else None


def score_mesh(structurer: Structurer, reports: Iterable[Report]) -> dict[str, Any]:
    """Per-lesion precision / recall of ``structurer`` against the MeSH major terms of IU ``reports``."""
    from cxrground.reports.structure.lexicon import ENTITY_KINDS, ENTITY_RE

    rows = {lesion: Counter() for lesion in (*LESIONS, "opacity (incl. attributed)")}
    n = 0
    for report in reports:
        section = mesh_section(report)
        if section is None:
            continue
        n += 1
        truth = mesh_lesions(report.mesh_major)
        found = structurer.structure(report.report_id, section).findings
        pred = {f.lesion for f in found if f.lesion is not None and f.assertion != "absent"}
        obs = pred | {"opacity (incl. attributed)"} if "opacity" in pred or any(
            f.assertion != "absent" and (m := ENTITY_RE.fullmatch(f.entity.lower())) is not None
            and ENTITY_KINDS[m.lastgroup].lesion == "opacity"  # type: ignore[index]
            for f in found) else pred
        for lesion, c in rows.items():
            key = "opacity" if lesion == "opacity (incl. attributed)" else lesion
            is_true = key in truth
            is_pred = lesion in obs if lesion == "opacity (incl. attributed)" else lesion in pred
            c["tp"] += is_true and is_pred
            c["fp"] += is_pred and not is_true
            c["fn"] += is_true and not is_pred
    out: dict[str, Any] = {"n_reports": n, "per_lesion": {}}
    for lesion, c in rows.items():
        tp, fp, fn = c["tp"], c["fp"], c["fn"]
        out["per_lesion"][lesion] = {
            "n_true": tp + fn, "n_pred": tp + fp, "tp": tp,
            "precision": tp / (tp + fp) if tp + fp else None, "recall": tp / (tp + fn) if tp + fn else None,
        }  # fmt: skip
    return out


def format_scores(scores: dict[str, Any], columns: Sequence[str]) -> str:
    """A plain-text table of ``scores['per_lesion']`` (and ``overall`` when present)."""
    rows = dict(scores["per_lesion"])
    if "overall" in scores:
        rows["overall"] = scores["overall"]
    width = max(len(k) for k in rows) + 2
    lines = ["lesion".ljust(width) + "".join(c.rjust(15) for c in columns)]
    for name, row in rows.items():
        cells = []
        for c in columns:
            v = row.get(c)
            cells.append(("-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)).rjust(15))
        lines.append(name.ljust(width) + "".join(cells))
    return "\n".join(lines)
