"""Stage II: instruction-answer pair composition (ILS.md §4, §11).

Rules implemented (MUST items of the spec):

- every grounded lung/pleural finding → a ``basic`` positive over its grounded location GL;
  a ``global`` positive when GL covers the reported location RL; a ``lesion_inference`` positive
  for pneumonia, atelectasis and edema; a tentative finding's instruction word is ``opacity``
  while ``target`` keeps the lesion; cardiomegaly → ``global`` only, location ``heart``;
  (the lesion rules are read from :mod:`cxrground.vocab.traits`: ``heart_mask``, ``ctr_rule``,
  ``lesion_inference``, ``umbrella``, ``li_negative_target``)
- at most one negative per lesion type per study; cardiomegaly negatives only when CTR ≤ 0.45;
  basic negatives use a random lung region restricted to the empty locations EL whenever the
  report mentions any finding; a reported but ungrounded finding never yields a negative for its
  reported location.

Choices where the spec is silent (documented, switchable through :class:`IlsConfig`):

- **global positives** need exactly one positive finding of that lesion in the study (two findings
  of one lesion would make "Segment the X." ambiguous between two masks);
- **umbrella terms**: ``opacity`` and ``consolidation`` get no global negative and only EL regions
  when any lung lesion (pneumonia, atelectasis, opacity, consolidation, edema) is reported present
  or uncertain — a tentative pneumonia *is* an opacity;
- **global negatives** are used with the train-split shares of ILS §11.2, and only for lesions that
  are not mentioned, or negated without a side (with :attr:`IlsConfig.global_negative_needs_region`, only where a
  basic negative could be placed, so that the share holds among the emitted negatives); ``opacity``
  negatives take the lesion-inference form with the §11.2 share;
- **silent reports**: a report that says nothing about the film (no finding of any kind and no normal-examination
  statement, :func:`cxrground.reports.reading.reads_the_film`: a clinical note such as "Fever and two days of
  odynophagia") gives no lung or pleural negative: its silence about a lesion is not a reading of the image. The
  withheld negatives are counted on the card; the CTR-decided cardiomegaly negative stays
  (``IlsConfig.silent_report_negatives`` restores the literal rule).
- **random regions**: uniform over the 10 labels plus the bilateral pair, the pair's order drawn by
  the seeded RNG; restricted to EL when the report mentions any finding; no region → no negative.
- **placement by the image** (only with a :class:`NegativePlacement`, i.e. ``IlsConfig.negative_check`` set): a
  negative whose target a lung-opacity zone reader speaks to (:data:`~cxrground.ils.zone_map.OPACITY_TARGETS`: the
  lung lesions and the tentative "opacity"; not effusion, not cardiomegaly) never names a Brixia zone the reader
  flags. The region is drawn as without flags; when it names a flagged zone it is drawn again, uniformly among the
  allowed labels (those naming no flagged zone), from a second RNG of the study (so the result is uniform over the
  allowed labels and every other negative is the one a build without flags composes). A global negative of such a
  target ("There is no opacity.", both lungs) becomes a basic negative over an allowed label while any zone is
  flagged. A negative is left out only when no allowed label remains. Both outcomes are counted per reason
  (:attr:`ComposedStudy.placed`, :attr:`ComposedStudy.dropped`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cxrground.ils.config import IlsConfig
from cxrground.ils.zone_map import OPACITY_TARGETS, dropped_by_reader, names_flagged_zone, placed_by_reader
from cxrground.reports.findings import Finding
from cxrground.vocab import ils_templates as tpl
from cxrground.vocab.lesions import LESIONS, LUNG_LESIONS
from cxrground.vocab.locations import BOTH_LUNGS, HEART, ILS_LOCATION_LABELS, SIDES, lung_label
from cxrground.vocab.traits import traits

__all__ = [
    "KIND_GROUNDED",
    "KIND_NEGATED",
    "KIND_NOT_REPORTED",
    "KIND_NO_LOCATION_EXTENSION",
    "WITHHELD_HEART_DESCRIBED",
    "WITHHELD_HEART_IMPLAUSIBLE",
    "WITHHELD_SILENT_REPORT",
    "ComposedStudy",
    "GroundedFinding",
    "MaskOut",
    "NegativePlacement",
    "compose_pairs",
    "study_rng",
]

KIND_GROUNDED = "grounded_major_lesion"
KIND_NEGATED = "negative_reported_major_lesion"
KIND_NOT_REPORTED = "not_reported_major_lesion"
KIND_NO_LOCATION_EXTENSION = "grounding_no_location_extension"
#: Reason (card) of a pair left out because the study already asks its question (the same instruction and answer,
#: or the same lesion-inference instruction with another answer), with the pairs of a dropped twin.
DROPPED_DUPLICATE = "duplicate (instruction, answer) in the study"
#: Card reason of the lung and pleural negatives a report that does not read the film would have given
#: (:attr:`IlsConfig.silent_report_negatives`).
WITHHELD_SILENT_REPORT = "negative withheld: the report says nothing about the film"
#: Card reason of a cardiomegaly negative left out because the report describes the heart without calling it
#: enlarged or normal ("the cardiac silhouette is prominent": a non-target finding at the heart).
WITHHELD_HEART_DESCRIBED = "negative withheld: the report calls the heart prominent"
#: Card reason of a cardiomegaly negative left out because the heart estimate is implausible (CTR below 0.30: lungs
#: that hide the heart), when the report does not state cardiomegaly.
WITHHELD_HEART_IMPLAUSIBLE = "cardiomegaly negative withheld: heart estimate implausible"
BILATERAL = ("right lung", "left lung")


@dataclass(frozen=True, eq=False)
class GroundedFinding:
    """A positive lesion finding after Algorithm 1 and location verification."""

    finding: Finding
    mask: np.ndarray | None
    """Lesion mask at the image's native size; None or empty when nothing was grounded."""
    grounded_location: tuple[str, ...] = ()
    """GL (ordered as RL; refined zone labels follow their whole-lung label)."""
    complete: bool = False
    """True when every reported label was grounded (GL covers RL): enables the global positive."""

    @property
    def grounded(self) -> bool:
        """A mask with foreground and a non-empty GL."""
        return self.mask is not None and bool(self.mask.any()) and bool(self.grounded_location)


