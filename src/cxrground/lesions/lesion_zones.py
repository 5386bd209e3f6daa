"""Where a lung lesion may be, and the lesion segmenter's reading of the six lung zones.

- :func:`central_mask`: the heart outline and the mediastinum (per row, the gap between the two lungs' medial
  edges, each edge held near its median over the rows), widened by :data:`CENTRAL_MARGIN` of the thorax width.
  Lung masks include the lung behind the heart and beside the aortic knob; a lung-lesion mask must not lie
  there, because the heart and mediastinum read as "brighter than lung" to every lesion reader.
- :func:`lesion_field`: the segmenter's probability map with the centre removed (the pixels a lesion may occupy).
- :func:`zone_scores`: per Brixia zone A–F, the share of its lung pixels outside the centre with ``p ≥ t``;
  :class:`LesionZoneReader` flags a zone when that share is at least :data:`ZONE_COVER` (the lesion simulator's
  own labelling rule, ``min_zone_cover``), the rule fixed in ``bench/records/lesion_unet_preregistration.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from scipy import ndimage

from cxrground.anatomy.ils_locations import lung_zone_bands
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS
from cxrground.lesions.segmenter import LESION_UNET, LesionSegmenter, load_lesion_segmenter

__all__ = ["CENTRAL_MARGIN", "LESION_ZONE_READER", "MEDIAL_SLACK", "ZONE_COVER", "LesionZoneReader", "central_mask",
           "lesion_field", "location_share", "mediastinum_mask", "zone_scores"]

#: Name of the zone reader built on the shipped lesion segmenter (``anatomy zones --zone-model lesion-unet``).
LESION_ZONE_READER: Final[str] = "lesion-unet"
#: A zone is abnormal when at least this share of its lung pixels (centre removed) has ``p ≥ t``.
ZONE_COVER: Final[float] = 0.10
#: How far (fraction of the thorax width) a row's medial lung edge may lie lateral to its median for the mediastinum.
MEDIAL_SLACK: Final[float] = 0.08
#: Widening of the heart + mediastinum region, as a fraction of the thorax (both lungs') width.
CENTRAL_MARGIN: Final[float] = 0.03
_BANDS: Final[tuple[str, str, str]] = ("upper zone lung", "mid zone lung", "lung base")


def mediastinum_mask(right: np.ndarray, left: np.ndarray) -> np.ndarray:
    """Per row where both lungs are present, the columns strictly between the right lung's medial edge (its
    largest column: the patient's right is the image's left) and the left lung's medial edge (smallest column);
    each edge is kept within :data:`MEDIAL_SLACK` of the thorax width of its median over the rows, so a row where
    a lung ends laterally (a costophrenic angle) does not make the gap span the chest."""
    r, lft = as_mask(right, "right lung mask"), as_mask(left, "left lung mask")
    check_same_shape(("right lung mask", r), ("left lung mask", lft))
    out = np.zeros(r.shape, bool)
    cols = np.arange(r.shape[1])
    rows = np.flatnonzero(r.any(axis=1) & lft.any(axis=1))
    if not rows.size:
        return out
    medial_r = np.array([np.flatnonzero(r[y])[-1] for y in rows])
    medial_l = np.array([np.flatnonzero(lft[y])[0] for y in rows])
    lungs = np.flatnonzero((r | lft).any(axis=0))
    slack = MEDIAL_SLACK * (lungs[-1] - lungs[0] + 1)
    lo, hi = np.median(medial_r) - slack, np.median(medial_l) + slack
    for y, a, b in zip(rows, np.maximum(medial_r, lo), np.minimum(medial_l, hi), strict=True):
        if b > a + 1:
            out[y] = (cols > a) & (cols < b)
    return out


def central_mask(right: np.ndarray, left: np.ndarray, heart: np.ndarray | None,
                 margin: float = CENTRAL_MARGIN) -> np.ndarray:
    """Heart outline ∪ mediastinum, dilated by ``margin`` (default :data:`CENTRAL_MARGIN`) of the thorax width
    (bool; ``margin`` 0: not dilated)."""
    r, lft = as_mask(right, "right lung mask"), as_mask(left, "left lung mask")
    centre = mediastinum_mask(r, lft)
    if heart is not None:
        h = as_mask(heart, "heart mask")
        check_same_shape(("right lung mask", r), ("heart mask", h))
        centre |= h
    lungs = r | lft
    if margin <= 0 or not centre.any() or not lungs.any():
        return centre
    cols = np.flatnonzero(lungs.any(axis=0))
    radius = max(1, round(margin * (cols[-1] - cols[0] + 1)))
    return ndimage.binary_dilation(centre, ndimage.generate_binary_structure(2, 1), iterations=radius)


def lesion_field(probability: np.ndarray, right: np.ndarray, left: np.ndarray,
                 heart: np.ndarray | None) -> np.ndarray:
    """The probability map inside the lungs, 0 on the heart, the mediastinum and outside the lungs."""
    p = np.asarray(probability, np.float32)
    r, lft = as_mask(right, "right lung mask"), as_mask(left, "left lung mask")
    check_same_shape(("lesion probability", p), ("right lung mask", r), ("left lung mask", lft))
    allowed = (r | lft) & ~central_mask(r, lft, heart)
    return np.where(allowed, p, 0.0).astype(np.float32)


def location_share(field: np.ndarray, location: np.ndarray, threshold: float, centre: np.ndarray) -> float:
    """Share of ``location``'s pixels outside ``centre`` with ``field ≥ threshold`` (0 for an empty location)."""
    region = as_mask(location, "location mask") & ~centre
    n = int(region.sum())
    return float((field[region] >= threshold).sum()) / n if n else 0.0


