"""ILS step 3 (ILS.md §9): Algorithm 1, refinement and the lesion-specific rules, on the working canvas.

Everything here is pure numpy/scipy and deterministic. Arrays share one canvas shape (checked, both shapes
named on a mismatch): the grey image ``x``, the signed anomaly map ``(x − x̂)/255``, bool masks, boxes in
canvas pixels.

Algorithm 1 (§9.1), per finding, with the Table 7 thresholds of its lesion (``IlsConfig.thresholds_for``):

- ``A = refine_noise({x_ano ≥ τ_ano})`` (erosion then dilation with the elliptical kernel of
  :class:`~cxrground.ils.config.RefineConfig`);
- ``M_union`` = OR of the anatomy masks of the finding's reported location (RL) labels;
- each box passes when c1 ``IoU(B, M_union) ≥ τ_anatomy``, c2 ``conf ≥ τ_conf``, c3 ``|B ∧ A|/|B| ≥ τ_signal``
  and c4 ``IoU(B, Lr) ≥ τ_size or IoU(B, Ll) ≥ τ_size`` (IoU = intersection over union of pixel sets, the box
  as a filled rectangle clipped to the canvas); with ``IlsConfig.box_class_must_match`` the box class must
  also fit the lesion (:func:`~cxrground.ils.spatial.boxes.box_matches_lesion`; off by default, as in the paper);
- for a passing box, ``C`` = union of the connected components of ``A`` (``RefineConfig.connectivity``,
  default 8) that share a pixel with the box; the whole component is kept, not clipped to the box;
- ``M_lesion |= refine(C)`` and the box is *selected*. Choice: a box whose ``refine(C)`` is empty is not
  selected (it contributes no pixel and must not ground a location); its check records ``refined_empty``.

Refinement (§9.3, :func:`refine_mask`): opening of ``C``; region expansion (each component grows into
8-neighbours whose intensity is within ``growth_tolerance`` of the component's mean, ``growth_passes`` passes,
only inside the lungs); clipping to ``Lr ∪ Ll`` (lung lesions and effusion); removal of components smaller
than ``min_component_fraction`` of the canvas area.

Lesion rules (§9.4): cardiomegaly → the heart mask (no detector, no anomaly map), and the image may give a
cardiomegaly negative only when ``CTR ≤ ctr_negative_max`` (exactly 0.45 is eligible); effusion → Algorithm 1
then base completion and clipping to the completed pleural region (:func:`effusion_base_completion`; the
sides are those of the RL labels, both for an unsided label; selected boxes that no longer contain any
effusion pixel are dropped from ``selected``); edema → Algorithm 1 with the edema thresholds;
the other lung lesions → Algorithm 1 with the general thresholds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import numpy as np
from scipy import ndimage

from cxrground.anatomy.ctr import EmptyAnatomyError, cardiothoracic_ratio
from cxrground.errors import MaskShapeError
from cxrground.ils.config import IlsConfig, RefineConfig, Thresholds
from cxrground.ils.spatial.base import Box
from cxrground.ils.spatial.boxes import box_matches_lesion, ellipse_kernel
from cxrground.ils.spatial.pseudo_normal import anomaly_mask
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.reports.findings import Finding
from cxrground.vocab.locations import BOTH_LUNGS, SIDES, side_of
from cxrground.vocab.traits import traits

__all__ = [
    "CONDITIONS",
    "Algorithm1Result",
    "BoxCheck",
    "GroundingResult",
    "algorithm1",
    "box_iou",
    "components_touching",
    "effusion_base_completion",
    "ground_finding",
    "grow_region",
    "refine_mask",
    "refine_noise",
    "remove_small_components",
]

#: The four box conditions of Algorithm 1, in order (c1..c4).
CONDITIONS: Final[tuple[str, str, str, str]] = ("anatomy", "confidence", "signal", "size")


# --- records ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BoxCheck:
    """How one box fared in Algorithm 1 for one finding."""

    box: Box
    iou_anatomy: float
    """IoU(B, M_union)."""
    confidence: float
    signal: float
    """|B ∧ A| / |B|."""
    iou_lung: float
    """max(IoU(B, Lr), IoU(B, Ll))."""
    c1: bool
    """anatomy: iou_anatomy ≥ τ_anatomy."""
    c2: bool
    """confidence ≥ τ_conf."""
    c3: bool
    """signal ≥ τ_signal."""
    c4: bool
    """size: IoU(B, Lr) ≥ τ_size or IoU(B, Ll) ≥ τ_size."""
    class_ok: bool = True
    """False only when ``box_class_must_match`` is on and the box class does not fit the lesion."""
    component_pixels: int = 0
    """|C|: pixels of the anomaly components touching the box (computed for passing boxes only)."""
    refined_pixels: int = 0
    """|refine(C)|."""
    selected: bool = False

    @property
    def passed(self) -> bool:
        """All four conditions (and the class rule, when on) hold."""
        return self.c1 and self.c2 and self.c3 and self.c4 and self.class_ok

    @property
    def failed(self) -> tuple[str, ...]:
        """Names of what stopped the box: conditions of :data:`CONDITIONS`, ``class``, ``no_component``,
        ``refined_empty``; empty when the box was selected."""
        out = [name for name, ok in zip(CONDITIONS, (self.c1, self.c2, self.c3, self.c4), strict=True) if not ok]
        if not self.class_ok:
            out.append("class")
        if self.passed and not self.selected:
            out.append("no_component" if self.component_pixels == 0 else "refined_empty")
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "box": self.box.to_dict(), "iou_anatomy": round(self.iou_anatomy, 6), "confidence": self.confidence,
            "signal": round(self.signal, 6), "iou_lung": round(self.iou_lung, 6),
            "c1": self.c1, "c2": self.c2, "c3": self.c3, "c4": self.c4, "class_ok": self.class_ok,
            "component_pixels": self.component_pixels, "refined_pixels": self.refined_pixels,
            "selected": self.selected, "failed": list(self.failed),
        }


def _failure_counts(checks: Iterable[BoxCheck]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for check in checks:
        counts.update(check.failed)
    return dict(sorted(counts.items()))


@dataclass(frozen=True, eq=False)
class Algorithm1Result:
    """``M_lesion``, the selected boxes and one :class:`BoxCheck` per input box (input order)."""

    mask: np.ndarray
    selected: tuple[Box, ...]
    checks: tuple[BoxCheck, ...]
    anomaly: np.ndarray
    """``A`` after noise removal (what c3 and the components used)."""

    def failure_counts(self) -> dict[str, int]:
        """Boxes stopped by each reason (a box failing two conditions counts for both)."""
        return _failure_counts(self.checks)


@dataclass(frozen=True, eq=False)
class GroundingResult:
    """The outcome of step 3 for one finding.

    ``status``: ``grounded`` (non-empty mask), ``empty`` (no mask; ``reason`` says why), ``absent`` (a negated
    finding: nothing to ground), ``skipped`` (a non-target finding, ``lesion`` None).
    ``reason`` when not grounded: ``no_boxes``, ``no_box_passed``, ``no_component``, ``refined_empty``,
    ``not_basal`` (effusion whose components all lie above the lung bases), ``no_location_mask``,
    ``empty_heart``, ``absent``, ``non_target``.
    """

    lesion: str | None
    reported_location: tuple[str, ...]
    mask: np.ndarray
    status: str
    method: str
    """``algorithm1``, ``heart`` (cardiomegaly) or ``none``."""
    reason: str | None = None
    selected: tuple[Box, ...] = ()
    checks: tuple[BoxCheck, ...] = ()
    thresholds: Thresholds | None = None
    completed_sides: tuple[str, ...] = ()
    """Effusion: the sides whose base was completed."""
    ctr: float | None = None
    """Cardiomegaly findings: the cardiothoracic ratio (None when heart or lungs are empty)."""
    negative_eligible: bool | None = None
    """Cardiomegaly findings: ``CTR ≤ ctr_negative_max``."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def grounded(self) -> bool:
        """True when the mask has foreground."""
        return bool(self.mask.any())

    def failure_counts(self) -> dict[str, int]:
        """Boxes stopped by each reason (for the card's QC-by-reason counts)."""
        return _failure_counts(self.checks)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the mask as its pixel count)."""
        return {
            "lesion": self.lesion, "reported_location": list(self.reported_location), "status": self.status,
            "method": self.method, "reason": self.reason, "area": int(self.mask.sum()),
            "selected": [b.to_dict() for b in self.selected], "checks": [c.to_dict() for c in self.checks],
            "failure_counts": self.failure_counts(),
            "thresholds": None if self.thresholds is None else asdict(self.thresholds),
            "completed_sides": list(self.completed_sides), "ctr": self.ctr,
            "negative_eligible": self.negative_eligible, "notes": list(self.notes),
        }


# --- morphology helpers -------------------------------------------------------------------------------

def _structure(connectivity: int) -> np.ndarray:
    if connectivity == 8:
        return np.ones((3, 3), dtype=bool)
    if connectivity == 4:
        return ndimage.generate_binary_structure(2, 1)
    raise ValueError(f"connectivity must be 4 or 8, got {connectivity}")


def refine_noise(mask: np.ndarray, kernel: int = 5, iterations: int = 1) -> np.ndarray:
    """Erosion then dilation (opening) with a ``kernel``-sized elliptical element, ``iterations`` each."""
    m = as_mask(mask, "anomaly mask")
    if kernel <= 1 or iterations <= 0 or not m.any():
        return m.copy()
    se = ellipse_kernel(kernel)
    eroded = ndimage.binary_erosion(m, structure=se, iterations=iterations)
    return ndimage.binary_dilation(eroded, structure=se, iterations=iterations)


def components_touching(mask: np.ndarray, region: np.ndarray, connectivity: int = 8) -> np.ndarray:
    """Union of the connected components of ``mask`` that share at least one pixel with ``region``."""
    m, r = as_mask(mask), as_mask(region, "region")
    check_same_shape(("mask", m), ("region", r))
    labels, n = ndimage.label(m, structure=_structure(connectivity))
    if n == 0:
        return np.zeros_like(m)
    ids = np.unique(labels[r])
    ids = ids[ids > 0]
    if ids.size == 0:
        return np.zeros_like(m)
    keep = np.zeros(n + 1, dtype=bool)
    keep[ids] = True
    return keep[labels]


def remove_small_components(mask: np.ndarray, min_pixels: int, connectivity: int = 8) -> np.ndarray:
    """Drop connected components with fewer than ``min_pixels`` pixels."""
    m = as_mask(mask)
    if min_pixels <= 1 or not m.any():
        return m.copy()
    labels, n = ndimage.label(m, structure=_structure(connectivity))
    sizes = np.bincount(labels.ravel(), minlength=n + 1)
    keep = sizes >= min_pixels
    keep[0] = False
    return keep[labels]


def grow_region(
    mask: np.ndarray,
    image: np.ndarray,
    allowed: np.ndarray,
    tolerance: float,
    passes: int,
    connectivity: int = 8,
) -> np.ndarray:
    """Region expansion: each component takes the neighbours (within ``allowed``) whose intensity is within
    ``tolerance`` grey levels of the component's mean intensity (recomputed before each pass)."""
    m = as_mask(mask)
    allowed = as_mask(allowed, "allowed region")
    x = np.asarray(image, dtype=np.float64)
    check_same_shape(("mask", m), ("image", x), ("allowed region", allowed))
    st = _structure(connectivity)
    out = m.copy()
    for _ in range(max(0, passes)):
        labels, n = ndimage.label(out, structure=st)
        if n == 0:
            break
        means = np.asarray(ndimage.mean(x, labels, index=np.arange(1, n + 1)), dtype=np.float64)
        grown = ndimage.grey_dilation(labels, footprint=st)
        cand = (grown > 0) & ~out & allowed
        if not cand.any():
            break
        accept = np.zeros_like(out)
        accept[cand] = np.abs(x[cand] - means[grown[cand] - 1]) <= tolerance
        if not accept.any():
            break
        out |= accept
    return out


