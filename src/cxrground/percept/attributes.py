"""Stage-4 attribute questions (CHEXPERCEPT.md §3.5, §4, §5.6, §9.4) from the overlap records of a case.

Deterministic answers come from :mod:`cxrground.anatomy.overlap`; this module makes the random draws
(location options, severity side) with the case's generator and formats every question with the vocab
templates. Cardiomegaly has no Stage 4 (``None``).

Choices where the spec is silent:

* Location draw order: ``k = rng.integers(0, min(3, #pos) + 1)``; then ``k`` positives
  (``rng.choice`` without replacement from the positives in :data:`SUBREGION_NAMES` order), ``3 − k`` negatives
  the same way (all when fewer), then positives top up to 3 (they become answers), then ``rng.permutation``.
* ``answer_zones`` hold question texts, as the reference stores them: of the location question, its positive
  options in option order (the §5.6 severity side is read from them); of the distribution question, the
  positive zones in :data:`~cxrground.anatomy.percept_regions.PERCEPT_ZONE_NAMES` order (``left lower zone lung``).
* Coverage of a negative option (§9.4) = Σ over components of its covered fraction (components are disjoint).
  ``strict_negatives`` drops negatives with coverage > :data:`STRICT_NEGATIVE_MAX` (0.05) from the pool.
* Severity with several overlapping sides and no single-side location answer: ``rng.choice`` over the sides
  in ``right, left`` order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from cxrground.anatomy.overlap import (
    ComponentOverlap,
    comparison_answer_index,
    distribution_answer_index,
    negative_subregions,
    positive_subregions,
    positive_zones,
    severity_index,
    severity_ratio,
    side_sizes,
    sides_with_overlap,
)
from cxrground.percept.schema import SEVERITY_KEY
from cxrground.vocab.locations import lung_label, side_of
from cxrground.vocab.percept_templates import (
    COMPARISON,
    COMPARISON_OPTIONS,
    DISTRIBUTION,
    DISTRIBUTION_OPTIONS,
    LOCATION,
    LOCATION_NONE_OPTION,
    SEVERITY,
    format_question,
    severity_options,
    subregion_text,
    zone_text,
)
from cxrground.vocab.traits import traits

__all__ = ["STRICT_NEGATIVE_MAX", "AttributeResult", "attribute_qas", "draw_location", "negative_coverage",
           "severity_side"]

#: §9.4 stricter builder: negative location options must cover at most this fraction.
STRICT_NEGATIVE_MAX: Final[float] = 0.05
#: Number of sub-region options of the location question (option 4 is "None of the above").
LOCATION_REGIONS: Final[int] = 3
_ANSWER_JOIN: Final[str] = ", "


@dataclass(frozen=True)
class AttributeResult:
    """The ``attribute_extraction_qa`` object and the largest coverage of a negative location option used."""

    qa: dict[str, Any]
    max_negative_coverage: float


def negative_coverage(records: Sequence[ComponentOverlap], name: str) -> float:
    """Fraction of sub-region ``name`` covered by the lesion: Σ of the components' ratios."""
    return float(sum(r.lung_regions[name].ratio for r in records if r.lung_regions is not None))


def draw_location(records: Sequence[ComponentOverlap], rng: np.random.Generator,
                  strict_negatives: bool = False) -> tuple[list[str], list[int], float]:
    """Draw the three sub-region options; returns (names, 1-based answer indices, max negative coverage)."""
    pos = positive_subregions(records)
    neg = negative_subregions(records)
    if strict_negatives:
        neg = [n for n in neg if negative_coverage(records, n) <= STRICT_NEGATIVE_MAX]
    k = int(rng.integers(0, min(LOCATION_REGIONS, len(pos)) + 1))
    chosen_pos = [pos[int(i)] for i in sorted(rng.choice(len(pos), size=k, replace=False))] if k else []
    n_neg = min(LOCATION_REGIONS - k, len(neg))
    chosen_neg = [neg[int(i)] for i in sorted(rng.choice(len(neg), size=n_neg, replace=False))] if n_neg else []
    rest = [p for p in pos if p not in chosen_pos]
    short = LOCATION_REGIONS - len(chosen_pos) - len(chosen_neg)
    if short > 0 and rest:
        extra = min(short, len(rest))
        chosen_pos += [rest[int(i)] for i in sorted(rng.choice(len(rest), size=extra, replace=False))]
    names = chosen_pos + chosen_neg
    names = [names[int(i)] for i in rng.permutation(len(names))]
    positives = set(chosen_pos)
    answer = [i for i, n in enumerate(names, start=1) if n in positives] or [LOCATION_REGIONS + 1]
    cover = max((negative_coverage(records, n) for n in chosen_neg), default=0.0)
    return names, answer, cover


def severity_side(records: Sequence[ComponentOverlap], answer_zones: Sequence[str],
                  rng: np.random.Generator) -> str:
    """§5.6 side choice: the single side named by the location answers if it overlaps, else a random
    overlapping side, else ``left``."""
    overlapping = sides_with_overlap(records)
    named = {side_of(z) for z in answer_zones}
    if len(named) == 1:
        (side,) = named
        if side in overlapping:
            return str(side)
    if overlapping:
        return str(overlapping[int(rng.integers(0, len(overlapping)))])
    return "left"


def _choice(stem: str, options: Sequence[str], index: int) -> dict[str, Any]:
    return {"question": format_question(stem, options), "answer_options": list(options),
            "answer": options[index - 1], "answer_index": index}


def attribute_qas(records: Sequence[ComponentOverlap], lesion: str, rng: np.random.Generator,
                  strict_negatives: bool = False) -> AttributeResult | None:
    """The four Stage-4 questions of a lung-lesion case (None for a lesion without Stage 4: cardiomegaly)."""
    if not traits(lesion).percept.attributes:
        return None
    zones = positive_zones(records)
    distribution = _choice(DISTRIBUTION.format(lesion=lesion), DISTRIBUTION_OPTIONS,
                           distribution_answer_index(len(zones)))
    distribution["answer_zones"] = [zone_text(z) for z in zones]

    names, answer, cover = draw_location(records, rng, strict_negatives)
    options = [subregion_text(n) for n in names] + [LOCATION_NONE_OPTION]
    answered = [names[i - 1] for i in answer if i <= len(names)]
    location = {"question": format_question(LOCATION.format(lesion=lesion), options), "answer_options": options,
                "answer": _ANSWER_JOIN.join(options[i - 1] for i in answer), "answer_index": answer,
                "answer_zones": [subregion_text(n) for n in answered]}

    side = severity_side(records, answered, rng)
    lung = lung_label(side)
    ratio = severity_ratio(records, side)
    severity = _choice(SEVERITY.format(lung=lung, lesion=lesion), severity_options(lung), severity_index(ratio))
    severity.update(overlap_ratio=ratio, selected_lung=lung)

    present = sides_with_overlap(records)
    sizes = side_sizes(records)
    comparison = _choice(COMPARISON, COMPARISON_OPTIONS, comparison_answer_index(records))
    comparison.update(left_size=float(sizes[lung_label("left")]), right_size=float(sizes[lung_label("right")]),
                      left_has_overlap="left" in present, right_has_overlap="right" in present)
    qa = {"distribution": distribution, "location": location, SEVERITY_KEY: severity, "comparison": comparison}
    return AttributeResult(qa=qa, max_negative_coverage=cover)
