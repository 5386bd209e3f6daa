"""Pairs checked against the image (with a synthesizer that reads lesions, ``--synthesizer lesion-unet``).

A pair is a claim about the image, so the build checks it against the lesion segmenter's reading before it is
written (rules fixed in ``bench/records/lesion_unet_preregistration.md``):

- **negatives**: a pair saying a lung lesion or effusion is absent from a location is dropped when the segmenter
  finds a lesion there: some zone of the location (a whole-lung label: each of its upper / mid / base zones; "both
  lungs": all six) has at least :data:`~cxrground.lesions.lesion_zones.ZONE_COVER` of its pixels, heart and
  mediastinum removed, at ``p ≥ t``;
- with a zone reader's flags (``--synthesizer-opt zone_reader=zone_sim_v1``), a negative naming a flagged Brixia
  zone is dropped as well;
- ``ils build --negative-check`` is not a check here: the build passes the zone reader's flags to
  :func:`~cxrground.ils.compose.compose_pairs`, which places lung-lesion negatives in unflagged zones;
- **positives**: a pair is dropped when its mask covers less than :data:`MIN_LOCATION_COVER` of a location it
  names (the answer would point where the mask is not);
- **masks**: lung-lesion and effusion masks are clipped off the heart outline and the mediastinum
  (:func:`clip_centre`).

Dropped pairs are counted by reason (``ComposedStudy.dropped``, the card's "Pairs left out by checks" table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from cxrground.ils.compose import ComposedStudy, renumber
from cxrground.ils.zone_map import dropped_by_reader, names_flagged_zone, zones_of
from cxrground.io.transform import Letterbox
from cxrground.lesions.lesion_zones import ZONE_COVER, location_share
from cxrground.vocab.ils_templates import TENTATIVE_WORD
from cxrground.vocab.lesions import LUNG_LESIONS

__all__ = ["DROPPED_NEGATIVE", "DROPPED_POSITIVE", "MIN_LOCATION_COVER", "check_pairs", "clip_centre",
           "dropped_by_reader", "zones_of"]

#: A positive's mask must cover at least this share of every location its pair names.
MIN_LOCATION_COVER: Final[float] = 0.01
DROPPED_NEGATIVE: Final[str] = "negative contradicted by the image (lesion segmenter)"
DROPPED_POSITIVE: Final[str] = "positive mask misses a named location"
DROPPED_NEGATIVE_ZONES: Final[str] = "negative contradicted by the image (zone reader)"
#: Targets whose negatives the segmenter can check (it reads opacities and fluid, not the heart).
CHECKED_TARGETS: Final[frozenset[str]] = frozenset({*LUNG_LESIONS, "effusion", TENTATIVE_WORD})


def clip_centre(mask: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """``mask`` without the heart + mediastinum pixels (both on the same canvas)."""
    return np.asarray(mask, bool) & ~np.asarray(centre, bool)


def check_pairs(study_key: str, out: ComposedStudy, locations: Mapping[str, np.ndarray], box: Letterbox,
                probability: np.ndarray, threshold: float, centre: np.ndarray,
                zone_flags: Mapping[str, bool] | None = None) -> None:
    """Drop the pairs of ``out`` the image contradicts (rules in the module docstring), counting them in
    ``out.dropped``; ``locations``, ``probability`` and ``centre`` are on the canvas of ``box``. ``zone_flags``
    (Brixia A–F, from a zone reader) also contradict a negative that names a flagged zone."""
    canvas_masks = {m.path: box.mask_to_canvas(m.mask) for m in out.masks}
    keep_pos = []
    for pair in out.positive_pairs:
        labels: Sequence[str] = pair.get("grounded_location") or []
        mask = canvas_masks.get(pair.get("seg_mask_path") or "")
        if mask is not None and labels and any(_cover(mask, locations.get(lab)) < MIN_LOCATION_COVER
                                               for lab in labels if lab in locations):
            out.dropped[DROPPED_POSITIVE] += 1
            continue
        keep_pos.append(pair)
    keep_neg = []
    for pair in out.negative_pairs:
        if pair["target"] in CHECKED_TARGETS:
            zones = [z for lab in pair.get("location") or [] for z in zones_of(lab) if z in locations]
            if any(location_share(probability, locations[z], threshold, centre) >= ZONE_COVER for z in zones):
                out.dropped[DROPPED_NEGATIVE] += 1
                continue
            if zone_flags and _names_flagged(pair, zone_flags):
                out.dropped[DROPPED_NEGATIVE_ZONES] += 1
                continue
        keep_neg.append(pair)
    out.positive_pairs, out.negative_pairs = keep_pos, keep_neg
    renumber(study_key, out)


def _names_flagged(pair: Mapping[str, object], zone_flags: Mapping[str, bool]) -> bool:
    """A negative about a :data:`CHECKED_TARGETS` target whose locations name a zone flagged in ``zone_flags``
    (Brixia A–F)."""
    labels: Sequence[str] = pair.get("location") or []  # type: ignore[assignment]
    return pair["target"] in CHECKED_TARGETS and names_flagged_zone(labels, zone_flags)


def _cover(mask: np.ndarray, location: np.ndarray | None) -> float:
    if location is None or not location.any():
        return 1.0
    return float((mask & location).sum()) / float(location.sum())
