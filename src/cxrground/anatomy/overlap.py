"""CheXpercept overlap records and the deterministic Stage-4 attribute answers (CHEXPERCEPT.md §5.6, §4).

A record per optimal component holds, per lung, ``ratio = |m ∧ lung| / |lung|`` (positive at ``≥ 0.01``,
with ``size = |m ∧ lung|`` when positive, else 0), and for the six zones and the 20 sub-regions the covered
fraction ``|m ∧ region| / |region|`` (positive at ``≥ 0.2``, with best-region promotion). Cardiomegaly
records omit the sub-regions. An empty region has ratio 0. Promotion ties go to the first entry in canonical
order. The JSON form names each ratio ``overlap_ratio``, as the reference does. The random draws of the benchmark
builder (location options, severity side) are not made here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from cxrground.anatomy.percept_regions import (
    PERCEPT_ZONE_NAMES,
    SUBREGION_NAMES,
    SUBREGION_ZONE,
    PerceptGeometry,
)
from cxrground.io.masks import as_mask, check_shape
from cxrground.vocab.locations import SIDES, lung_label

__all__ = [
    "COMPARISON_LEFT_LARGER",
    "COMPARISON_ONE_SIDE",
    "COMPARISON_RIGHT_LARGER",
    "COMPARISON_SIMILAR",
    "LUNG_OVERLAP_MIN",
    "REGION_OVERLAP_MIN",
    "SEVERITY_LOW_MAX",
    "SEVERITY_MID_MAX",
    "SIZE_RATIO_LARGER",
    "ComponentOverlap",
    "LungOverlap",
    "RegionOverlap",
    "comparison_answer_index",
    "comparison_index",
    "component_overlap",
    "distribution_answer_index",
    "distribution_count",
    "negative_subregions",
    "positive_subregions",
    "positive_zones",
    "severity_answer_index",
    "severity_index",
    "severity_ratio",
    "side_sizes",
    "sides_with_overlap",
]

#: A lung overlaps when ``|m ∧ lung| / |lung| ≥`` this.
LUNG_OVERLAP_MIN: Final[float] = 0.01
#: A zone or sub-region overlaps when ``|m ∧ region| / |region| ≥`` this (before promotion).
REGION_OVERLAP_MIN: Final[float] = 0.2
#: Severity answer 1 when the side ratio is below this, …
SEVERITY_LOW_MAX: Final[float] = 1.0 / 3.0
#: … answer 2 when below this, else 3.
SEVERITY_MID_MAX: Final[float] = 2.0 / 3.0
#: Comparison: a lesion is larger when it is at least this many times the other.
SIZE_RATIO_LARGER: Final[float] = 1.5

#: The key of a ratio in the JSON form of a record (the reference's name).
_RATIO_KEY: Final[str] = "overlap_ratio"

#: Comparison answer indices (§3.5 option order).
COMPARISON_SIMILAR: Final[int] = 1
COMPARISON_LEFT_LARGER: Final[int] = 2
COMPARISON_RIGHT_LARGER: Final[int] = 3
COMPARISON_ONE_SIDE: Final[int] = 4


def _stored_ratio(entry: Mapping[str, Any]) -> float:
    """The ratio of one JSON entry (``overlap_ratio``, or ``ratio`` in records written before)."""
    return float(entry[_RATIO_KEY] if _RATIO_KEY in entry else entry["ratio"])


@dataclass(frozen=True)
class RegionOverlap:
    """Covered fraction of one zone or sub-region and whether it counts as overlapping."""

    ratio: float
    has_overlap: bool

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"overlap_ratio": float, "has_overlap": bool}``."""
        return {_RATIO_KEY: self.ratio, "has_overlap": self.has_overlap}


