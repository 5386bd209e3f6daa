"""Lung-lesion masks guided by a zone reader (``ils build --zone-guide zone_prior_v1|zone_prior_v2``).

Algorithm 1 draws a mask for a reported lesion where the anomaly map and a detector box agree with the reported
location. On real films its masks agree with radiologists' zone scores only weakly, while a zone reader
(:mod:`cxrground.lesions.zone_prior`) agrees better at zone level. With a zone guide, the report still decides
*what* is grounded and *where it may be*, the reader decides *which of those zones* hold it, and the pixels decide
the shape:

1. a finding's zones are the Brixia zones (A–F) its reported location names (all six without a location); its
   *guided* zones are those the reader flags, and, when the reader flags some but none of the zones the report
   names in particular beside whole lungs ("bilateral, greater in the upper lobes"), those named zones too;
2. no guided zone: the finding gets no mask, so no positive pair (recorded as ``zone_guide_unflagged``);
3. otherwise Algorithm 1's mask is cut to the guided zones, and a guided zone it covers less than
   :data:`MIN_ZONE_COVER` of is filled by :func:`fill_zone` from the lesion segmenter's probability map, for
   lesions whose trait ``zone_fill`` allows it (airspace disease; atelectasis is only cut).

Masks stay off the heart outline and the mediastinum as in every build. Rules fixed in
``bench/records/zone_guide_preregistration.md``, ``bench/records/zone_guide_fill_preregistration.md`` and
``bench/records/zone_guide_named_zones_preregistration.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
from scipy import ndimage

from cxrground.ils.negative_flags import MIN_ZONE_COVER, ZONE_LABELS
from cxrground.ils.zone_map import brixia_zones
from cxrground.reports.findings import Finding
from cxrground.vocab.lesions import LUNG_LESIONS
from cxrground.vocab.locations import BOTH_LUNGS

__all__ = ["FILL_MIN_COMPONENT", "FILL_SIGMA", "MIN_ZONE_COVER", "NOTHING_LEFT", "UNFLAGGED", "WHOLE_LUNG_LABELS",
           "ZoneGuide", "fill_zone", "finding_zones", "guide_mask", "guide_outcome", "guided", "guided_zones",
           "named_zones", "smooth_probability"]

# A guided zone counts as covered by Algorithm 1's mask at MIN_ZONE_COVER of its pixels (the share at which the
# negative checks and the benchmarks call a zone grounded); below it, it is filled.

#: Gaussian σ of the probability smoothing before a fill, as a share of the canvas side.
FILL_SIGMA: Final[float] = 0.02
#: A fill keeps only connected parts of at least this share of the zone's pixels.
FILL_MIN_COMPONENT: Final[float] = 0.005
#: Grounding record reason of a finding whose named zones the reader flags none of.
UNFLAGGED: Final[str] = "zone_guide_unflagged"
#: Grounding record reason of a finding whose guided mask came out empty (flagged zones with no pixel left).
NOTHING_LEFT: Final[str] = "zone_guide_empty"


def guided(finding: Finding) -> bool:
    """True for findings a zone guide shapes: present or uncertain lung lesions."""
    return finding.lesion in LUNG_LESIONS and finding.assertion != "absent"


def finding_zones(finding: Finding) -> list[str]:
    """The Brixia zones a finding's reported location names (all six when it has none)."""
    return brixia_zones(finding.reported_location) if finding.reported_location else list(ZONE_LABELS)


#: Location labels that name a whole lung, or both.
WHOLE_LUNG_LABELS: Final[frozenset[str]] = frozenset({"right lung", "left lung", BOTH_LUNGS})


def named_zones(finding: Finding) -> list[str]:
    """The zones a finding's report names in particular beside whole lungs ("bilateral opacities, greater in the
    upper lobes": A and D); none when its location names no whole lung, or only whole lungs."""
    labels = list(finding.reported_location or ())
    if not any(label in WHOLE_LUNG_LABELS for label in labels):
        return []
    return brixia_zones(label for label in labels if label not in WHOLE_LUNG_LABELS)


def guided_zones(finding: Finding, flags: Mapping[str, bool]) -> list[str]:
    """The zones of ``finding`` the reader flags (``flags``: zone letter → flag); when it flags some but none of
    the finding's :func:`named_zones`, those are guided too, so a mask is never only in zones the report does not
    name in particular."""
    flagged = [z for z in finding_zones(finding) if flags.get(z, False)]
    named = named_zones(finding)
    if flagged and named and not set(flagged) & set(named):
        return sorted({*flagged, *named})
    return flagged


