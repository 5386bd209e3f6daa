"""CheXpercept anatomy geometry (CHEXPERCEPT.md §5.1-§5.5): geometry lungs, vertical-third zones,
medial/lateral halves, the peripheral rim, the costophrenic angle and the 20 sub-regions.

Choices where the spec is silent (documented here and in the summary of the module's API):

* Connectivity is 8 (ILS.md §9 proposed default) for the connected-component steps of §5.4 (the reference's
  ``cv2.connectedComponents`` default), except the §5.1 merge below.
* §5.1 lesion pieces are 4-connected components (:data:`LESION_MERGE_CONNECTIVITY`), as in the reference,
  which labels them with ``scipy.ndimage.label``'s default cross; two pieces touching only at a corner stay
  two pieces, so one may be merged into a lung and the other not. ``geometry_lungs(connectivity=8)`` gives
  the ILS.md §9 convention instead.
* §5.1 "touches a lung" means the lesion component shares at least one pixel with that lung
  (``HybridGNet ∧ CXAS``), tested before any component is merged; a component touching both lungs
  is merged into both.
* §5.4 erosion by an even ``k×k`` square has no centre pixel; it is anchored as the reference's
  ``skimage.morphology.erosion`` does (scikit-image ≥ 0.23 pads an even footprint with a zero row and column
  *in front*): the square covers offsets ``−(k/2 − 1) … k/2`` around each pixel, one pixel further right and
  down than ``scipy.ndimage.grey_erosion``'s default ``−k/2 … k/2 − 1``. ``lung_core(anchor="scipy")`` gives the
  latter (the audit of issue 11 counted 121 of 3,740 peripheral and costophrenic overlap ratios of the real
  pack that change slightly between the two).
* §5.4 the "largest connected component" breaks size ties by raster order (first component met
  scanning rows top to bottom); the middle-band rule ("rows containing core pixels") reads the core
  pixels of that largest component ``c`` of the side, the same set ``top`` and ``bot`` come from.
* An empty lung gives empty zones, halves, rim and angle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import numpy as np
from scipy import ndimage

from cxrground.io.masks import as_mask, check_same_shape
from cxrground.vocab.locations import PERCEPT_AXIAL, PERCEPT_ZONES, SIDES, lung_label, zone_label

__all__ = [
    "CPA_FRACTION",
    "DEFAULT_EROSION_KERNEL",
    "EROSION_ANCHORS",
    "LESION_MERGE_CONNECTIVITY",
    "PERCEPT_ZONE_NAMES",
    "SUBREGION_NAMES",
    "SUBREGION_ZONE",
    "PerceptGeometry",
    "axial_name",
    "costophrenic_angle",
    "cpa_name",
    "erosion_kernel_size",
    "geometry_lungs",
    "largest_component",
    "lung_core",
    "medial_lateral",
    "percept_geometry",
    "percept_zone_name",
    "peripheral_rim",
    "subregion_name",
    "vertical_thirds",
]

#: §5.4: erosion kernel side (@1024, scaled by §0's ``s = L / 1024``) when the right lung is empty.
DEFAULT_EROSION_KERNEL: Final[int] = 50
#: §5.4: the costophrenic angle keeps the rim rows ``y ≥ ly0 + int(0.75·(ly1 − ly0))``.
CPA_FRACTION: Final[float] = 0.75

#: §5.1: connectivity of the lesion pieces merged into the lungs (the reference's; see the module docstring).
LESION_MERGE_CONNECTIVITY: Final[int] = 4
#: §5.4: anchorings of an even erosion square: ``reference`` (scikit-image, the default) or ``scipy``.
EROSION_ANCHORS: Final[tuple[str, str]] = ("reference", "scipy")

#: 8-connectivity structuring element for :func:`scipy.ndimage.label`.
_EIGHT: Final[np.ndarray] = np.ones((3, 3), dtype=bool)
#: Structuring elements by connectivity.
_STRUCTURE: Final[Mapping[int, np.ndarray]] = MappingProxyType(
    {4: ndimage.generate_binary_structure(2, 1), 8: _EIGHT})

_MEDIAL, _LATERAL, _PERIPHERAL = PERCEPT_AXIAL
_UPPER, _MID, _BASE = PERCEPT_ZONES


# --- names -----------------------------------------------------------------------------------------

def _check_side(side: str) -> str:
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    return side


def percept_zone_name(side: str, zone: str) -> str:
    """Return the CheXpercept zone name ``{side} {zone}`` (zone ∈ ``PERCEPT_ZONES``), e.g. ``left lung base``.
    """
    if zone not in PERCEPT_ZONES:
        raise ValueError(f"unknown CheXpercept zone {zone!r}; expected one of {PERCEPT_ZONES}")
    return zone_label(_check_side(side), zone)


def axial_name(side: str, axial: str) -> str:
    """Return the horizontal-region name ``{side} {axial} lung`` (axial ∈ ``PERCEPT_AXIAL``)."""
    if axial not in PERCEPT_AXIAL:
        raise ValueError(f"unknown horizontal region {axial!r}; expected one of {PERCEPT_AXIAL}")
    return f"{_check_side(side)} {axial} lung"


def cpa_name(side: str) -> str:
    """Return ``{side} costophrenic angle``."""
    return f"{_check_side(side)} costophrenic angle"


def subregion_name(side: str, axial: str, zone: str) -> str:
    """Return the internal sub-region name ``{side} {axial} lung & {side} {zone}`` (§5.5, verbatim)."""
    return f"{axial_name(side, axial)} & {percept_zone_name(side, zone)}"


#: The six zone names, right side first, upper → base.
PERCEPT_ZONE_NAMES: Final[tuple[str, ...]] = tuple(
    percept_zone_name(side, zone) for side in SIDES for zone in PERCEPT_ZONES
)

#: Sub-region name → zone name (§5.5; a costophrenic angle maps to ``{side} lung base``).
SUBREGION_ZONE: Final[Mapping[str, str]] = MappingProxyType(
    {
        name: zone
        for side in SIDES
        for name, zone in (
            *(
                (subregion_name(side, axial, z), percept_zone_name(side, z))
                for axial in PERCEPT_AXIAL
                for z in PERCEPT_ZONES
            ),
            (cpa_name(side), percept_zone_name(side, _BASE)),
        )
    }
)

#: The 20 sub-region names in canonical order: per side (right, left) the nine
#: ``{medial|lateral|peripheral} × {upper|mid|base}`` intersections, then the costophrenic angle.
SUBREGION_NAMES: Final[tuple[str, ...]] = tuple(SUBREGION_ZONE)


# --- single-lung geometry ------------------------------------------------------------------------

def _rows(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(mask.any(axis=1))


def vertical_thirds(lung: np.ndarray) -> dict[str, np.ndarray]:
    """Return the §5.2 zone masks of one lung keyed by zone word (``upper zone lung``, ``mid zone lung``,
    ``lung base``): ``h = max(1, y1 − y0 + 1)``, ``b1 = y0 + h//3``, ``b2 = y0 + 2h//3``."""
    lung = as_mask(lung, "lung mask")
    rows = _rows(lung)
    if rows.size == 0:
        return {z: np.zeros_like(lung) for z in PERCEPT_ZONES}
    y0, y1 = int(rows[0]), int(rows[-1])
    h = max(1, y1 - y0 + 1)
    b1 = y0 + h // 3
    b2 = y0 + (2 * h) // 3
    y = np.arange(lung.shape[0])[:, None]
    return {
        _UPPER: lung & (y <= b1),
        _MID: lung & (y > b1) & (y <= b2),
        _BASE: lung & (y > b2),
    }