def zone_scores(probability: np.ndarray, right: np.ndarray, left: np.ndarray, heart: np.ndarray | None,
                threshold: float) -> dict[str, float]:
    """Per zone A–F: the share of the zone's pixels (centre removed) with ``p ≥ threshold``."""
    r, lft = as_mask(right, "right lung mask"), as_mask(left, "left lung mask")
    centre = central_mask(r, lft, heart)
    p = np.asarray(probability, np.float32)
    out: dict[str, float] = {}
    zones = iter(BRIXIA_ZONE_LABELS)
    for lung in (r, lft):
        bands = lung_zone_bands(lung)
        for band in _BANDS:
            out[next(zones)] = location_share(p, bands[band], threshold, centre)
    return out


@dataclass
class LesionZoneReader:
    """Zone flags from the lesion segmenter: score = :func:`zone_scores`, flag = score ≥ :data:`ZONE_COVER`."""

    segmenter: LesionSegmenter
    cover: float = ZONE_COVER

    @classmethod
    def shipped(cls, threads: int | None = 1) -> LesionZoneReader:
        """The reader on the shipped ``lesion_unet_v1``."""
        return cls(load_lesion_segmenter(None, threads))

    @property
    def threshold(self) -> float:
        """The zone flag threshold (a share of the zone)."""
        return self.cover

    def read(self, pixels: np.ndarray, right: np.ndarray, left: np.ndarray,
             heart: np.ndarray | None) -> tuple[dict[str, float], dict[str, bool], np.ndarray]:
        """Zone scores, flags and the probability map of one film (all on the given grid)."""
        p = self.segmenter.probability(pixels)
        scores = zone_scores(p, right, left, heart, self.segmenter.threshold)
        return scores, {k: v >= self.cover for k, v in scores.items()}, p

    def name(self) -> str:
        """Who flags the zones, for the CSV provenance and the overlays."""
        return f"{LESION_ZONE_READER} {self.segmenter.meta.get('name', LESION_UNET)} (share p >= " \
               f"{self.segmenter.threshold:.2f} >= {self.cover:.2f})"

    def provenance(self) -> dict[str, Any]:
        """The segmenter's provenance and the flag rule."""
        return {**self.segmenter.provenance(), "zone_cover": self.cover,
                "score": "share of the zone's lung pixels (heart and mediastinum removed) with p >= threshold"}
