"""Deformer backends by name: ``builtin`` (CPU, §7.3 non-SAM) and ``sam`` (a local SAM checkpoint)."""

from __future__ import annotations

from typing import Any

from cxrground.errors import ConfigError
from cxrground.percept.deform.base import Deformer
from cxrground.percept.deform.builtin import BuiltinDeformer
from cxrground.percept.deform.sam import SamDeformer

__all__ = ["DEFORMERS", "get_deformer"]

DEFORMERS: dict[str, type] = {"builtin": BuiltinDeformer, "sam": SamDeformer}


def get_deformer(name: str = "builtin", **kwargs: Any) -> Deformer:
    """Return a deformer by name; keyword arguments go to its constructor (``sam`` needs ``model_path``)."""
    if name not in DEFORMERS:
        raise ConfigError(f"unknown deformer {name!r}; expected one of {', '.join(sorted(DEFORMERS))}")
    return DEFORMERS[name](**kwargs)