@dataclass(frozen=True, eq=False)
class MaskOut:
    """A mask to write: ``lesion_mask/{path}``."""

    path: str
    lesion: str
    mask: np.ndarray


@dataclass
class ComposedStudy:
    """The study's pairs and masks, plus per-finding bookkeeping for the dataset card."""

    positive_pairs: list[dict[str, Any]] = field(default_factory=list)
    negative_pairs: list[dict[str, Any]] = field(default_factory=list)
    masks: list[MaskOut] = field(default_factory=list)
    reported: list[tuple[str, bool]] = field(default_factory=list)
    """(lesion, received a mask) for every reported positive lesion finding (card recall)."""
    dropped: Counter[str] = field(default_factory=Counter)
    """Pairs left out by the checks, by reason (e.g. an exact duplicate (instruction, answer) in the study)."""
    placed: Counter[str] = field(default_factory=Counter)
    """Negatives placed away from the zones an image reader flags, by reason (:class:`NegativePlacement`)."""


@dataclass(frozen=True)
class NegativePlacement:
    """The Brixia zones (A–F) an image zone reader flags in the study's film, known before the pairs are composed:
    negatives about a lung opacity are placed where none is flagged (module docstring)."""

    zone_flags: Mapping[str, bool]
    """Brixia zone letter → flagged."""
    reader: str
    """Name of the zone reader (the card's reasons)."""

    @property
    def active(self) -> bool:
        """Some zone is flagged."""
        return any(self.zone_flags.values())

    def allows(self, labels: Sequence[str]) -> bool:
        """The location labels ``labels`` name no flagged zone."""
        return not names_flagged_zone(labels, self.zone_flags)


