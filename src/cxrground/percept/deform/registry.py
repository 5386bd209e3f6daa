"""Deformer backends by name: ``builtin`` (CPU, §7.3 non-SAM) and ``sam`` (a local SAM checkpoint)."""

from __future__ import annotations

from typing import Any, Final

from cxrground.percept.deform.base import Deformer
from cxrground.percept.deform.builtin import BuiltinDeformer
from cxrground.percept.deform.sam import SamDeformer
from cxrground.registry import Registry

__all__ = ["DEFORMERS", "get_deformer"]

#: Deformers by name (``sam`` loads its model lazily, on the first deformation).
DEFORMERS: Final[Registry[Deformer]] = Registry("deformer")
DEFORMERS.register("builtin", BuiltinDeformer, help="CPU geodesic grow / disc shrink (the §7.3 non-SAM deformer)")
DEFORMERS.register("sam", SamDeformer, help="transformers SamModel, local folder (model_path=DIR), prompted as §7.3",
                   needs=("torch", "transformers"))


def get_deformer(name: str = "builtin", **kwargs: Any) -> Deformer:
    """Return a deformer by name; keyword arguments go to its constructor (``sam`` needs ``model_path``)."""
    return DEFORMERS.create(name, **kwargs)
