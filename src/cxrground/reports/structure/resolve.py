"""Report-level rules applied after any structurer has read the sentences (rules and LLM alike).

0. **A sided lung clear with an exception** ("The left lung is (otherwise) clear except for minimal basilar
   atelectasis."): the lung findings written after the exception lie in that lung: an unplaced one takes that lung
   (and the words "left lung" as its location phrase), a place that names both sides keeps that side's labels.
1. **Location anaphora.** A positive (present or uncertain) finding of a lesion that has no location phrase of
   its own ("The effusion is small.", "Pneumonia." in the impression) refers back to the located positive
   findings of the same lesion in the section, when there are any: it takes their labels (in order of first
   mention) instead of the both-lungs default. Without this a repeated bare mention adds the other lung to a
   one-sided lesion. Cardiomegaly (always ``heart``), absent findings and non-target findings are left alone;
   the finding's ``location_phrases`` stay empty (nothing was written in its sentence). Round 5: a finding whose
   only location phrases are extent words ("scattered", "diffuse": :func:`~.lexicon.is_extent_phrase`) counts as
   unlocated here, and a lesion finding of a sentence that opens by pointing back ("This may represent
   atelectasis.", "The appearance suggests scarring or atelectasis.", "Findings are concerning for pneumonia.",
   "Superimposed pneumonia cannot be excluded.":
   :data:`~.lexicon.ANAPHOR_RE`) takes the labels
   of the located positive lung findings of the sentence before it, whatever their lesion; this direct reference
   comes before the same-lesion rule. Likewise an uncertain lesion finding whose phrase follows located positive
   lung findings of its own sentence takes their labels ("Subtle opacity at the right base, cannot exclude
   pneumonia."; "Patchy opacities at both lung bases may reflect atelectasis, though infection cannot be
   excluded."), unless it is edema or diffuse by its words ("possible pulmonary edema"). Version 7: a hedged
   pneumonia, atelectasis, consolidation or opacity with no place, in a sentence that places nothing, takes the
   labels of the placed observations and parenchymal lesions of the sentence right before it when its own lesion
   is located nowhere ("Left basilar opacity. Atelectasis is favored over pneumonia."); a size word may stand
   before "adjacent", "superimposed", ... of a pointing-back sentence ("Small adjacent effusion."). Version 8: a
   pointing-back sentence does not place edema either ("Findings consistent with edema." keeps the edema's own
   place, or the same-lesion rule's). Version 9: an atelectasis pointing back to a sentence that placed only
   effusions lies at the base of each whole lung they name ("Moderate left pleural effusion. There is associated
   compressive atelectasis." → the left base), as in one sentence. Version 10: a pneumonia with no place that none
   of the rules above places lies where the section's placed positive opacities, consolidations, atelectases and
   pneumonias lie (the union of their labels) when every positive opacity, consolidation and atelectasis of the
   section is placed ("COVID-19 pneumonia manifesting as single nodular lesion. ... single nodular consolidation in
   left lower lung zone." → the left base); a pneumonia with an extent word or diffuse by its words ("multifocal
   pneumonia") stays in both lungs. Version 11: an uncertain pneumonia named in a differential (its sentence names
   other uncertain lung findings, lesions or not: "Interstitial prominence, which could be interstitial edema,
   infectious process or interstitial disease.") is not placed by the section's findings: it takes the places its
   alternatives end up with (here both lungs, as the edema), as the members of one list share a place.
2. **Merged sections** (section policy ``findings+impression``): a finding from a later part of the section
   whose lesion (or, for a non-target finding, lower-cased entity), presence and reported location equal those
   of a finding from an earlier part is dropped: one lesion + location reported in both the findings and the
   impression counts once, and the findings sentence keeps its index. When the earlier finding is uncertain and
   the repeated one present ("opacity, probable atelectasis" ... impression "Basilar atelectasis."), the kept
   finding becomes present: the definitive statement wins, the findings sentence keeps the index. Findings
   within one part are never merged.

:func:`resolve_findings` is idempotent.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from cxrground.reports.findings import Finding, StructuredReport
from cxrground.reports.structure.lexicon import (
    ANAPHOR_RE,
    ATELECTASIS,
    CLEAR_EXCEPT_RE,
    CONSOLIDATION,
    DIFFUSE_PHRASE_RE,
    EDEMA,
    EFFUSION,
    OPACITY,
    PNEUMONIA,
    is_extent_phrase,
)
from cxrground.vocab import HEART
from cxrground.vocab.lesions import HEART_MASK_LESIONS
from cxrground.vocab.locations import lung_bases, lung_label

__all__ = ["RESOLVE_VERSION", "exception_sides", "inherit_locations", "merge_duplicates", "resolve_findings"]

#: Version of the report-level rules (recorded with every structurer's output).
RESOLVE_VERSION: Final[str] = "11"

_NO_INHERIT = frozenset(HEART_MASK_LESIONS)  # the heart mask has no side to inherit
#: Lesions that explain an observation in the sentence after it, and the findings they take the place of (version 7).
_EXPLAINS: Final[frozenset[str]] = frozenset({PNEUMONIA, ATELECTASIS, CONSOLIDATION, OPACITY})


def _placed(f: Finding) -> bool:
    """Whether the finding's own sentence names a place for it (not only an extent word)."""
    return any(not is_extent_phrase(p) for p in f.location_phrases)


