"""The order in which per-lesion results are reported: the paper's evaluation order, then any other target."""

from __future__ import annotations

from cxrground.vocab.lesions import EVAL_ORDER

__all__ = ["lesion_order"]


def lesion_order(names: set[str]) -> list[str]:
    """``names`` in :data:`~cxrground.vocab.lesions.EVAL_ORDER`, then the others sorted."""
    return [lesion for lesion in EVAL_ORDER if lesion in names] + sorted(names - set(EVAL_ORDER))
