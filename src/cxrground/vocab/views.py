"""Which views are frontal: the one definition the readers of films and of studies share."""

from __future__ import annotations

from typing import Final

__all__ = ["BENCH_VIEW", "FRONTAL_VIEWS", "POSITION_WORDS", "is_frontal"]

#: The views ILS accepts (ILS §6: PA and AP only), in the order a study's image is preferred.
FRONTAL_VIEWS: Final[tuple[str, ...]] = ("PA", "AP")
#: Patient-position words that may follow PA/AP and keep the film frontal (``AP SUPINE``, ``AP ERECT``).
POSITION_WORDS: Final[frozenset[str]] = frozenset(
    {"SUPINE", "ERECT", "UPRIGHT", "SEMI-ERECT", "SEMIERECT", "PORTABLE", "SITTING"})

#: The view of every CheXpercept case film: the benchmark is made of frontal films (CHEXPERCEPT.md §2, "CXR: frontal
#: image"), though a case records no projection.
BENCH_VIEW: Final[str] = "FRONTAL"


def is_frontal(view: str, accepted: tuple[str, ...] = FRONTAL_VIEWS) -> bool:
    """PA/AP, also with a patient-position word (``AP SUPINE``, ``AP ERECT``); ``AP AXIAL``/``LLD`` are not."""
    words = view.upper().replace("_", " ").split()
    return bool(words) and words[0] in accepted and all(w in POSITION_WORDS for w in words[1:])