@dataclass(frozen=True)
class LungOverlap:
    """Fraction of one lung covered by the component, the overlap flag and ``size`` (0 unless overlapping)."""

    ratio: float
    has_overlap: bool
    size: int

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"overlap_ratio": float, "has_overlap": bool, "size": int}``."""
        return {_RATIO_KEY: self.ratio, "has_overlap": self.has_overlap, "size": self.size}


@dataclass(frozen=True)
class ComponentOverlap:
    """The §5.6 overlap record of one optimal component; ``lung_regions`` is None for cardiomegaly."""

    lungs: Mapping[str, LungOverlap]
    zones: Mapping[str, RegionOverlap]
    lung_regions: Mapping[str, RegionOverlap] | None

    def lung(self, side: str) -> LungOverlap:
        """Return the record of the ``side`` lung."""
        return self.lungs[lung_label(side)]

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form ``{"right lung": {...}, "left lung": {...}, "zones": {...}}`` plus
        ``"lung_regions": {...}`` unless it is a cardiomegaly record."""
        out: dict[str, Any] = {name: rec.to_dict() for name, rec in self.lungs.items()}
        out["zones"] = {name: rec.to_dict() for name, rec in self.zones.items()}
        if self.lung_regions is not None:
            out["lung_regions"] = {name: rec.to_dict() for name, rec in self.lung_regions.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ComponentOverlap:
        """Return the record stored by :meth:`to_dict` (or with the ratios under ``ratio``, as plan units cached
        by older builds store them)."""
        lungs = {
            lung_label(side): LungOverlap(
                ratio=_stored_ratio(data[lung_label(side)]),
                has_overlap=bool(data[lung_label(side)]["has_overlap"]),
                size=int(data[lung_label(side)]["size"]),
            )
            for side in SIDES
        }

        def group(raw: Mapping[str, Any]) -> dict[str, RegionOverlap]:
            return {k: RegionOverlap(_stored_ratio(v), bool(v["has_overlap"])) for k, v in raw.items()}

        regions = data.get("lung_regions")
        return cls(
            lungs=lungs, zones=group(data["zones"]), lung_regions=None if regions is None else group(regions)
        )


# --- records ---------------------------------------------------------------------------------------

def _ratio(inter: int, total: int) -> float:
    return inter / total if total > 0 else 0.0


def _region_group(
    component: np.ndarray, regions: Mapping[str, np.ndarray], names: Sequence[str]
) -> dict[str, RegionOverlap]:
    ratios = [_ratio(int((component & regions[n]).sum()), int(regions[n].sum())) for n in names]
    flags = [r >= REGION_OVERLAP_MIN for r in ratios]
    if not any(flags):
        best = int(np.argmax(ratios)) if ratios else 0  # first maximum in canonical order
        if ratios and ratios[best] > 0:
            flags[best] = True
    return {n: RegionOverlap(r, f) for n, r, f in zip(names, ratios, flags, strict=True)}


def component_overlap(
    component: np.ndarray, geometry: PerceptGeometry, *, cardiomegaly: bool = False
) -> ComponentOverlap:
    """Return the §5.6 overlap record of one optimal component mask against ``geometry``."""
    m = check_shape(as_mask(component, "component mask"), geometry.shape, "component mask")
    lungs: dict[str, LungOverlap] = {}
    for side in SIDES:
        lung = geometry.lung(side)
        inter = int((m & lung).sum())
        ratio = _ratio(inter, int(lung.sum()))
        hit = ratio >= LUNG_OVERLAP_MIN
        lungs[lung_label(side)] = LungOverlap(ratio, hit, inter if hit else 0)
    zones = _region_group(m, geometry.zones, PERCEPT_ZONE_NAMES)
    regions = None if cardiomegaly else _region_group(m, geometry.subregions, SUBREGION_NAMES)
    return ComponentOverlap(lungs=lungs, zones=zones, lung_regions=regions)


# --- attribute answers -----------------------------------------------------------------------------

def positive_subregions(records: Iterable[ComponentOverlap]) -> list[str]:
    """Return the sub-regions with ``has_overlap`` in any record, in :data:`SUBREGION_NAMES` order."""
    hit: set[str] = set()
    for rec in records:
        if rec.lung_regions is not None:
            hit.update(name for name, r in rec.lung_regions.items() if r.has_overlap)
    return [name for name in SUBREGION_NAMES if name in hit]


def negative_subregions(records: Iterable[ComponentOverlap]) -> list[str]:
    """Return the sub-regions that are not positive in any record, in :data:`SUBREGION_NAMES` order."""
    positive = set(positive_subregions(records))
    return [name for name in SUBREGION_NAMES if name not in positive]


def positive_zones(records: Iterable[ComponentOverlap]) -> list[str]:
    """Return the zones of the positive sub-regions (§5.5 mapping), in :data:`PERCEPT_ZONE_NAMES` order."""
    zones = {SUBREGION_ZONE[name] for name in positive_subregions(records)}
    return [z for z in PERCEPT_ZONE_NAMES if z in zones]


def distribution_count(records: Iterable[ComponentOverlap]) -> int:
    """Return ``n``, the number of distinct positive zones."""
    return len(positive_zones(records))


def distribution_answer_index(n: int) -> int:
    """Return the distribution option: ``n`` for ``n ∈ {1, 2, 3}``, else 4 (0 or ≥ 4 zones)."""
    return n if n in (1, 2, 3) else 4


def sides_with_overlap(records: Iterable[ComponentOverlap]) -> list[str]:
    """Return the sides (``right``, ``left`` order) on which some record's lung has ``has_overlap``."""
    recs = list(records)
    return [side for side in SIDES if any(r.lung(side).has_overlap for r in recs)]


def severity_ratio(records: Iterable[ComponentOverlap], side: str) -> float:
    """Return Σ of the ``side`` lung ratios over the records with ``has_overlap`` on that side."""
    label = lung_label(side)
    return float(sum(r.lungs[label].ratio for r in records if r.lungs[label].has_overlap))


def severity_index(ratio: float) -> int:
    """Return the severity option for a ratio: ``< 1/3`` → 1, ``< 2/3`` → 2, else 3."""
    if ratio < SEVERITY_LOW_MAX:
        return 1
    if ratio < SEVERITY_MID_MAX:
        return 2
    return 3


def severity_answer_index(records: Iterable[ComponentOverlap], side: str) -> int:
    """Return the severity option of ``side`` over the records."""
    return severity_index(severity_ratio(records, side))


def side_sizes(records: Iterable[ComponentOverlap]) -> dict[str, int]:
    """Return Σ ``size`` per lung label (``right lung``, ``left lung``) over the records."""
    recs = list(records)
    return {lung_label(side): sum(r.lung(side).size for r in recs) for side in SIDES}


def comparison_index(left_size: float, right_size: float) -> int:
    """Return the comparison option from side sizes (a size ≤ 0 means the lesion is absent on that side).

    One side or none → 4; both: ``max/min < 1.5`` → 1, ``left ≥ 1.5·right`` → 2, ``right ≥ 1.5·left`` → 3.
    """
    if left_size <= 0 or right_size <= 0:
        return COMPARISON_ONE_SIDE
    if left_size >= SIZE_RATIO_LARGER * right_size:
        return COMPARISON_LEFT_LARGER
    if right_size >= SIZE_RATIO_LARGER * left_size:
        return COMPARISON_RIGHT_LARGER
    return COMPARISON_SIMILAR


def comparison_answer_index(records: Iterable[ComponentOverlap]) -> int:
    """Return the §5.6 comparison option; a side counts only when some record has ``has_overlap`` on it."""
    recs = list(records)
    present = set(sides_with_overlap(recs))
    sizes = side_sizes(recs)
    left = sizes[lung_label("left")] if "left" in present else 0
    right = sizes[lung_label("right")] if "right" in present else 0
    return comparison_index(left, right)