def medial_lateral(lung: np.ndarray, side: str) -> dict[str, np.ndarray]:
    """Return the §5.3 halves of one lung keyed ``medial``/``lateral``; ``mid_x = int((min x + max x)/2)``.

    The right lung lies on the image left: its medial half is ``x ≥ mid_x``; the left lung's is ``x < mid_x``.
    """
    lung = as_mask(lung, "lung mask")
    _check_side(side)
    cols = np.flatnonzero(lung.any(axis=0))
    if cols.size == 0:
        return {_MEDIAL: np.zeros_like(lung), _LATERAL: np.zeros_like(lung)}
    mid_x = int((int(cols[0]) + int(cols[-1])) / 2)
    x = np.arange(lung.shape[1])[None, :]
    low, high = lung & (x < mid_x), lung & (x >= mid_x)
    if side == "right":
        return {_MEDIAL: high, _LATERAL: low}
    return {_MEDIAL: low, _LATERAL: high}


# --- peripheral rim and costophrenic angle (§5.4) --------------------------------------------------

def erosion_kernel_size(right_lung: np.ndarray) -> int:
    """Return the §5.4 core-erosion kernel side ``k = max(1, int(w/2))``, ``w`` the mean right-lung width of
    rows ``t1 = ry0 + (ry1−ry0)//3`` and ``t2 = ry0 + 2(ry1−ry0)//3``; when the right lung is empty, 50 px @1024
    scaled to the image (§0: ``s = L / 1024``, ``L`` its longest side, rounded to the nearest integer ≥ 1)."""
    right = as_mask(right_lung, "right lung mask")
    rows = _rows(right)
    if rows.size == 0:
        return max(1, round(DEFAULT_EROSION_KERNEL * max(right.shape) / 1024))
    ry0, ry1 = int(rows[0]), int(rows[-1])
    t1 = ry0 + (ry1 - ry0) // 3
    t2 = ry0 + (2 * (ry1 - ry0)) // 3
    w = (int(right[t1].sum()) + int(right[t2].sum())) / 2
    return max(1, int(w / 2))