def refine_mask(
    components: np.ndarray,
    image: np.ndarray,
    lungs: np.ndarray,
    clip: np.ndarray | None,
    config: RefineConfig | None = None,
) -> np.ndarray:
    """§9.3 refinement of a selected component set: opening, growth inside ``lungs``, clip, minimum size.

    Works on the bounding crop of ``components`` (padded by the growth reach); the result is identical to
    running on the whole canvas because nothing can reach beyond the padding.
    """
    cfg = config or RefineConfig()
    comp = as_mask(components, "components")
    x = np.asarray(image)
    lung_mask = as_mask(lungs, "lungs")
    clip_mask = as_mask(clip, "clip region") if clip is not None else None
    named = [("components", comp), ("image", x), ("lungs", lung_mask)]
    if clip_mask is not None:
        named.append(("clip region", clip_mask))
    check_same_shape(*named)
    out = np.zeros(comp.shape, dtype=bool)
    if not comp.any():
        return out
    rows = np.flatnonzero(comp.any(axis=1))
    cols = np.flatnonzero(comp.any(axis=0))
    pad = cfg.opening_kernel * cfg.opening_iterations + max(0, cfg.growth_passes) + 2
    sl = (slice(max(0, rows[0] - pad), rows[-1] + pad + 1), slice(max(0, cols[0] - pad), cols[-1] + pad + 1))
    m = refine_noise(comp[sl], cfg.opening_kernel, cfg.opening_iterations)
    if not m.any():
        return out
    m = grow_region(m, x[sl], lung_mask[sl], cfg.growth_tolerance, cfg.growth_passes, cfg.connectivity)
    if clip_mask is not None:
        m &= clip_mask[sl]
    min_pixels = math.ceil(cfg.min_component_fraction * comp.size)
    out[sl] = remove_small_components(m, min_pixels, cfg.connectivity)
    return out


