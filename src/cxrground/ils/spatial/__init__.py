"""ILS §8 spatial extraction: normal-image synthesis, anomaly map, lesion boxes (interfaces and backends).

Backends by name (``get_synthesizer`` / ``get_detector``):

- synthesizers: ``normative`` (built-in default, CPU; :class:`NormativeSynthesizer`, a model of normal films),
  ``pseudo-normal`` (built-in, CPU; :class:`PseudoNormalSynthesizer`), ``radedit``
  (:class:`RadEditSynthesizer`, local weights);
- detectors: ``anomaly`` (built-in, CPU; :class:`AnomalyBoxDetector`), ``yolo`` (:class:`YOLOBoxDetector`,
  local VinDr-CXR checkpoint).
"""

from __future__ import annotations

from typing import Any

from cxrground.errors import ConfigError
from cxrground.ils.spatial.base import Box, BoxDetector, NormalSynthesizer
from cxrground.ils.spatial.boxes import (
    KEPT_CLASSES,
    AnomalyBoxDetector,
    YOLOBoxDetector,
    boxes_from_yolo_result,
    normalize_class_name,
)
from cxrground.ils.spatial.normative import NormativeSynthesizer
from cxrground.ils.spatial.pseudo_normal import PseudoNormalSynthesizer, anomaly_map, anomaly_mask
from cxrground.ils.spatial.radedit import RadEditSynthesizer

__all__ = [
    "DETECTORS",
    "KEPT_CLASSES",
    "SYNTHESIZERS",
    "AnomalyBoxDetector",
    "Box",
    "BoxDetector",
    "NormalSynthesizer",
    "NormativeSynthesizer",
    "PseudoNormalSynthesizer",
    "RadEditSynthesizer",
    "YOLOBoxDetector",
    "anomaly_map",
    "anomaly_mask",
    "boxes_from_yolo_result",
    "get_detector",
    "get_synthesizer",
    "normalize_class_name",
]

SYNTHESIZERS: dict[str, type] = {"pseudo-normal": PseudoNormalSynthesizer, "radedit": RadEditSynthesizer}
SYNTHESIZERS["normative"] = NormativeSynthesizer
DETECTORS: dict[str, type] = {"anomaly": AnomalyBoxDetector, "yolo": YOLOBoxDetector}


def _build(kind: str, table: dict[str, type], name: str, kwargs: dict[str, Any]) -> Any:
    if name not in table:
        raise ConfigError(f"unknown {kind} {name!r}; expected one of {', '.join(sorted(table))}")
    try:
        return table[name](**kwargs)
    except TypeError as exc:
        raise ConfigError(f"bad options for the {name} {kind}: {exc}") from exc


def get_synthesizer(name: str = "pseudo-normal", **kwargs: Any) -> NormalSynthesizer:
    """A normal-image synthesizer by name."""
    return _build("synthesizer", SYNTHESIZERS, name, kwargs)


def get_detector(name: str = "anomaly", **kwargs: Any) -> BoxDetector:
    """A box detector by name."""
    return _build("detector", DETECTORS, name, kwargs)