def lung_core(right_lung: np.ndarray, left_lung: np.ndarray, kernel: int | None = None,
              anchor: str = "reference") -> np.ndarray:
    """Return ``right ∪ left`` eroded by a ``k×k`` square with reflected borders (``k`` defaults to
    :func:`erosion_kernel_size` of the right lung); ``anchor`` places an even square (module docstring)."""
    right = as_mask(right_lung, "right lung mask")
    left = as_mask(left_lung, "left lung mask")
    check_same_shape(("right lung mask", right), ("left lung mask", left))
    k = erosion_kernel_size(right) if kernel is None else int(kernel)
    if k < 1:
        raise ValueError(f"erosion kernel must be ≥ 1, got {kernel}")
    if anchor not in EROSION_ANCHORS:
        raise ValueError(f"anchor must be one of {EROSION_ANCHORS}, got {anchor!r}")
    origin = -1 if anchor == "reference" and k % 2 == 0 else 0
    union = (right | left).astype(np.uint8)
    return ndimage.grey_erosion(union, size=(k, k), mode="reflect", origin=(origin, origin)) > 0


def largest_component(mask: np.ndarray) -> np.ndarray:
    """Return the largest 8-connected component of ``mask`` (ties: first in raster order); empty if none."""
    mask = as_mask(mask)
    labels, n = ndimage.label(mask, structure=_EIGHT)
    if n == 0:
        return np.zeros_like(mask)
    sizes = np.bincount(labels.ravel(), minlength=n + 1)
    sizes[0] = 0
    return labels == int(np.argmax(sizes))


