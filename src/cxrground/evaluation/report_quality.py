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

MeSH (:func:`mesh_lesions`, :func:`mesh_sides`, :func:`mesh_cases`, :func:`score_mesh_cases`, :func:`score_mesh`):
a report is positive for a lesion when one of its MeSH major terms maps to it (:data:`MESH_TO_LESION`, on the
term before the first ``/``); ``Airspace Disease`` and ``Infiltrate`` count as opacity (opacity phrases of the
lexicon); the MeSH descriptors that are kinds of a lesion (``Pneumonia, Aspiration``, ``Bronchopneumonia``,
``Hydrothorax``, ...) count as that lesion; ``Pulmonary Congestion``, ``Volume Loss``, ``Heart Failure``,
``Lung/hypoinflation``, ``Density``, ``Cardiac Shadow`` and ``Costophrenic Angle`` map to nothing, each for the reason
the lexicon gives its phrase (congestion is not edema, volume loss and low lung volumes are not atelectasis,
"density" names bones and masses too, blunting of the angle is a sign that an effusion or pleural thickening can
give); ``Cardiac Shadow/enlarged`` is what the coders write for a silhouette
that looks large without being called cardiomegaly ("prominent, probably accentuated by low volumes"), so it is
not cardiomegaly either. A qualifier of :data:`MESH_HEDGE_QUALIFIERS` (``Cardiomegaly/borderline``) records that
the report hedged the term; see :func:`score_mesh_cases` for how it is counted. The sides of a lesion are the
``right`` / ``left`` / ``bilateral`` qualifiers of its terms (lingula = left, middle lobe = right when no side is
written). The prediction reads the
sections of a section policy (default ``findings+impression``, as the MeSH coders read the whole report) with
the report-level rules applied, and counts either present and uncertain findings (``positive``, the ILS
presence), present findings only (``present``), or present findings and those hedged with a ``likely``-grade
hedge (``likely``: "probable pneumonia"; :data:`cxrground.reports.findings.HEDGES`). Per lesion: precision,
recall, F1 and side agreement; macro F1 over the lesions with MeSH-positive reports. The reports are split once
into two fixed halves by a salted hash of the report id (:func:`mesh_split`): rounds 1-4 of issue 16 read errors
on ``dev`` only, so that ``held-out`` measured what the fixes made on dev are worth on reports nobody looked at;
round 5 read the held-out disagreements too, so neither half is unseen since.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from cxrground.reports.findings import Finding, Structurer
from cxrground.reports.labels import OPACITY_OBSERVED as OPACITY_FIELD
from cxrground.reports.labels import label_mentions, mention_assertion, roll_up
from cxrground.reports.model import MERGED_SECTION, Report, SectionChoice
from cxrground.reports.readers import parse_report_text
from cxrground.reports.sections import choose_section, select_section
from cxrground.reports.sentences import normalise_whitespace
from cxrground.reports.structure import structure_reports, structured_by
from cxrground.vocab import LESIONS

__all__ = [
    "MESH_COUNTS",
    "MESH_HEDGE_QUALIFIERS",
    "MESH_SIDE_OF",
    "MESH_SPLITS",
    "MESH_SPLIT_SALT",
    "MESH_TO_LESION",
    "OPACITY_OBSERVED",
    "MeshCase",
    "MeshMention",
    "SyntheticCase",
    "TruthItem",
    "cases_from_truth",
    "format_scores",
    "hedge_coding",
    "mesh_cases",
    "mesh_hedged",
    "mesh_lesions",
    "mesh_section",
    "mesh_sides",
    "mesh_split",
    "score_mesh",
    "score_mesh_cases",
    "score_synthetic",
    "synthetic_cases",
]

