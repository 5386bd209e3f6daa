"""CheXpercept deformation (CHEXPERCEPT.md §7): point sampling, the :class:`Deformer` interface and backends.

Backends by name (:func:`get_deformer`): ``builtin`` (:class:`BuiltinDeformer`, CPU) and ``sam``
(:class:`SamDeformer`, a local ``transformers`` SAM checkpoint; torch is imported only when it loads).
"""

from __future__ import annotations

from cxrground.percept.deform.base import Deformer, DeformResult, is_valid, validity_problem
from cxrground.percept.deform.builtin import BuiltinDeformer
from cxrground.percept.deform.registry import DEFORMERS, get_deformer
from cxrground.percept.deform.sam import SamDeformer

__all__ = [
    "DEFORMERS",
    "BuiltinDeformer",
    "DeformResult",
    "Deformer",
    "SamDeformer",
    "get_deformer",
    "is_valid",
    "validity_problem",
]