def study_rng(seed: int, study_key: str) -> np.random.Generator:
    """The study's own RNG: independent of processing order, engine and the other studies."""
    digest = int(hashlib.sha256(study_key.encode()).hexdigest()[:16], 16)
    return np.random.default_rng([seed, digest])


def compose_pairs(
    study_key: str,
    findings: Sequence[Finding],
    grounded: Sequence[GroundedFinding],
    empty_locations: Sequence[str],
    ctr: float | None,
    heart: np.ndarray | None,
    config: IlsConfig,
    placement: NegativePlacement | None = None,
    reads_film: bool = True,
) -> ComposedStudy:
    """All pairs of one study (positives in finding order, then ≤ 1 negative per lesion in LESIONS order); with
    ``placement``, lung-opacity negatives avoid the zones it flags (module docstring). ``reads_film`` False (the
    report says nothing about the film, :func:`cxrground.reports.reading.reads_the_film`): no lung or pleural
    negative unless :attr:`IlsConfig.silent_report_negatives`."""
    rng = study_rng(config.seed, study_key)
    out = ComposedStudy()
    positives_by_lesion: dict[str, int] = {}
    for g in grounded:
        if g.finding.lesion is not None:
            positives_by_lesion[g.finding.lesion] = positives_by_lesion.get(g.finding.lesion, 0) + 1

    for g in grounded:
        f = g.finding
        lesion = f.lesion
        if lesion is None or f.assertion == "absent":
            continue
        if traits(lesion).heart_mask:
            _heart_positive(study_key, lesion, g, heart, config, out)
            continue
        out.reported.append((lesion, g.grounded))
        if not g.grounded:
            continue
        mask_path = _add_mask(study_key, lesion, g.mask, out)
        word = tpl.TENTATIVE_WORD if f.certainty == "tentative" else lesion
        gl = list(g.grounded_location)
        common = {"target": lesion, "reported_location": list(f.reported_location), "grounded_location": gl,
                  "location": gl, "sent_idx": str(f.sent_idx), "seg": True, "seg_mask_path": mask_path,
                  "certainty": f.certainty, "kind": KIND_GROUNDED}
        _positive(out, study_key, tpl.instruction("basic", word, gl), tpl.positive_answer("basic", lesion),
                  "basic", common)
        if g.complete and positives_by_lesion[lesion] == 1:
            _positive(out, study_key, tpl.instruction("global", word),
                      tpl.positive_answer("global", lesion, gl), "global", common)
        if traits(lesion).lesion_inference:
            _positive(out, study_key, tpl.instruction("lesion_inference", tpl.TENTATIVE_WORD, gl),
                      tpl.positive_answer("lesion_inference", lesion, gl, f.certainty or "definitive"),
                      "lesion_inference", common)

    placer = _Placer(placement, study_rng(config.seed, f"{study_key}#negative-placement"), out) \
        if placement is not None and placement.active else None
    _negatives(study_key, findings, empty_locations, ctr, config, rng, out, placer,
               lung_negatives=reads_film or config.silent_report_negatives)
    _drop_duplicates(study_key, out)
    return out


