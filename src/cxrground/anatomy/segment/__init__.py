"""Lung/heart segmentation backends behind one interface (:class:`LungHeartSegmenter`).

- ``unet`` (:class:`UNetLungSegmenter`): the shipped lung U-Net (``weights/lung_unet_v1``), trained on the
  pack's shippable rows only; the heart is an ESTIMATE from the lungs (``heart_source="estimate"``).
- ``given`` (:class:`GivenMasksSegmenter`): masks supplied per image (oracle, synthetic truth, pack masks).
- ``cxas`` (:class:`CXASSegmenter`) and ``hybridgnet`` (:class:`HybridGNetSegmenter`): external models the
  user installs / downloads; missing pieces raise :class:`~cxrground.errors.ConfigError`.

torch and safetensors are imported only inside the functions that run a network.
"""

from cxrground.anatomy.segment.adapters import CXASSegmenter, HybridGNetSegmenter, decode_landmarks
from cxrground.anatomy.segment.base import HeartSource, LungHeartMasks, LungHeartSegmenter
from cxrground.anatomy.segment.builtin import (
    GivenMasksSegmenter,
    UNetLungSegmenter,
    default_weights_path,
    postprocess_lungs,
)
from cxrground.anatomy.segment.heart import HeartEstimateParams, estimate_heart, score_heart_estimates
from cxrground.anatomy.segment.registry import SEGMENTERS, get_segmenter

__all__ = [
    "SEGMENTERS",
    "CXASSegmenter",
    "GivenMasksSegmenter",
    "HeartEstimateParams",
    "HeartSource",
    "HybridGNetSegmenter",
    "LungHeartMasks",
    "LungHeartSegmenter",
    "UNetLungSegmenter",
    "decode_landmarks",
    "default_weights_path",
    "estimate_heart",
    "get_segmenter",
    "postprocess_lungs",
    "score_heart_estimates",
]