#: MeSH major term (text before the first ``/``) -> lesion, by meaning (the lexicon's phrase for the same thing maps
#: to the same lesion). Round 4 added the MeSH descriptors that are kinds of a lesion: ``Pneumonia, Aspiration`` /
#: ``Bacterial`` / ``Viral``, ``Bronchopneumonia``, ``Pleuropneumonia`` (pneumonia: the lexicon reads aspiration
#: pneumonia and bronchopneumonia as pneumonia), ``Hydrothorax`` and ``Pleural Effusion, Malignant`` (effusion: the
#: lexicon reads hydrothorax as effusion). Deliberately unmapped (see the module docstring): ``Pulmonary Congestion``
#: (congestion is not edema), ``Lung/hypoinflation`` (low lung volumes: neither atelectasis nor any other lesion;
#: head ``Lung``), ``Volume Loss``, ``Heart Failure``, ``Lung Diseases, Interstitial`` and ``Markings`` (interstitial
#: signs, not edema), ``Radiation Pneumonitis`` (treatment injury, not infection), ``Density``, ``Cardiac Shadow``,
#: ``Costophrenic Angle``.
MESH_TO_LESION: Final[dict[str, str]] = {
    "Cardiomegaly": "cardiomegaly",
    "Pneumonia": "pneumonia",
    "Pneumonia, Aspiration": "pneumonia",
    "Pneumonia, Bacterial": "pneumonia",
    "Pneumonia, Viral": "pneumonia",
    "Bronchopneumonia": "pneumonia",
    "Pleuropneumonia": "pneumonia",
    "Pulmonary Atelectasis": "atelectasis",
    "Atelectasis": "atelectasis",
    "Opacity": "opacity",
    "Airspace Disease": "opacity",
    "Infiltrate": "opacity",
    "Consolidation": "consolidation",
    "Pulmonary Edema": "edema",
    "Edema": "edema",
    "Pleural Effusion": "effusion",
    "Pleural Effusion, Malignant": "effusion",
    "Hydrothorax": "effusion",
}
#: MeSH qualifiers that record the report's own hedge: "borderline cardiomegaly" is coded ``Cardiomegaly/borderline``.
MESH_HEDGE_QUALIFIERS: Final[frozenset[str]] = frozenset({"borderline"})
#: Side-less MeSH qualifiers that name a side by anatomy (the lingula is left, the middle lobe right).
MESH_SIDE_OF: Final[dict[str, str]] = {"lingula": "left", "middle lobe": "right"}
#: Row of :func:`score_mesh_cases` that also counts opacity-class phrases attributed to another lesion.
OPACITY_OBSERVED: Final[str] = "opacity (incl. attributed)"
#: The two fixed halves of the MeSH evaluation: errors are read on ``dev`` only; ``held-out`` is never looked at.
MESH_SPLITS: Final[tuple[str, str]] = ("dev", "held-out")
#: What makes a report positive for a lesion in :func:`score_mesh_cases`.
MESH_COUNTS: Final[tuple[str, ...]] = ("positive", "present", "likely")
#: Salt of :func:`mesh_split` (fixed once, before any error was read).
MESH_SPLIT_SALT: Final[str] = "cxrground-mesh-split"


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
        found = structured_by(structurer, case.report_id, section).findings  # scored as the structurer gives them
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


def _mesh_head(term: str) -> tuple[str, tuple[str, ...]]:
    head, *qualifiers = (part.strip() for part in term.split("/"))
    return head, tuple(q.lower() for q in qualifiers)


def _mesh_lesion(term: str) -> str | None:
    return MESH_TO_LESION.get(_mesh_head(term)[0])


def mesh_lesions(mesh_major: Sequence[str]) -> set[str]:
    """Lesions named by a report's MeSH major terms (:data:`MESH_TO_LESION`, on the term before the first ``/``)."""
    return {lesion for term in mesh_major if (lesion := _mesh_lesion(term)) is not None}


def mesh_hedged(mesh_major: Sequence[str]) -> frozenset[str]:
    """Lesions every MeSH major term of which carries a hedge qualifier (:data:`MESH_HEDGE_QUALIFIERS`)."""
    by_lesion: dict[str, bool] = {}
    for term in mesh_major:
        lesion = _mesh_lesion(term)
        if lesion is not None:
            hedged = any(q in MESH_HEDGE_QUALIFIERS for q in _mesh_head(term)[1])
            by_lesion[lesion] = by_lesion.get(lesion, True) and hedged
    return frozenset(lesion for lesion, hedged in by_lesion.items() if hedged)