def _drop_duplicates(study_key: str, out: ComposedStudy) -> None:
    """One answer per question in the study (a tentative pneumonia and a tentative atelectasis of one place both ask
    the basic question of "opacity" there; a definitive and a tentative pneumonia of one place both ask its
    lesion-inference question): one question, one answer, one region.

    - Two positives with one lesion-inference instruction: the one with the definitive answer is kept (present
      beats uncertain), else the first.
    - Two positives with one exact (instruction, answer): the kept twin is the first one whose target has
      lesion-inference pairs (pneumonia, atelectasis, edema), else the first.
    - The dropped twin's mask joins the kept one's mask, which the kept twin's other pairs share (their
      instructions name the same region), and the dropped twin takes **all** its pairs with it (basic, global,
      lesion-inference): no global positive is left without its basic positive (ILS §11.1), and every split keeps
      ILS §4's count identity #lesion-inference positives = #basic positives of pneumonia, atelectasis and edema.
    - Negatives: one of each exact (instruction, answer).
    - Pair ids are numbered again, unused masks dropped and mask indices renumbered (:func:`renumber`).
    """
    masks = {m.path: m for m in out.masks}
    gone: set[str] = set()  # mask paths of dropped twins: every pair of theirs goes

    def merge(keep: dict[str, Any], drop: dict[str, Any]) -> None:
        a, b = keep["seg_mask_path"], drop["seg_mask_path"]
        if a != b:
            masks[a] = MaskOut(a, masks[a].lesion, masks[a].mask | masks[b].mask)
            gone.add(b)

    questions: dict[str, dict[str, Any]] = {}
    for pair in out.positive_pairs:
        if pair["type"] != "lesion_inference":
            continue
        first = questions.setdefault(pair["instruction"], pair)
        if first is not pair:
            keep, drop = (pair, first) if _definitive(pair) and not _definitive(first) else (first, pair)
            questions[pair["instruction"]] = keep
            merge(keep, drop)
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    for pair in out.positive_pairs:
        if pair["type"] == "lesion_inference" or pair["seg_mask_path"] in gone:
            continue
        key = (pair["instruction"], pair["answer"])
        first = kept.setdefault(key, pair)
        if first is not pair:
            keep, drop = (pair, first) if _has_inference(pair) and not _has_inference(first) else (first, pair)
            kept[key] = keep
            merge(keep, drop)
    positives: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for pair in out.positive_pairs:
        key = (pair["instruction"], pair["answer"])
        if pair["seg_mask_path"] in gone or key in seen:
            out.dropped[DROPPED_DUPLICATE] += 1
            continue
        seen.add(key)
        positives.append(pair)
    out.positive_pairs = positives
    negatives: dict[tuple[str, str], dict[str, Any]] = {}
    for pair in out.negative_pairs:
        if negatives.setdefault((pair["instruction"], pair["answer"]), pair) is not pair:
            out.dropped[DROPPED_DUPLICATE] += 1
    out.negative_pairs = list(negatives.values())
    out.masks = list(masks.values())
    renumber(study_key, out)


def _definitive(pair: Mapping[str, Any]) -> bool:
    """The pair's finding is definitive (its lesion-inference answer says "highly suggestive")."""
    return pair.get("certainty", "definitive") != "tentative"


def _has_inference(pair: Mapping[str, Any]) -> bool:
    """The pair's target lesion has lesion-inference pairs (ILS §4 rule 4)."""
    return pair["target"] in LESIONS and traits(pair["target"]).lesion_inference


def renumber(study_key: str, out: ComposedStudy) -> None:
    """Pair ids numbered again from 0 in list order; the masks no positive pair uses dropped and the rest
    numbered again (ILS §12.1: ``k`` runs over the study's masks) after pairs were left out."""
    for name in ("positive_pairs", "negative_pairs"):
        setattr(out, name, [{**p, "pair_id": f"{study_key}_{name.split('_')[0]}_{i}"}
                            for i, p in enumerate(getattr(out, name))])
    used = {p["seg_mask_path"] for p in out.positive_pairs}
    kept = [m for m in out.masks if m.path in used]
    moved = {m.path: _mask_path(study_key, m.lesion, k) for k, m in enumerate(kept)}
    out.masks = [MaskOut(moved[m.path], m.lesion, m.mask) for m in kept]
    out.positive_pairs = [{**p, "seg_mask_path": moved[p["seg_mask_path"]]} for p in out.positive_pairs]


