"""ILS §8 spatial extraction: normal-image synthesis, anomaly map, lesion boxes (interfaces and backends).

Backends by name (``get_synthesizer`` / ``get_detector``):

- synthesizers: ``normative`` (built-in default of ``ils build``, CPU; :class:`NormativeSynthesizer`, a model
  of normal films: by default fitted by ``ils build`` on the build's report-normal studies, or the shipped
  ``normative_v1``), ``pseudo-normal`` (built-in, CPU; :class:`PseudoNormalSynthesizer`, also the
  normative estimate's fallback outside the lungs), ``lesion-unet`` (built-in, CPU;
  :class:`LesionUNetSynthesizer`: the film minus the learned lesion segmenter's lesions), ``radedit``
  (:class:`RadEditSynthesizer`, local weights);
- detectors: ``anomaly`` (built-in, CPU; :class:`AnomalyBoxDetector`), ``yolo`` (:class:`YOLOBoxDetector`,
  local VinDr-CXR checkpoint).
"""

from __future__ import annotations

from typing import Any, Final

from cxrground.anatomy.segment.registry import TORCH_WEIGHTS
from cxrground.ils.spatial.base import Box, BoxDetector, NormalSynthesizer
from cxrground.ils.spatial.boxes import (
    KEPT_CLASSES,
    AnomalyBoxDetector,
    YOLOBoxDetector,
    boxes_from_yolo_result,
    normalize_class_name,
)
from cxrground.ils.spatial.lesion_unet import LesionUNetSynthesizer
from cxrground.ils.spatial.normative import NormativeSynthesizer
from cxrground.ils.spatial.pseudo_normal import PseudoNormalSynthesizer, anomaly_map, anomaly_mask
from cxrground.ils.spatial.radedit import RadEditSynthesizer
from cxrground.registry import Registry

__all__ = [
    "DETECTORS",
    "KEPT_CLASSES",
    "SYNTHESIZERS",
    "AnomalyBoxDetector",
    "Box",
    "BoxDetector",
    "LesionUNetSynthesizer",
    "NormalSynthesizer",
    "NormativeSynthesizer",
    "PseudoNormalSynthesizer",
    "RadEditSynthesizer",
    "YOLOBoxDetector",
    "anomaly_map",
    "anomaly_mask",
    "boxes_from_yolo_result",
    "detector_defaults",
    "get_detector",
    "get_synthesizer",
    "normalize_class_name",
]

#: Normal-image synthesizers by name.
SYNTHESIZERS: Final[Registry[NormalSynthesizer]] = Registry("synthesizer")
SYNTHESIZERS.register("pseudo-normal", PseudoNormalSynthesizer,
                      help="built-in CPU estimate: per-region background fit, coarse excess removed")
SYNTHESIZERS.register("radedit", RadEditSynthesizer, help="RadEdit (diffusers), local model folder (model_dir=DIR)",
                      gpu=True, needs=("diffusers", "transformers", "torch"))
SYNTHESIZERS.register("normative", NormativeSynthesizer,
                      help="built-in CPU normative model of the normal chest: model=cohort (default: fitted on the "
                           "build's report-normal studies; min_normals, max_normals, shrink, trim), model=shipped (NIH "
                           "normal films) or model=NPZ; band, noise_floor")
SYNTHESIZERS.register("lesion-unet", LesionUNetSynthesizer, needs=TORCH_WEIGHTS,
                      help="built-in CPU: the film minus the shipped lesion U-Net's lesions (lungs, not heart or "
                           "mediastinum); pairs checked against its reading; weights=PATH, scale, floor, threads, "
                           "zone_reader=none|zone_sim_v1")

#: Lesion box detectors by name.
DETECTORS: Final[Registry[BoxDetector]] = Registry("detector")
DETECTORS.register("anomaly", AnomalyBoxDetector, help="built-in: components of the anomaly map with a confidence")
DETECTORS.register("yolo", YOLOBoxDetector, help="an ultralytics YOLO VinDr-CXR checkpoint (weights_path=FILE)",
                   gpu=True)


def get_synthesizer(name: str = "pseudo-normal", **kwargs: Any) -> NormalSynthesizer:
    """A normal-image synthesizer by name (options checked by :data:`SYNTHESIZERS`)."""
    return SYNTHESIZERS.create(name, **kwargs)


def detector_defaults(synthesizer: NormalSynthesizer, detector: str) -> dict[str, Any]:
    """Detector settings that go with this synthesizer's anomaly map (the user's detector options override them):
    the normative synthesizer's ``DETECTOR_DEFAULTS`` for the built-in detector, else none."""
    return dict(getattr(synthesizer, "DETECTOR_DEFAULTS", {}).get(detector, {}))


def get_detector(name: str = "anomaly", **kwargs: Any) -> BoxDetector:
    """A box detector by name (options checked by :data:`DETECTORS`)."""
    return DETECTORS.create(name, **kwargs)
