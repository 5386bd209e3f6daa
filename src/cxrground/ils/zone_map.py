"""Which Brixia zones (A–F) an ILS location label names, and which negatives a lung-opacity zone reader speaks to.

The one mapping used both where negatives are placed (:func:`cxrground.ils.compose.compose_pairs` with zone flags)
and where composed negatives are checked (:mod:`cxrground.ils.image_check`): a zone label names its own Brixia
zone (the apical zone belongs to the upper zone), a whole-lung label its three zones, ``lung`` (both lungs) all six.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from cxrground.ils.config import ALGORITHM1_CHECK
from cxrground.vocab.ils_templates import TENTATIVE_WORD
from cxrground.vocab.lesions import LUNG_LESIONS
from cxrground.vocab.locations import BOTH_LUNGS

__all__ = ["BRIXIA_OF", "OPACITY_TARGETS", "brixia_zones", "dropped_by_reader", "names_flagged_zone",
           "placed_by_reader", "zones_of"]

#: Brixia zone of each zone label a negative is checked on.
BRIXIA_OF: Final[dict[str, str]] = {
    "right apical zone lung": "A", "right upper zone lung": "A", "right mid zone lung": "B", "right lung base": "C",
    "left apical zone lung": "D", "left upper zone lung": "D", "left mid zone lung": "E", "left lung base": "F"}
#: Targets whose negatives a zone reader of lung opacity speaks to: the lung lesions and the tentative "opacity";
#: not effusion (an opacity in a zone does not contradict "no effusion" there) and not the heart.
OPACITY_TARGETS: Final[frozenset[str]] = frozenset({*LUNG_LESIONS, TENTATIVE_WORD})
_BANDS: Final[tuple[str, str, str]] = ("upper zone lung", "mid zone lung", "lung base")


def zones_of(label: str) -> list[str]:
    """The zone labels a negative about ``label`` is checked on: a zone itself, a lung's three zones, both lungs'
    six."""
    if label == BOTH_LUNGS:
        return [f"{side} {b}" for side in ("right", "left") for b in _BANDS]
    for side in ("right", "left"):
        if label == f"{side} lung":
            return [f"{side} {b}" for b in _BANDS]
    return [label]


def brixia_zones(labels: Iterable[str]) -> list[str]:
    """The Brixia zones (A–F, sorted, each once) that the location labels ``labels`` name."""
    return sorted({BRIXIA_OF[z] for lab in labels for z in zones_of(lab) if z in BRIXIA_OF})


def names_flagged_zone(labels: Iterable[str], zone_flags: Mapping[str, bool]) -> bool:
    """True when some Brixia zone named by ``labels`` is flagged in ``zone_flags`` (zone letter → flag)."""
    return any(zone_flags.get(z, False) for z in brixia_zones(labels))


def _reader_words(reader: str) -> str:
    """How the card names who flags the zones: Algorithm 1's own opacity probe, or a zone reader by name."""
    return "Algorithm 1 opacity probe" if reader == ALGORITHM1_CHECK else f"{reader} zone reader"


def dropped_by_reader(reader: str) -> str:
    """The card's reason for a negative left out because of the zone reader ``reader``."""
    return f"negative contradicted by the image ({_reader_words(reader)})"


def placed_by_reader(reader: str) -> str:
    """The card's reason for a negative placed away from the zones the zone reader ``reader`` flags."""
    return f"negative placed away from zones the {_reader_words(reader)} flags"