def mesh_sides(mesh_major: Sequence[str]) -> dict[str, frozenset[str]]:
    """Sides (``right`` / ``left``) the MeSH major terms give each lesion; lesions coded without a side are left out.

    ``bilateral`` is both sides; a term without a side word takes the side of its lobe (:data:`MESH_SIDE_OF`).
    """
    out: dict[str, set[str]] = {}
    for term in mesh_major:
        lesion = _mesh_lesion(term)
        if lesion is None or lesion == "cardiomegaly":
            continue
        qualifiers = _mesh_head(term)[1]
        sides = {q for q in qualifiers if q in ("right", "left")}
        if "bilateral" in qualifiers:
            sides |= {"right", "left"}
        if not sides:
            sides = {MESH_SIDE_OF[q] for q in qualifiers if q in MESH_SIDE_OF}
        if sides:
            out.setdefault(lesion, set()).update(sides)
    return {lesion: frozenset(sides) for lesion, sides in out.items()}


def mesh_split(report_id: str) -> str:
    """``dev`` or ``held-out``: the fixed half of the MeSH evaluation a report belongs to (salted SHA-256 parity)."""
    digest = hashlib.sha256((MESH_SPLIT_SALT + report_id).encode("utf-8")).digest()
    return MESH_SPLITS[digest[0] % 2]


def mesh_section(report: Report, sections: str = MERGED_SECTION) -> SectionChoice | None:
    """The section of ``report`` that the section policy ``sections`` reads (default: findings and impression)."""
    return select_section(report, sections)


def _label_field(row: str) -> str:
    """The label field of :mod:`cxrground.reports.labels` that the score row ``row`` counts."""
    return OPACITY_FIELD if row == OPACITY_OBSERVED else row


@dataclass(frozen=True)
class MeshMention:
    """One positive (present or uncertain) finding of a structured report, as the MeSH scoring sees it.

    ``lesion``: the finding's lesion (None: an opacity-class phrase of no target lesion); ``opacity_phrase``: the
    phrase is opacity-class, so the finding also counts on the ``opacity (incl. attributed)`` row. What a mention
    states about a row, and how the mentions of a report roll up, are the rules of :mod:`cxrground.reports.labels`
    (an attributed observation whose *cause* is hedged, "opacities, likely atelectasis", still states the opacity).
    """

    lesion: str | None
    opacity_phrase: bool
    assertion: str
    sides: frozenset[str]
    sentence: str
    hedge: str | None = None

    def counts_for(self, row: str, count: str) -> bool:
        """Whether this mention makes the report positive for ``row`` when counting ``count`` findings."""
        said = mention_assertion(self, _label_field(row))
        return said == "present" or (said == "uncertain" and (
            count == "positive" or (count == "likely" and self.hedge == "likely")))


@dataclass(frozen=True)
class MeshCase:
    """One IU report under one section policy: its MeSH truth and the structurer's positive findings.

    ``truth_hedged``: the lesions of ``truth`` that the coders marked as hedged (:func:`mesh_hedged`).
    """

    report_id: str
    split: str
    section: str
    truth: frozenset[str]
    truth_sides: dict[str, frozenset[str]]
    mentions: tuple[MeshMention, ...]
    text: str
    mesh_major: tuple[str, ...]
    truth_hedged: frozenset[str] = frozenset()


