"""ILS step 4 (ILS.md §10): location verification — grounded location GL, the GL == RL test, empty locations EL.

- **GL** (:func:`verify_location`): the reported-location (RL) labels whose anatomy mask shares a pixel with
  the boxes Algorithm 1 selected (filled rectangles). Ungrounded RL labels are discarded (no pair for them). The
  build passes the drawn mask within those boxes as ``covered`` (a box spanning two zones grounds only the zone its
  mask lies in: no location sentence names a zone without a mask pixel), and the drawn mask alone for masks shaped
  by the zone guide.
  Proposed default (``IlsConfig.refine_whole_lung_grounding``, on): a grounded whole-lung label
  (``right lung`` / ``left lung``) is replaced, in place, by the zone labels of that side whose masks
  intersect the selected boxes. The zones used are the three that partition a lung — upper, mid, base —
  in that order; the apical zone lies inside the upper zone (ILS §3.1) and is therefore not produced by
  the refinement. When no zone mask is available the whole-lung label is kept. Labels are never repeated.
- **GL == RL test** (:attr:`LocationCheck.complete`): every reported label was grounded (a whole-lung
  label refined into zones counts as grounded). It enables the ``global`` positive.
- **EL** (:func:`empty_locations`): the ten lung labels of §3.1 whose mask has zero overlap with the
  anatomy mask of every reported location of every finding of the report — target and non-target
  findings (``lesion`` None) alike, and by default negated ones too (the literal reading of §10: every
  finding *mentioned*; it only removes candidate locations, never adds one). ``lung`` stands for both
  lungs. Labels with no anatomy mask (e.g. ``heart``) cannot overlap a lung label and are listed in
  ``unknown_labels``; findings without any reported location block nothing and are listed in ``unlocated``.
  A candidate label whose own mask is empty (a lung not found) is never an empty location.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import numpy as np

from cxrground.ils.config import IlsConfig
from cxrground.ils.spatial.base import Box
from cxrground.io.masks import as_mask, check_same_shape
from cxrground.reports.findings import Finding
from cxrground.vocab.locations import BOTH_LUNGS, ILS_LOCATION_LABELS, SIDES, lung_label, side_of, zone_label

__all__ = ["REFINEMENT_ZONES", "EmptyLocations", "LocationCheck", "boxes_mask", "empty_locations", "verify_location",
           "widen_to_lungs"]

#: Zones a grounded whole-lung label is refined into (they partition a lung; apical ⊂ upper is left out).
REFINEMENT_ZONES: Final[tuple[str, str, str]] = ("upper zone lung", "mid zone lung", "lung base")


@dataclass(frozen=True)
class LocationCheck:
    """GL of one grounded finding."""

    reported: tuple[str, ...]
    """RL, as given."""
    grounded: tuple[str, ...]
    """GL: grounded RL labels in RL order, whole-lung labels possibly refined into zones."""
    matched: tuple[str, ...]
    """RL labels whose mask intersects the selected boxes (before refinement)."""
    discarded: tuple[str, ...]
    """RL labels not grounded (no pair is made for them)."""
    refined: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Whole-lung label → the zone labels it was replaced by."""
    unknown_labels: tuple[str, ...] = ()
    """RL labels without an anatomy mask (never grounded)."""

    @property
    def complete(self) -> bool:
        """The GL == RL test: RL is non-empty and every reported label was grounded."""
        return bool(self.reported) and not self.discarded

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"reported": list(self.reported), "grounded": list(self.grounded), "matched": list(self.matched),
                "discarded": list(self.discarded), "refined": {k: list(v) for k, v in self.refined.items()},
                "unknown_labels": list(self.unknown_labels), "complete": self.complete}


def boxes_mask(boxes: Sequence[Box], shape: tuple[int, int]) -> np.ndarray:
    """The union of the filled boxes on a canvas of ``shape``."""
    out = np.zeros(shape, dtype=bool)
    for b in boxes:
        out |= b.mask(shape)
    return out