def _heart_positive(study_key: str, lesion: str, g: GroundedFinding, heart: np.ndarray | None, config: IlsConfig,
                    out: ComposedStudy) -> None:
    """The one global positive of a lesion whose mask is the heart (cardiomegaly)."""
    f = g.finding
    if f.certainty == "tentative" and not config.tentative_cardiomegaly_pairs:
        return
    has_mask = heart is not None and bool(heart.any())
    out.reported.append((lesion, has_mask))
    if not has_mask or any(p["target"] == lesion for p in out.positive_pairs):
        return
    mask_path = _add_mask(study_key, lesion, heart, out)
    _positive(out, study_key, tpl.instruction("global", lesion), tpl.positive_answer("global", lesion),
              "global", {"target": lesion, "reported_location": [HEART], "grounded_location": [HEART],
                         "location": [HEART], "sent_idx": str(f.sent_idx), "seg": True, "seg_mask_path": mask_path,
                         "certainty": f.certainty, "kind": KIND_GROUNDED})


@dataclass
class _Placer:
    """Moves lung-opacity negatives off flagged zones, with its own RNG so the study's main draws do not change."""

    placement: NegativePlacement
    rng: np.random.Generator
    out: ComposedStudy

    def region(self, region: list[str], labels: Sequence[str]) -> list[str] | None:
        """``region`` when it names no flagged zone, else a region drawn among the allowed ``labels`` (None, and
        counted as dropped, when there is none)."""
        if self.placement.allows(region):
            return region
        return self.fresh(labels)

    def fresh(self, labels: Sequence[str]) -> list[str] | None:
        """A region drawn among the ``labels`` that name no flagged zone, counted as placed; None (counted as
        dropped) when none is left."""
        allowed = [lab for lab in labels if self.placement.allows([lab])]
        region = _draw_region(self.rng, allowed)
        if region is None:
            self.out.dropped[dropped_by_reader(self.placement.reader)] += 1
        else:
            self.out.placed[placed_by_reader(self.placement.reader)] += 1
        return region


def _negatives(study_key: str, findings: Sequence[Finding], empty_locations: Sequence[str], ctr: float | None,
               config: IlsConfig, rng: np.random.Generator, out: ComposedStudy, placer: _Placer | None = None,
               lung_negatives: bool = True) -> None:
    reported = {f.lesion for f in findings if f.lesion is not None and f.assertion != "absent"}
    negated = {f.lesion for f in findings if f.lesion is not None and f.assertion == "absent"} - reported
    sided_negation = {f.lesion for f in findings
                      if f.assertion == "absent" and f.lesion and _has_side(f.reported_location)}
    any_finding = any(f.assertion != "absent" for f in findings)
    heart_described = not config.prominent_heart_negative and any(
        f.lesion is None and HEART in f.reported_location and f.assertion != "absent" for f in findings)
    any_lung_lesion = bool(reported & set(LUNG_LESIONS))
    el = [lab for lab in ILS_LOCATION_LABELS if lab in set(empty_locations)]
    space = el if any_finding else list(ILS_LOCATION_LABELS)

    for lesion in LESIONS:
        t = traits(lesion)
        if t.heart_mask:
            ctr_ok = not t.ctr_rule or (ctr is not None and ctr <= config.ctr_negative_max)
            if lesion not in reported and ctr_ok:
                if heart_described:
                    out.dropped[WITHHELD_HEART_DESCRIBED] += 1
                else:
                    kind = KIND_NEGATED if lesion in negated else KIND_NOT_REPORTED
                    _negative(out, study_key, "global", lesion, [HEART], kind)
            continue
        if not lung_negatives:
            out.dropped[WITHHELD_SILENT_REPORT] += 1
            continue
        checker = placer if lesion in OPACITY_TARGETS else None
        blocked = lesion in reported or (t.umbrella and any_lung_lesion)
        u = float(rng.random())
        li_share = config.opacity_lesion_inference_share if t.li_negative_target else 0.0
        if blocked:
            region = _draw_region(rng, el)
            if region is not None and checker is not None:
                region = checker.region(region, el)
            if region is None:
                continue
            kind = "lesion_inference" if u < li_share else "basic"
            _negative(out, study_key, kind, lesion, region, KIND_NO_LOCATION_EXTENSION)
            continue
        kind_name = KIND_NEGATED if lesion in negated else KIND_NOT_REPORTED
        global_share = config.negative_global_share.get(lesion, 0.0) if lesion not in sided_negation else 0.0
        if u < global_share:
            if checker is None and _global_allowed(config, any_finding, el, space):
                _negative(out, study_key, "global", lesion, [BOTH_LUNGS], kind_name)
                continue
            region = checker.fresh(space) if checker is not None else _draw_region(rng, space)
            if region is not None:
                _negative(out, study_key, "basic", lesion, region, kind_name)
            continue
        region = _draw_region(rng, space)
        if region is not None and checker is not None:
            region = checker.region(region, space)
        if region is None:
            continue
        kind = "lesion_inference" if u < global_share + li_share else "basic"
        _negative(out, study_key, kind, lesion, region, kind_name)