def box_iou(box: Box, mask: np.ndarray) -> float:
    """IoU of the filled box (clipped to the canvas) and ``mask``."""
    sl, area = _box_slices(box, mask.shape)
    if area == 0:
        return 0.0
    inter = int(mask[sl].sum())
    union = area + int(mask.sum()) - inter
    return inter / union if union else 0.0


def _box_slices(box: Box, shape: tuple[int, ...]) -> tuple[tuple[slice, slice], int]:
    y0, y1 = max(0, box.y0), min(shape[0] - 1, box.y1)
    x0, x1 = max(0, box.x0), min(shape[1] - 1, box.x1)
    if y1 < y0 or x1 < x0:
        return (slice(0, 0), slice(0, 0)), 0
    return (slice(y0, y1 + 1), slice(x0, x1 + 1)), (y1 - y0 + 1) * (x1 - x0 + 1)


# --- Algorithm 1 ----------------------------------------------------------------------------------------

def algorithm1(
    anomaly_mask: np.ndarray,
    location_union: np.ndarray,
    right_lung: np.ndarray,
    left_lung: np.ndarray,
    boxes: Sequence[Box],
    thresholds: Thresholds,
    *,
    refine: Callable[[np.ndarray], np.ndarray] | None = None,
    refine_config: RefineConfig | None = None,
    lesion: str | None = None,
    box_class_must_match: bool = False,
) -> Algorithm1Result:
    """ILS Algorithm 1 (see the module docstring). ``anomaly_mask`` is ``{x_ano ≥ τ_ano}`` *before* noise
    removal; ``refine`` maps a component set to its refined mask (identity when None)."""
    cfg = refine_config or RefineConfig()
    a_raw = as_mask(anomaly_mask, "anomaly mask")
    m_union = as_mask(location_union, "location union")
    lr, ll = as_mask(right_lung, "right lung mask"), as_mask(left_lung, "left lung mask")
    shape = check_same_shape(("anomaly mask", a_raw), ("location union", m_union), ("right lung mask", lr),
                             ("left lung mask", ll))
    a = refine_noise(a_raw, cfg.opening_kernel, cfg.opening_iterations)
    labels, n = ndimage.label(a, structure=_structure(cfg.connectivity))
    m_lesion = np.zeros(shape, dtype=bool)
    selected: list[Box] = []
    checks: list[BoxCheck] = []
    cache: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
    sums = {id(m): int(m.sum()) for m in (m_union, lr, ll)}

    def iou(sl: tuple[slice, slice], area: int, m: np.ndarray) -> float:
        if area == 0:
            return 0.0
        inter = int(m[sl].sum())
        union = area + sums[id(m)] - inter
        return inter / union if union else 0.0

    for box in boxes:
        sl, area = _box_slices(box, shape)
        iou_anat = iou(sl, area, m_union)
        signal = float(a[sl].sum()) / area if area else 0.0
        iou_r, iou_l = iou(sl, area, lr), iou(sl, area, ll)
        iou_lung = max(iou_r, iou_l)
        c1 = iou_anat >= thresholds.tau_anatomy
        c2 = float(box.confidence) >= thresholds.tau_conf
        c3 = area > 0 and signal >= thresholds.tau_signal
        c4 = iou_r >= thresholds.tau_size or iou_l >= thresholds.tau_size
        class_ok = not box_class_must_match or lesion is None or box_matches_lesion(box.label, lesion)
        check = BoxCheck(box, iou_anat, float(box.confidence), signal, iou_lung, c1, c2, bool(c3), c4, class_ok)
        if check.passed and n > 0:
            ids = np.unique(labels[sl])
            ids = ids[ids > 0]
            if ids.size:
                key = ids.tobytes()
                if key not in cache:
                    keep = np.zeros(n + 1, dtype=bool)
                    keep[ids] = True
                    comp = keep[labels]
                    refined = as_mask(refine(comp) if refine is not None else comp, "refined mask")
                    check_same_shape(("anomaly mask", a), ("refined mask", refined))
                    cache[key] = (comp, refined)
                comp, refined = cache[key]
                chosen = bool(refined.any())
                check = BoxCheck(box, iou_anat, float(box.confidence), signal, iou_lung, c1, c2, bool(c3), c4,
                                 class_ok, int(comp.sum()), int(refined.sum()), chosen)
                if chosen:
                    m_lesion |= refined
                    selected.append(box)
        checks.append(check)
    return Algorithm1Result(m_lesion, tuple(selected), tuple(checks), a)