def verify_location(
    reported: Sequence[str],
    location_masks: Mapping[str, np.ndarray],
    selected: Sequence[Box],
    config: IlsConfig | None = None,
    *,
    refine_whole_lung: bool | None = None,
    covered: np.ndarray | None = None,
) -> LocationCheck:
    """GL of a finding from its RL, the canvas location masks and the boxes Algorithm 1 selected.

    ``refine_whole_lung`` overrides ``config.refine_whole_lung_grounding`` when given. ``covered`` (a canvas mask)
    replaces the selected boxes' area, for masks drawn without boxes (:mod:`cxrground.ils.zone_guide`).
    """
    refine = (config or IlsConfig()).refine_whole_lung_grounding if refine_whole_lung is None else refine_whole_lung
    rl = tuple(dict.fromkeys(reported))
    if not location_masks:
        raise ValueError("no location masks given")
    first = next(iter(location_masks.values()))
    shape = (int(first.shape[0]), int(first.shape[1]))
    covered = boxes_mask(selected, shape) if covered is None else np.asarray(covered, bool)

    def hits(label: str) -> bool:
        m = as_mask(location_masks[label], f"location mask {label!r}")
        check_same_shape(("location masks", first), (f"location mask {label!r}", m))
        return bool((m & covered).any())

    unknown = tuple(lab for lab in rl if lab not in location_masks)
    matched = tuple(lab for lab in rl if lab in location_masks and hits(lab))
    discarded = tuple(lab for lab in rl if lab not in matched)
    grounded: list[str] = []
    refined: dict[str, tuple[str, ...]] = {}
    for lab in matched:
        side = next((s for s in SIDES if lab == lung_label(s)), None)
        if refine and side is not None:
            zones = [zone_label(side, z) for z in REFINEMENT_ZONES]
            available = [z for z in zones if z in location_masks]
            if available:
                inside = tuple(z for z in available if hits(z))
                if inside:
                    refined[lab] = inside
                    grounded.extend(inside)
                    continue
        grounded.append(lab)
    return LocationCheck(rl, tuple(dict.fromkeys(grounded)), matched, discarded, refined, unknown)


@dataclass(frozen=True)
class EmptyLocations:
    """EL, iterable as its labels (ILS §3.1 order)."""

    labels: tuple[str, ...]
    blocked_by: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Lung label → indices of the findings whose reported location overlaps it."""
    unlocated: tuple[int, ...] = ()
    """Indices of considered findings without a reported location."""
    unknown_labels: tuple[str, ...] = ()
    """Reported labels without an anatomy mask (they block nothing)."""

    def __iter__(self) -> Iterator[str]:
        return iter(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __contains__(self, label: object) -> bool:
        return label in self.labels

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"labels": list(self.labels), "blocked_by": {k: list(v) for k, v in self.blocked_by.items()},
                "unlocated": list(self.unlocated), "unknown_labels": list(self.unknown_labels)}


def empty_locations(
    findings: Sequence[Finding],
    location_masks: Mapping[str, np.ndarray],
    *,
    include_absent: bool = True,
    candidates: Sequence[str] = ILS_LOCATION_LABELS,
) -> EmptyLocations:
    """EL: the lung labels (``candidates``, default the ten of §3.1) that overlap no reported location of any
    finding (``include_absent=False`` ignores negated findings)."""
    if not location_masks:
        raise ValueError("no location masks given")
    first = next(iter(location_masks.values()))

    def mask_of(label: str) -> np.ndarray | None:
        if label in location_masks:
            m = as_mask(location_masks[label], f"location mask {label!r}")
        elif label == BOTH_LUNGS and all(lung_label(s) in location_masks for s in SIDES):
            m = as_mask(location_masks[lung_label("right")]) | as_mask(location_masks[lung_label("left")])
        else:
            return None
        check_same_shape(("location masks", first), (f"location mask {label!r}", m))
        return m

    blockers: list[tuple[int, np.ndarray]] = []
    unlocated: list[int] = []
    unknown: list[str] = []
    for i, f in enumerate(findings):
        if f.assertion == "absent" and not include_absent:
            continue
        if not f.reported_location:
            unlocated.append(i)
            continue
        for lab in f.reported_location:
            m = mask_of(lab)
            if m is None:
                if lab not in unknown:
                    unknown.append(lab)
                continue
            blockers.append((i, m))
    free: list[str] = []
    blocked_by: dict[str, tuple[int, ...]] = {}
    for lab in candidates:
        m = mask_of(lab)
        if m is None or not m.any():  # no such region on this image: not a location for negatives
            continue
        hit = tuple(dict.fromkeys(i for i, b in blockers if (b & m).any()))
        if hit:
            blocked_by[lab] = hit
        else:
            free.append(lab)
    return EmptyLocations(tuple(free), blocked_by, tuple(unlocated), tuple(unknown))


def widen_to_lungs(findings: Sequence[Finding]) -> list[Finding]:
    """The findings with every lung location of a present or uncertain finding widened to its whole lung
    (``right lung base`` → ``right lung``, ``lung`` → both lungs); absent findings and other locations as given."""
    out: list[Finding] = []
    for f in findings:
        sides = set(SIDES) if BOTH_LUNGS in f.reported_location else {side_of(lab) for lab in f.reported_location}
        sides.discard(None)
        if f.assertion == "absent" or not sides:
            out.append(f)
            continue
        others = tuple(lab for lab in f.reported_location if lab != BOTH_LUNGS and side_of(lab) is None)
        out.append(replace(f, reported_location=tuple(lung_label(s) for s in SIDES if s in sides) + others))
    return out