def _global_allowed(config: IlsConfig, any_finding: bool, el: Sequence[str], space: Sequence[str]) -> bool:
    """Whether a global lung negative may be drawn: where a basic one could be (``space``, the region labels, is
    not empty; :attr:`IlsConfig.global_negative_needs_region`), and under the ``lung`` exclusion only when the
    report mentions no finding or both lungs are empty."""
    if config.global_negative_needs_region and not space:
        return False
    return config.negative_exclusion != "lung" or not any_finding or all(lung_label(s) in el for s in SIDES)


def _draw_region(rng: np.random.Generator, labels: Sequence[str]) -> list[str] | None:
    """Uniform over the allowed labels plus the bilateral pair when both lungs are allowed."""
    choices: list[list[str]] = [[lab] for lab in labels]
    if all(side in labels for side in BILATERAL):
        choices.append(list(BILATERAL))
    if not choices:
        return None
    region = choices[int(rng.integers(len(choices)))]
    if len(region) == 2 and rng.random() < 0.5:
        region = region[::-1]
    return region


def _has_side(labels: Sequence[str]) -> bool:
    sides = {lab.split(" ", 1)[0] for lab in labels}
    return bool(labels) and not {"right", "left"} <= sides


def _mask_path(study_key: str, lesion: str, k: int) -> str:
    """``lesion_mask/``-relative path of the study's ``k``-th mask (ILS §12.1)."""
    return f"{study_key}/{study_key}_{lesion}_{k}.png"


def _add_mask(study_key: str, lesion: str, mask: np.ndarray, out: ComposedStudy) -> str:
    path = _mask_path(study_key, lesion, len(out.masks))
    out.masks.append(MaskOut(path, lesion, mask))
    return path


def _positive(out: ComposedStudy, study_key: str, instruction: str, answer: str, kind: str,
              common: dict[str, Any]) -> None:
    out.positive_pairs.append({"pair_id": f"{study_key}_positive_{len(out.positive_pairs)}",
                               "instruction": instruction, "answer": answer, "type": kind, **common})


def _negative(out: ComposedStudy, study_key: str, kind: str, lesion: str, location: list[str],
              category: str) -> None:
    if kind == "global":
        instruction, answer = tpl.instruction("global", lesion), tpl.negative_answer("global", lesion)
        target = lesion
    elif kind == "lesion_inference":
        instruction = tpl.instruction("lesion_inference", tpl.TENTATIVE_WORD, location)
        answer = tpl.negative_answer("lesion_inference", tpl.TENTATIVE_WORD, location)
        target = tpl.TENTATIVE_WORD
    else:
        instruction, answer = tpl.instruction("basic", lesion, location), tpl.negative_answer("basic", lesion, location)
        target = lesion
    out.negative_pairs.append({"pair_id": f"{study_key}_negative_{len(out.negative_pairs)}",
                               "instruction": instruction, "answer": answer, "type": kind, "target": target,
                               "location": list(location), "seg": False, "seg_mask_path": None,
                               "kind": category})