def peripheral_rim(lung: np.ndarray, core: np.ndarray, side: str) -> np.ndarray:
    """Return the §5.4 peripheral (lateral rim) region of one lung given the eroded ``core``.

    ``c`` = largest component of ``core ∧ lung``; the lung is cleared medially of ``c``'s top pixel above it,
    of ``c``'s bottom pixel below it and of ``c`` itself in between. An empty ``c`` gives the whole lung.
    """
    lung = as_mask(lung, "lung mask")
    core = as_mask(core, "core mask")
    check_same_shape(("lung mask", lung), ("core mask", core))
    _check_side(side)
    rim = lung.copy()
    c = largest_component(core & lung)
    if not c.any():
        return rim
    lung_rows = _rows(lung)
    ly0, ly1 = int(lung_rows[0]), int(lung_rows[-1])
    c_rows = _rows(c)
    top_y, bot_y = int(c_rows[0]), int(c_rows[-1])
    top_xs, bot_xs = np.flatnonzero(c[top_y]), np.flatnonzero(c[bot_y])
    bot_x = int(bot_xs[0])  # ties: minimal x on both sides
    if side == "right":  # lateral = small x
        top_x = int(top_xs[0])
        rim[ly0 : top_y + 1, top_x + 1 :] = False
        for y in range(top_y + 1, bot_y):
            xs = np.flatnonzero(c[y])
            if xs.size:
                rim[y, int(xs[0]) :] = False
        rim[bot_y : ly1 + 1, bot_x + 1 :] = False
    else:  # lateral = large x
        top_x = int(top_xs[-1])
        rim[ly0 : top_y + 1, :top_x] = False
        for y in range(top_y + 1, bot_y):
            xs = np.flatnonzero(c[y])
            if xs.size:
                rim[y, : int(xs[-1]) + 1] = False
        rim[bot_y : ly1 + 1, :bot_x] = False
    return rim


def costophrenic_angle(peripheral: np.ndarray, lung: np.ndarray) -> np.ndarray:
    """Return the §5.4 costophrenic angle: ``peripheral`` with rows ``y < ly0 + int(0.75·(ly1 − ly0))``
    cleared (``ly0``, ``ly1`` = the lung's first and last rows)."""
    peripheral = as_mask(peripheral, "peripheral mask")
    lung = as_mask(lung, "lung mask")
    check_same_shape(("peripheral mask", peripheral), ("lung mask", lung))
    out = peripheral.copy()
    rows = _rows(lung)
    if rows.size == 0:
        return out
    ly0, ly1 = int(rows[0]), int(rows[-1])
    out[: ly0 + int(CPA_FRACTION * (ly1 - ly0))] = False
    return out


# --- geometry lungs (§5.1) -------------------------------------------------------------------------

def geometry_lungs(
    hybrid_right: np.ndarray,
    hybrid_left: np.ndarray,
    cxas_right: np.ndarray | None = None,
    cxas_left: np.ndarray | None = None,
    lesion: np.ndarray | None = None,
    connectivity: int = LESION_MERGE_CONNECTIVITY,
) -> tuple[np.ndarray, np.ndarray]:
    """Return the §5.1 geometry lungs ``(right, left)``: ``HybridGNet ∧ CXAS`` per side (a missing CXAS mask
    leaves that side's HybridGNet mask), then every lesion component (``connectivity`` 4 or 8) sharing a pixel
    with a lung OR-ed into that lung (into both when it touches both)."""
    if connectivity not in _STRUCTURE:
        raise ValueError(f"connectivity must be 4 or 8, got {connectivity!r}")
    named: list[tuple[str, np.ndarray]] = [
        ("HybridGNet right lung", as_mask(hybrid_right, "HybridGNet right lung")),
        ("HybridGNet left lung", as_mask(hybrid_left, "HybridGNet left lung")),
    ]
    optional = (("CXAS right lung", cxas_right), ("CXAS left lung", cxas_left), ("lesion mask", lesion))
    for what, arr in optional:
        if arr is not None:
            named.append((what, as_mask(arr, what)))
    check_same_shape(*named)
    masks = dict(named)
    right = masks["HybridGNet right lung"].copy()
    left = masks["HybridGNet left lung"].copy()
    if "CXAS right lung" in masks:
        right &= masks["CXAS right lung"]
    if "CXAS left lung" in masks:
        left &= masks["CXAS left lung"]
    if "lesion mask" in masks:
        labels, n = ndimage.label(masks["lesion mask"], structure=_STRUCTURE[connectivity])
        if n:
            keep_right = np.unique(labels[right & (labels > 0)])
            keep_left = np.unique(labels[left & (labels > 0)])
            right = right | np.isin(labels, keep_right)
            left = left | np.isin(labels, keep_left)
    return right, left