def mesh_cases(structurer: Structurer, reports: Iterable[Report], sections: str = MERGED_SECTION) -> list[MeshCase]:
    """One :class:`MeshCase` per report structured under the section policy ``sections``.

    Reports without a usable section (neither findings nor impression), and reports the structurer fails on (an
    LLM request that fails after its retries), are left out; compare ``len(result)`` with the input. The mentions
    are the positive ones of :func:`cxrground.reports.labels.label_mentions`.
    """
    reports = list(reports)
    by_id = {r.report_id: r for r in reports}
    done, _failures = structure_reports(reports, structurer, progress=False, sections=sections)
    out = []
    for structured in done:
        report, section = by_id[structured.report_id], structured.section
        mentions = [MeshMention(m.lesion, m.opacity_phrase, m.assertion, m.sides, section.sentence(m.sent_idx).text,
                                m.hedge) for m in label_mentions(structured) if m.assertion != "absent"]
        out.append(MeshCase(
            report_id=report.report_id, split=mesh_split(report.report_id), section=section.name,
            truth=frozenset(mesh_lesions(report.mesh_major)), truth_sides=mesh_sides(report.mesh_major),
            mentions=tuple(mentions), text=section.section_content, mesh_major=report.mesh_major,
            truth_hedged=mesh_hedged(report.mesh_major),
        ))
    return out


#: The roll-up policy (:data:`cxrground.reports.labels.UNCERTAIN_POLICIES`) of each count of :data:`MESH_COUNTS`.
_COUNT_POLICY: Final[dict[str, str]] = {"positive": "present", "present": "uncertain", "likely": "likely"}


def _f1(tp: int, fp: int, fn: int) -> float | None:
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None


def score_mesh_cases(cases: Iterable[MeshCase], split: str | None = None, count: str = "positive") -> dict[str, Any]:
    """Per-lesion precision / recall / F1, side agreement and macro F1 of ``cases`` (only ``split`` when given).

    ``count``: ``positive`` (present or uncertain findings make a report positive: ILS presence), ``present``
    (definitive findings only: MeSH coders rarely code a hedged diagnosis) or ``likely`` (definitive findings and
    findings hedged with a ``likely``-grade hedge, "probable pneumonia": what the coders do code). The exception is
    a lesion the coders coded *as hedged* (``Cardiomegaly/borderline`` for "borderline cardiomegaly",
    :attr:`MeshCase.truth_hedged`): the truth itself is the hedged statement, which the structurer reports as
    uncertain (ILS §7.1), so for that lesion an uncertain finding counts under ``present`` too. Comparing a hedged
    truth with definitive findings only would score the structurer wrong exactly when it reads the hedge right.
    Rows: the seven lesions on the lesion field, and ``opacity (incl. attributed)``. ``macro_f1`` averages the F1 of
    the lesions with at least one MeSH-positive report, opacity taken with its attributed observations;
    ``macro_f1_lesion_field`` uses the plain opacity row instead. ``side_exact``: over true positives whose MeSH
    terms give a side, the share whose predicted sides (of the counted findings) are exactly the MeSH sides. A row
    is predicted, with the sides of the counted findings, by the roll-up of :func:`cxrground.reports.labels.roll_up`
    (uncertain findings counted as present under ``positive``): the statuses of ``cxrground reports label`` are what
    this counts (code 1 under ``present``, 1 or -1 under ``positive``; there the sides also take those of the
    uncertain findings).
    """
    if count not in MESH_COUNTS:
        raise ValueError(f"unknown count {count!r}; expected one of {MESH_COUNTS}")
    rows = {lesion: Counter() for lesion in (*LESIONS, OPACITY_OBSERVED)}
    n = 0
    errors: list[dict[str, Any]] = []
    for case in cases:
        if split is not None and case.split != split:
            continue
        n += 1
        for row, c in rows.items():
            key = "opacity" if row == OPACITY_OBSERVED else row
            row_count = "positive" if key in case.truth_hedged else count
            rolled = roll_up(case.mentions, _label_field(row), _COUNT_POLICY[row_count])
            hits = rolled[1] if rolled is not None and rolled[0] == "present" else ()
            is_true, is_pred = key in case.truth, bool(hits)
            c["tp"] += is_true and is_pred
            c["fp"] += is_pred and not is_true
            c["fn"] += is_true and not is_pred
            if row == "opacity":
                continue  # sides and errors are taken once, on the row with the attributed observations
            truth_sides = case.truth_sides.get(key)
            pred_sides = frozenset().union(*(m.sides for m in hits))
            if is_true and is_pred and truth_sides:
                c["side_n"] += 1
                c["side_ok"] += pred_sides == truth_sides
            kind = ("fp" if is_pred and not is_true else "fn" if is_true and not is_pred else
                    "side" if is_true and truth_sides and pred_sides != truth_sides else None)
            if kind is not None:
                errors.append({"report_id": case.report_id, "split": case.split, "lesion": key, "kind": kind,
                               "mesh": list(case.mesh_major), "truth_sides": sorted(truth_sides or ()),
                               "pred_sides": sorted(pred_sides),
                               "evidence": list(dict.fromkeys(f"[{m.assertion}] {m.sentence}" for m in hits)),
                               "section": case.text})
    out: dict[str, Any] = {"n_reports": n, "count": count, "per_lesion": {}, "errors": errors}
    for lesion, c in rows.items():
        tp, fp, fn = c["tp"], c["fp"], c["fn"]
        out["per_lesion"][lesion] = {
            "n_true": tp + fn, "n_pred": tp + fp, "tp": tp,
            "precision": tp / (tp + fp) if tp + fp else None, "recall": tp / (tp + fn) if tp + fn else None,
            "f1": _f1(tp, fp, fn) if tp + fn else None,
            "side_n": c["side_n"], "side_exact": c["side_ok"] / c["side_n"] if c["side_n"] else None,
        }  # fmt: skip
    per = out["per_lesion"]
    scored = [lesion for lesion in LESIONS if per[lesion]["n_true"]]
    out["macro_lesions"] = scored
    out["macro_f1"] = (sum(per[OPACITY_OBSERVED if x == "opacity" else x]["f1"] for x in scored) / len(scored)
                       if scored else None)
    out["macro_f1_lesion_field"] = sum(per[x]["f1"] for x in scored) / len(scored) if scored else None
    side_n = sum(c["side_n"] for name, c in rows.items() if name != "opacity")
    side_ok = sum(c["side_ok"] for name, c in rows.items() if name != "opacity")
    out["side_exact"] = side_ok / side_n if side_n else None
    out["side_n"] = side_n
    return out