def smooth_probability(probability: np.ndarray, sigma: float = FILL_SIGMA) -> np.ndarray:
    """``probability`` smoothed with a Gaussian of σ = ``sigma`` × the map's longer side (float32; unchanged for
    ``sigma`` 0)."""
    p = np.asarray(probability, np.float32)
    return ndimage.gaussian_filter(p, sigma * max(p.shape)) if sigma > 0 else p


def fill_zone(zone: np.ndarray, probability: np.ndarray, centre: np.ndarray | None = None,
              sigma: float = FILL_SIGMA, min_component: float = FILL_MIN_COMPONENT) -> np.ndarray:
    """The part of ``zone`` (``centre`` removed) where the smoothed ``probability`` (:func:`smooth_probability`;
    ``sigma`` 0 for a map smoothed already) is at or above the zone's median, without connected parts smaller than
    ``min_component`` of the zone (empty for an empty zone)."""
    region = np.asarray(zone, bool) & (~np.asarray(centre, bool) if centre is not None else True)
    n = int(region.sum())
    if n == 0:
        return np.zeros(region.shape, bool)
    smooth = smooth_probability(probability, sigma)
    fill = region & (smooth >= np.median(smooth[region]))
    labels, count = ndimage.label(fill)
    if count:
        sizes = ndimage.sum_labels(fill, labels, index=np.arange(1, count + 1))
        fill = np.isin(labels, 1 + np.flatnonzero(sizes >= min_component * n))
    return fill


def guide_mask(mask: np.ndarray | None, zones: list[str], locations: Mapping[str, np.ndarray],
               probability: np.ndarray, centre: np.ndarray | None = None,
               sigma: float = FILL_SIGMA, fill: bool = True) -> tuple[np.ndarray, list[str]]:
    """Algorithm 1's ``mask`` (None when it drew none) cut to the guided ``zones``' location masks, each guided zone
    it covers less than :data:`MIN_ZONE_COVER` of filled by :func:`fill_zone` unless ``fill`` is False (all on one
    canvas; ``sigma`` as there); also the zones that were filled."""
    shape = next(iter(locations.values())).shape
    out = np.zeros(shape, bool)
    base = np.asarray(mask, bool) if mask is not None else np.zeros(shape, bool)
    filled: list[str] = []
    for zone in zones:
        region = np.asarray(locations[ZONE_LABELS[zone]], bool)
        if centre is not None:
            region = region & ~np.asarray(centre, bool)
        part = base & region
        if fill and region.any() and part.sum() < MIN_ZONE_COVER * region.sum():
            part = fill_zone(region, probability, sigma=sigma)
            filled.append(zone)
        out |= part
    return out, filled


def guide_outcome(record: Mapping[str, object]) -> str | None:
    """The card's line for one grounding record of a guided finding (None for an unguided one)."""
    guide = record.get("zone_guide")
    if not isinstance(guide, Mapping):
        return None
    if record.get("status") != "grounded":
        if record.get("reason") == UNFLAGGED:
            return "no mask: the reader flags no zone the report names"
        if record.get("reason") == NOTHING_LEFT:
            return "no mask: Algorithm 1's mask lies outside the guided zones"
        return "no mask: Algorithm 1 drew none, and the lesion is not filled"
    if not guide.get("filled"):
        return "Algorithm 1's mask, cut to the guided zones"
    if record.get("algorithm1"):
        return "Algorithm 1's mask, cut to the guided zones and completed by fills"
    return "fills alone (Algorithm 1 drew no mask)"


@dataclass(frozen=True)
class ZoneGuide:
    """One film's zone reading: the reader's flags (A–F) and the lesion probability map on the canvas."""

    reader: str
    flags: Mapping[str, bool]
    probability: np.ndarray

    @functools.cached_property
    def smoothed(self) -> np.ndarray:
        """The probability map smoothed for fills (:func:`smooth_probability`), computed once per film."""
        return smooth_probability(self.probability)

    def guides(self, finding: Finding) -> bool:
        """True for findings the guide shapes (:func:`guided`)."""
        return guided(finding)

    def guided_zones(self, finding: Finding) -> list[str]:
        """The zones of ``finding`` the guide shapes its mask in (:func:`guided_zones`)."""
        return guided_zones(finding, self.flags)