# --- the whole geometry ----------------------------------------------------------------------------

def _frozen(masks: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    for arr in masks.values():
        arr.setflags(write=False)
    return MappingProxyType(dict(masks))


@dataclass(frozen=True, eq=False)
class PerceptGeometry:
    """All CheXpercept anatomy masks of one image (read-only bool arrays of one shape).

    ``lungs``: ``right lung``/``left lung``; ``zones``: the six §5.2 zones; ``halves``: ``{side} medial lung``
    and ``{side} lateral lung``; ``peripheral``: ``{side} peripheral lung``; ``cpa``: ``{side} costophrenic
    angle``; ``subregions``: the 20 §5.5 sub-regions in :data:`SUBREGION_NAMES` order; ``core``: the eroded
    lung union and ``kernel`` its erosion kernel side.
    """

    shape: tuple[int, int]
    kernel: int
    core: np.ndarray
    lungs: Mapping[str, np.ndarray]
    zones: Mapping[str, np.ndarray]
    halves: Mapping[str, np.ndarray]
    peripheral: Mapping[str, np.ndarray]
    cpa: Mapping[str, np.ndarray]
    subregions: Mapping[str, np.ndarray]

    def lung(self, side: str) -> np.ndarray:
        """Return the geometry lung of ``side``."""
        return self.lungs[lung_label(side)]

    def region(self, name: str) -> np.ndarray:
        """Return the mask of any named region (lung, zone, half, rim, angle or sub-region)."""
        for group in (self.lungs, self.zones, self.halves, self.peripheral, self.cpa, self.subregions):
            if name in group:
                return group[name]
        raise KeyError(f"no CheXpercept region named {name!r}")


def percept_geometry(right_lung: np.ndarray, left_lung: np.ndarray) -> PerceptGeometry:
    """Return the :class:`PerceptGeometry` (§5.2-§5.5) of the two geometry lungs (:func:`geometry_lungs`)."""
    right = as_mask(right_lung, "right lung mask").copy()
    left = as_mask(left_lung, "left lung mask").copy()
    shape = check_same_shape(("right lung mask", right), ("left lung mask", left))
    kernel = erosion_kernel_size(right)
    core = lung_core(right, left, kernel)
    lungs: dict[str, np.ndarray] = {}
    zones: dict[str, np.ndarray] = {}
    halves: dict[str, np.ndarray] = {}
    peripheral: dict[str, np.ndarray] = {}
    cpa: dict[str, np.ndarray] = {}
    subregions: dict[str, np.ndarray] = {}
    for side, lung in zip(SIDES, (right, left), strict=True):
        lungs[lung_label(side)] = lung
        side_zones = vertical_thirds(lung)
        for zone in PERCEPT_ZONES:
            zones[percept_zone_name(side, zone)] = side_zones[zone]
        axial = medial_lateral(lung, side)
        for word in (_MEDIAL, _LATERAL):
            halves[axial_name(side, word)] = axial[word]
        rim = peripheral_rim(lung, core, side)
        axial[_PERIPHERAL] = rim
        peripheral[axial_name(side, _PERIPHERAL)] = rim
        for word in PERCEPT_AXIAL:
            for zone in PERCEPT_ZONES:
                subregions[subregion_name(side, word, zone)] = axial[word] & side_zones[zone]
        angle = costophrenic_angle(rim, lung)
        cpa[cpa_name(side)] = angle
        subregions[cpa_name(side)] = angle
    core.setflags(write=False)
    return PerceptGeometry(
        shape=shape,
        kernel=kernel,
        core=core,
        lungs=_frozen(lungs),
        zones=_frozen(zones),
        halves=_frozen(halves),
        peripheral=_frozen(peripheral),
        cpa=_frozen(cpa),
        subregions=_frozen(subregions),
    )