def hedge_coding(cases: Iterable[MeshCase], split: str | None = None) -> dict[str, dict[str, int]]:
    """How often the coders coded a lesion that the report only hedged, per hedge grade.

    Per report and lesion (opacity on its lesion field) whose findings are all uncertain (no present one): grade
    ``likely`` when one of them carries a ``likely``-grade hedge, ``possible`` when all are graded ``possible``,
    ``ungraded`` otherwise (LLM findings). Returns ``{grade: {"n": hedged-only lesions, "coded": of those with the
    lesion among the MeSH terms}}``: the evidence for what the ``likely`` count assumes.
    """
    out = {grade: {"n": 0, "coded": 0} for grade in ("likely", "possible", "ungraded")}
    for case in cases:
        if split is not None and case.split != split:
            continue
        for lesion in LESIONS:
            said = [m for m in case.mentions if mention_assertion(m, lesion) is not None]
            if not said or any(m.assertion == "present" for m in said):
                continue
            hedges = {m.hedge for m in said}
            grade = "likely" if "likely" in hedges else "possible" if hedges == {"possible"} else "ungraded"
            out[grade]["n"] += 1
            out[grade]["coded"] += lesion in case.truth
    return out


def score_mesh(structurer: Structurer, reports: Iterable[Report], sections: str = MERGED_SECTION,
               split: str | None = None, count: str = "positive") -> dict[str, Any]:
    """Per-lesion precision / recall / F1 of ``structurer`` against the MeSH major terms of IU ``reports``, reading
    the sections of the policy ``sections`` (see :func:`score_mesh_cases`)."""
    return score_mesh_cases(mesh_cases(structurer, reports, sections), split, count)


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
