"""Zone flags for placing negatives, read by Algorithm 1 itself (``IlsConfig.negative_check = "algorithm1"``).

A negative pair ("There is no opacity in the left lung base.") claims that a mask drawn there would be empty. This
module asks the chain's own evidence that question: for each Brixia zone (A–F) it grounds a present ``opacity``
finding reported in that zone's ILS label, with the study's anomaly map, detector boxes, Table 7 thresholds,
refinement and the clip off the heart and mediastinum, exactly as a positive finding is grounded
(:func:`cxrground.ils.grounding.ground_finding`). A zone is flagged when that mask covers at least
:data:`MIN_ZONE_COVER` of the zone's own pixels: Algorithm 1 keeps whole anomaly components, so a component
selected through a box overlapping the zone may lie mostly in a neighbouring one. The flags go to
:class:`cxrground.ils.compose.NegativePlacement`, which places the negatives that a lung-opacity reader speaks to
away from flagged zones. No zone reader and no fitted threshold are involved, so the check reads a film the way
the chain reads it for its positives (pre-registered in ``bench/records/negative_check_algorithm1_preregistration.md``).

A flagged zone counts only where the report does not already explain it (:func:`unexplained`): an opacity in a zone
the report attributes to edema does not contradict "There is no atelectasis.". Basic negatives are drawn from the
report-free labels anyway, so this decides whether a global negative stays global.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import numpy as np

from cxrground.ils.zone_map import BRIXIA_OF, brixia_zones
from cxrground.reports.findings import Finding
from cxrground.vocab.lesions import LUNG_LESIONS

if TYPE_CHECKING:
    from cxrground.ils.grounding import GroundingResult

__all__ = ["MIN_ZONE_COVER", "ZONE_LABELS", "algorithm1_flags", "explained_zones", "unexplained"]

#: The ILS label asked for each Brixia zone: the zone label of :data:`~cxrground.ils.zone_map.BRIXIA_OF` (the apical
#: label, a part of the upper zone, is not asked).
ZONE_LABELS: Final[dict[str, str]] = {zone: label for label, zone in BRIXIA_OF.items() if "apical" not in label}
_PROBE_LESION: Final[str] = "opacity"
#: Reported findings that explain an opacity in the zones they name: the lung lesions and pleural effusion.
_EXPLAINING: Final[frozenset[str]] = frozenset({*LUNG_LESIONS, "effusion"})
#: A zone is flagged when the mask covers at least this share of its pixels (the benchmarks' "grounded zone").
MIN_ZONE_COVER: Final[float] = 0.01


def algorithm1_flags(
    ground: Callable[[Finding], GroundingResult],
    location_masks: dict[str, np.ndarray],
    centre: np.ndarray | None = None,
) -> dict[str, bool]:
    """Brixia zone letter → True when ``ground`` (the study's :func:`~cxrground.ils.grounding.ground_finding` on
    its canvas, anomaly map and boxes) grounds an opacity reported in that zone: its mask minus ``centre`` (the
    heart + mediastinum region the chain clips lung-lesion masks off) covers at least :data:`MIN_ZONE_COVER` of the
    zone's location mask."""
    flags: dict[str, bool] = {}
    for zone, label in ZONE_LABELS.items():
        probe = Finding(entity=_PROBE_LESION, sent_idx=0, assertion="present", lesion=_PROBE_LESION,
                        reported_location=(label,), source="negative-check")
        result = ground(probe)
        mask = result.mask if result.grounded else None
        zone_mask = location_masks.get(label)
        if mask is None or zone_mask is None or not zone_mask.any():
            flags[zone] = False
            continue
        if centre is not None:
            mask = mask & ~centre
        flags[zone] = bool((mask & zone_mask).sum() >= MIN_ZONE_COVER * zone_mask.sum())
    return flags


def explained_zones(findings: Sequence[Finding]) -> set[str]:
    """The Brixia zones that a present or uncertain lung finding of the report names (a lung lesion or an effusion;
    one without a location names every zone)."""
    zones: set[str] = set()
    for f in findings:
        if f.lesion not in _EXPLAINING or f.assertion == "absent":
            continue
        zones |= set(brixia_zones(f.reported_location)) if f.reported_location else set(ZONE_LABELS)
    return zones


def unexplained(flags: dict[str, bool], findings: Sequence[Finding]) -> dict[str, bool]:
    """``flags`` with every zone the report explains (:func:`explained_zones`) cleared."""
    explained = explained_zones(findings)
    return {zone: flag and zone not in explained for zone, flag in flags.items()}