# --- effusion -------------------------------------------------------------------------------------------

def effusion_base_completion(
    mask: np.ndarray,
    right_lung: np.ndarray,
    left_lung: np.ndarray,
    sides: Iterable[str] = SIDES,
    fraction: float = 0.25,
    clip: bool = True,
    connectivity: int = 8,
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Add the lower part of each lung of ``sides`` so an effusion reaches the costophrenic angle.

    For a lung with rows ``y0..y1`` (``h = y1 − y0``), the *base band* is ``y ≥ y1 − fraction·h``. When the
    mask has pixels of that lung inside the band, every lung pixel with ``y ≥`` the topmost such row is added
    (ILS §9.3 proposed default). With ``clip`` (the §9.1 proposed default "clip to the completed pleural
    region"), the result keeps only the completed region and the mask components (``connectivity``) that
    reach a base band; a mask with no pixel in any base band of ``sides`` becomes empty — pleural fluid on a
    frontal radiograph lies at the base. Returns the mask and the sides that were completed.
    """
    m = as_mask(mask)
    lr, ll = as_mask(right_lung, "right lung mask"), as_mask(left_lung, "left lung mask")
    check_same_shape(("mask", m), ("right lung mask", lr), ("left lung mask", ll))
    wanted = set(sides)
    added = np.zeros_like(m)
    bands = np.zeros_like(m)
    done: list[str] = []
    rows_idx = np.arange(m.shape[0])[:, None]
    for side, lung in zip(SIDES, (lr, ll), strict=True):
        if side not in wanted or not lung.any():
            continue
        rows = np.flatnonzero(lung.any(axis=1))
        y0, y1 = int(rows[0]), int(rows[-1])
        band = lung & (rows_idx >= y1 - fraction * (y1 - y0))
        inside = m & band
        if not inside.any():
            continue
        top = int(np.flatnonzero(inside.any(axis=1))[0])
        added |= lung & (rows_idx >= top)
        bands |= band
        done.append(side)
    if not clip:
        return m | added, tuple(done)
    if not done:
        return np.zeros_like(m), ()
    return components_touching(m, bands, connectivity) | added, tuple(done)


def _sides_of(labels: Sequence[str]) -> tuple[str, ...]:
    sides = {side_of(lab) for lab in labels}
    if None in sides or not sides:  # "lung" or an unsided label: both sides
        return SIDES
    return tuple(s for s in SIDES if s in sides)


# --- one finding ----------------------------------------------------------------------------------------

def ground_finding(
    finding: Finding,
    canvas_image: np.ndarray,
    anomaly: np.ndarray,
    location_masks: dict[str, np.ndarray],
    right_lung: np.ndarray,
    left_lung: np.ndarray,
    heart: np.ndarray | None,
    boxes: Sequence[Box],
    config: IlsConfig | None = None,
) -> GroundingResult:
    """Step 3 for one finding on the working canvas (lesion rules of §9.4, Algorithm 1, refinement).

    ``anomaly`` is the signed map ``(x − x̂)/255``; ``location_masks`` maps ILS labels (and ``lung``) to
    canvas masks, e.g. :func:`cxrground.anatomy.ils_location_masks` of the canvas lungs.
    """
    cfg = config or IlsConfig()
    x = np.asarray(canvas_image)
    an = np.asarray(anomaly)
    lr, ll = as_mask(right_lung, "right lung mask"), as_mask(left_lung, "left lung mask")
    h = as_mask(heart, "heart mask") if heart is not None else np.zeros_like(lr)
    shape = check_same_shape(("canvas image", x), ("anomaly map", an), ("right lung mask", lr),
                             ("left lung mask", ll), ("heart mask", h))
    empty = np.zeros(shape, dtype=bool)
    rl = tuple(finding.reported_location)
    lesion = finding.lesion

    if lesion is None:
        return GroundingResult(None, rl, empty, "skipped", "none", "non_target")
    lesion_traits = traits(lesion)
    if lesion_traits.heart_mask:
        try:
            ctr: float | None = cardiothoracic_ratio(h, lr, ll)
        except EmptyAnatomyError:
            ctr = None
        eligible = not lesion_traits.ctr_rule or (ctr is not None and ctr <= cfg.ctr_negative_max)
        if finding.assertion == "absent":
            return GroundingResult(lesion, rl, empty, "absent", "heart", "absent", ctr=ctr, negative_eligible=eligible)
        if not h.any():
            return GroundingResult(lesion, rl, empty, "empty", "heart", "empty_heart", ctr=ctr,
                                   negative_eligible=eligible)
        return GroundingResult(lesion, rl, h.copy(), "grounded", "heart", None, ctr=ctr, negative_eligible=eligible)
    if finding.assertion == "absent":
        return GroundingResult(lesion, rl, empty, "absent", "none", "absent")
    if lesion_traits.contrast != "brighter":
        raise ValueError(f"{lesion} is {lesion_traits.contrast} than lung: Algorithm 1's anomaly map grounds only "
                         "lesions brighter than lung (ILS.md §2); this lesion needs its own spatial extraction")

    tau = cfg.thresholds_for(lesion)
    notes: list[str] = []
    labels = rl
    if not labels:
        labels = (BOTH_LUNGS,)
        notes.append("no reported location: both lungs used")
    known = [lab for lab in labels if lab in location_masks]
    unknown = [lab for lab in labels if lab not in location_masks]
    if unknown:
        notes.append(f"no anatomy mask for {unknown}")
    if not known:
        return GroundingResult(lesion, rl, empty, "empty", "algorithm1", "no_location_mask", thresholds=tau,
                               notes=tuple(notes))
    m_union = np.zeros(shape, dtype=bool)
    for lab in known:
        m = as_mask(location_masks[lab], f"location mask {lab!r}")
        if m.shape != shape:
            raise MaskShapeError(shape, m.shape, f"location mask {lab!r}")
        m_union |= m
    lungs = lr | ll

    def _refine(components: np.ndarray) -> np.ndarray:
        return refine_mask(components, x, lungs, lungs, cfg.refine)

    res = algorithm1(anomaly_mask(an, tau.tau_ano), m_union, lr, ll, boxes, tau, refine=_refine,
                     refine_config=cfg.refine, lesion=lesion, box_class_must_match=cfg.box_class_must_match)
    mask = res.mask
    completed: tuple[str, ...] = ()
    selected = res.selected
    if lesion_traits.base_completion and mask.any():
        mask, completed = effusion_base_completion(mask, lr, ll, _sides_of(known), cfg.refine.effusion_base_fraction,
                                                   clip=True, connectivity=cfg.refine.connectivity)
        # a box counts for GL only if the clipped effusion mask still lies in it
        selected = tuple(b for b in selected if mask[_box_slices(b, shape)[0]].any())
        if not mask.any():
            notes.append("effusion: no grounded component reaches a lung base")
    if mask.any():
        return GroundingResult(lesion, rl, mask, "grounded", "algorithm1", None, selected, res.checks, tau,
                               completed, notes=tuple(notes))
    if not boxes:
        reason = "no_boxes"
    elif not any(c.passed for c in res.checks):
        reason = "no_box_passed"
    elif lesion_traits.base_completion and res.mask.any():
        reason = "not_basal"
    elif any(c.passed and c.component_pixels > 0 for c in res.checks):
        reason = "refined_empty"
    else:
        reason = "no_component"
    return GroundingResult(lesion, rl, mask, "empty", "algorithm1", reason, (), res.checks, tau, notes=tuple(notes))