def _sentence_text(report: StructuredReport | None, sent_idx: int) -> str | None:
    """The text of sentence ``sent_idx``; None without a report or for a number outside the section (a hand-made
    report)."""
    if report is None:
        return None
    try:
        return report.section.sentence(sent_idx).text
    except IndexError:
        return None


def _points_back(report: StructuredReport | None, sent_idx: int) -> bool:
    text = _sentence_text(report, sent_idx) if sent_idx > 1 else None
    return text is not None and ANAPHOR_RE.match(text) is not None


def _phrase_position(report: StructuredReport | None, f: Finding) -> tuple[str, int] | None:
    """``f``'s sentence, lower-cased, and where its phrase starts in it (-1 when not found); None without the
    sentence."""
    text = _sentence_text(report, f.sent_idx)
    if text is None:
        return None
    low = text.lower()
    return low, low.find(f.entity.lower())


def _sentence_places(report: StructuredReport | None, f: Finding, placed: list[Finding]) -> list[str]:
    """Labels of the placed findings of ``f``'s sentence written before ``f`` when ``f`` is an uncertain lesion
    that may share a place ("Subtle opacity at the right base, cannot exclude pneumonia"; "..., though infection
    cannot be excluded"); none for edema or a phrase diffuse by its words."""
    found = _phrase_position(report, f)
    if found is None or f.assertion != "uncertain" or f.lesion == EDEMA:
        return []
    low, at = found
    if at <= 0 or DIFFUSE_PHRASE_RE.match(low, at) is not None:
        return []
    return [lab for p in placed if p is not f and 0 <= low.find(p.entity.lower()) < at for lab in p.reported_location]


def _explained_before(report: StructuredReport | None, f: Finding, before: list[Finding], placed_here: bool
                      ) -> list[str]:
    """Labels of the placed observations and parenchymal lesions of the sentence before ``f`` when ``f`` is a hedged
    parenchymal diagnosis of a sentence that places nothing ("Left basilar opacity. Atelectasis is favored over
    pneumonia."; version 7); none otherwise."""
    found = _phrase_position(report, f)
    if placed_here or f.assertion != "uncertain" or f.lesion not in _EXPLAINS or found is None:
        return []
    low, at = found
    if at >= 0 and DIFFUSE_PHRASE_RE.match(low, at) is not None:
        return []
    return [lab for p in before if p.lesion in _EXPLAINS for lab in p.reported_location]


def _diffuse_words(report: StructuredReport | None, f: Finding) -> bool:
    """Whether ``f``'s phrase is diffuse by its words ("multifocal pneumonia", "diffuse pneumonia")."""
    found = _phrase_position(report, f)
    return found is not None and found[1] >= 0 and DIFFUSE_PHRASE_RE.match(*found) is not None


#: Findings whose places a pneumonia with no place of its own takes (version 10).
_MANIFESTS: Final[frozenset[str]] = frozenset({OPACITY, CONSOLIDATION, ATELECTASIS})


def _diagnosis_places(findings: tuple[Finding, ...]) -> list[str]:
    """Labels of the placed positive parenchymal findings of the section when every positive opacity, consolidation
    and atelectasis of it is placed (version 10: "COVID-19 pneumonia manifesting as single nodular lesion. ...
    nodular consolidation in left lower lung zone." places the pneumonia at the left base); none otherwise."""
    parenchymal = [f for f in findings if f.presence == "positive" and f.lesion in _EXPLAINS]
    if any(f.lesion in _MANIFESTS and not _placed(f) for f in parenchymal):
        return []
    return [lab for f in parenchymal if _placed(f) for lab in f.reported_location if lab != HEART]


def _differential(f: Finding, findings: tuple[Finding, ...]) -> list[Finding]:
    """The other uncertain lung findings of ``f``'s sentence when ``f`` is uncertain: the differential ``f`` is named
    in ("could include interstitial edema, infectious process or interstitial disease"; version 11). Not other
    pneumonias nor the heart."""
    if f.assertion != "uncertain":
        return []
    return [g for g in findings if g.sent_idx == f.sent_idx and g is not f and g.assertion == "uncertain"
            and g.lesion != PNEUMONIA and g.lesion not in _NO_INHERIT and g.reported_location
            and HEART not in g.reported_location]


