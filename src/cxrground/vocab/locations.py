"""Location vocabulary and the two join rules (ILS.md §3, CHEXPERCEPT.md §2, §5)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

SIDES: Final[tuple[str, str]] = ("right", "left")

#: ILS location labels (ILS Table 9), verbatim, in a fixed canonical order.
ILS_LOCATION_LABELS: Final[tuple[str, ...]] = (
    "right lung",
    "left lung",
    "right apical zone lung",
    "right upper zone lung",
    "right mid zone lung",
    "right lung base",
    "left apical zone lung",
    "left upper zone lung",
    "left mid zone lung",
    "left lung base",
)

#: Location values that occur only in JSON ``location`` fields.
HEART: Final[str] = "heart"
BOTH_LUNGS: Final[str] = "lung"

#: ILS zone words in vertical order; ``{side} {zone}`` gives the label.
ILS_ZONES: Final[tuple[str, ...]] = ("apical zone lung", "upper zone lung", "mid zone lung", "lung base")

#: CheXpercept vertical thirds (internal names); ``{side} {zone}`` gives the zone name.
PERCEPT_ZONES: Final[tuple[str, str, str]] = ("upper zone lung", "mid zone lung", "lung base")

#: CheXpercept horizontal regions; ``{side} {axial} lung``.
PERCEPT_AXIAL: Final[tuple[str, str, str]] = ("medial", "lateral", "peripheral")

#: Zone names used in CheXpercept question text (``lung base`` is shown as ``lower zone lung``).
PERCEPT_ZONE_DISPLAY: Final[dict[str, str]] = {
    "upper zone lung": "upper zone lung",
    "mid zone lung": "mid zone lung",
    "lung base": "lower zone lung",
}


def lung_label(side: str) -> str:
    """``right lung`` or ``left lung``."""
    _check_side(side)
    return f"{side} lung"


def zone_label(side: str, zone: str) -> str:
    """``{side} {zone}``, e.g. ``right lung base``; valid for ILS and CheXpercept zone words."""
    _check_side(side)
    if zone not in ILS_ZONES:
        raise ValueError(f"unknown zone {zone!r}; expected one of {ILS_ZONES}")
    return f"{side} {zone}"


def lung_bases(labels: tuple[str, ...]) -> tuple[str, ...]:
    """``labels`` with each whole lung replaced by that lung's base (zones and other labels kept, order kept, no
    repeats): where an atelectasis adjacent to an effusion of those places lies."""
    whole = {lung_label(side): zone_label(side, "lung base") for side in SIDES}
    return tuple(dict.fromkeys(whole.get(lab, lab) for lab in labels))


def side_of(label: str) -> str | None:
    """The side word a label starts with, or None (``heart``, ``lung``)."""
    first = label.split(" ", 1)[0]
    return first if first in SIDES else None


def join_ils(labels: Sequence[str]) -> str:
    """ILS join: ``A`` / ``A and B`` / ``A, B and C`` (no Oxford comma), in the given order."""
    items = list(labels)
    if not items:
        raise ValueError("a location needs at least one label")
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def dedupe(labels: Iterable[str]) -> list[str]:
    """Remove repeated labels, keeping the first occurrence of each."""
    return list(dict.fromkeys(labels))


def join_percept(labels: Sequence[str]) -> str:
    """CheXpercept candidate join: ``A`` / ``A and B`` / ``A, B, and C`` after in-order de-duplication."""
    items = dedupe(labels)
    if not items:
        raise ValueError("a location needs at least one label")
    if len(items) == 1:
        return items[0]
    if len(items) == 2:
        return f"{items[0]} and {items[1]}"
    return ", ".join(items[:-1]) + ", and " + items[-1]


def split_ils(text: str) -> list[str]:
    """Inverse of :func:`join_ils` for label texts (labels themselves contain no ``,`` or `` and ``)."""
    text = text.strip().rstrip(".")
    if not text:
        return []
    head, sep, last = text.rpartition(" and ")
    if not sep:
        return [text]
    parts = [p.strip() for p in head.split(",")] + [last.strip()]
    return [p for p in parts if p]


def _check_side(side: str) -> None:
    if side not in SIDES:
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