def inherit_locations(findings: tuple[Finding, ...], report: StructuredReport | None = None) -> tuple[Finding, ...]:
    """Rule 1 of the module docstring: unlocated positive lesion findings take the labels of located ones.

    ``report`` (its sentences) is needed for the pointing-back sentences; without it only the same-lesion rule
    applies.
    """
    located: dict[str, list[str]] = {}
    pending: list[int] = []  # unplaced pneumonias of a differential (version 11)
    by_sentence: dict[int, list[str]] = {}
    placed_in: dict[int, list[Finding]] = {}
    for f in findings:
        if f.lesion not in _NO_INHERIT and f.presence == "positive" and _placed(f) and HEART not in f.reported_location:
            by_sentence.setdefault(f.sent_idx, []).extend(f.reported_location)
            placed_in.setdefault(f.sent_idx, []).append(f)
            if f.lesion is not None:
                located.setdefault(f.lesion, []).extend(f.reported_location)
    if not by_sentence:
        return findings
    out = []
    for f in findings:
        if f.lesion is not None and f.lesion not in _NO_INHERIT and f.presence == "positive" and not _placed(f):
            points_back = _points_back(report, f.sent_idx) and f.lesion != EDEMA  # edema: version 8
            labels = by_sentence.get(f.sent_idx - 1) if points_back else None
            if labels and f.lesion == ATELECTASIS and all(p.lesion == EFFUSION for p in placed_in[f.sent_idx - 1]):
                labels = list(lung_bases(tuple(labels)))  # "Left effusion. Associated atelectasis.": version 9
            if not labels:
                labels = _sentence_places(report, f, placed_in.get(f.sent_idx, []))
            labels = labels or located.get(f.lesion) or _explained_before(report, f, placed_in.get(f.sent_idx - 1, []),
                                                                          f.sent_idx in by_sentence)
            if not labels and f.lesion == PNEUMONIA and not f.location_phrases and not _diffuse_words(report, f):
                if _differential(f, findings):  # version 11: placed with its differential, below
                    pending.append(len(out))
                else:
                    labels = _diagnosis_places(findings)
            if labels:
                f = replace(f, reported_location=tuple(dict.fromkeys(labels)))
        out.append(f)
    for i in pending:  # the places its alternatives end up with (version 11)
        f = out[i]
        labels = [lab for g in _differential(f, tuple(out)) for lab in g.reported_location]
        if labels:
            out[i] = replace(f, reported_location=tuple(dict.fromkeys(labels)))
    return tuple(out)


def exception_sides(findings: tuple[Finding, ...], report: StructuredReport | None = None) -> tuple[Finding, ...]:
    """Rule 0 of the module docstring: lung findings written after "the left lung is clear except for" lie in the
    left lung."""
    out = []
    for f in findings:
        text = _sentence_text(report, f.sent_idx)
        low = text.lower() if text is not None else ""
        m = CLEAR_EXCEPT_RE.search(low)
        if (m is None or f.lesion in _NO_INHERIT or not f.reported_location or HEART in f.reported_location
                or f.entity.lower() not in low[m.end():].split(";", 1)[0]):
            out.append(f)
            continue
        side = m.group(1)
        if _placed(f):
            kept = tuple(lab for lab in f.reported_location if lab.startswith(side))
            f = replace(f, reported_location=kept or f.reported_location)
        else:
            lung = text[m.start():m.start() + len(side) + len(" lung")]
            f = replace(f, location_phrases=(*f.location_phrases, lung), reported_location=(lung_label(side),))
        out.append(f)
    return tuple(out)


def _key(f: Finding) -> tuple[str, str, tuple[str, ...]]:
    what = f.lesion if f.lesion is not None else "~" + " ".join(f.entity.lower().split())
    return what, f.presence, f.reported_location


def merge_duplicates(report: StructuredReport, findings: tuple[Finding, ...]) -> tuple[Finding, ...]:
    """Rule 2 of the module docstring: a finding repeated in a later part of a merged section counts once."""
    parts = report.section.parts
    if len(parts) < 2:
        return findings
    first: dict[tuple[str, str, tuple[str, ...]], int] = {}  # key -> position in ``out`` of its first part's finding
    first_part: dict[tuple[str, str, tuple[str, ...]], str] = {}
    out: list[Finding] = []
    for f in sorted(findings, key=lambda x: x.sent_idx):
        part, key = report.section.part_of(f.sent_idx), _key(f)
        if key not in first_part or first_part[key] == part:
            first_part.setdefault(key, part)
            first.setdefault(key, len(out))
            out.append(f)
            continue
        kept = out[first[key]]
        if kept.assertion == "uncertain" and f.assertion == "present":
            # the impression states definitively what the findings hedged: keep the findings sentence, made present
            out[first[key]] = replace(kept, assertion="present", hedge=None)
    return tuple(out)


def resolve_findings(report: StructuredReport) -> StructuredReport:
    """``report`` with the report-level rules of this module applied."""
    findings = merge_duplicates(report, inherit_locations(exception_sides(report.findings, report), report))
    if findings == report.findings:
        return report
    return replace(report, findings=findings)
