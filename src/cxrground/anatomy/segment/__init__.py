"""Lung/heart segmentation backends behind one interface (:class:`LungHeartSegmenter`).

- ``unet`` (:class:`UNetLungSegmenter`): the shipped lung U-Net (``weights/lung_unet_v2``), trained on the
  pack's shippable rows only; the heart is an ESTIMATE from the lungs (``heart_source="estimate"``).
- ``given`` (:class:`GivenMasksSegmenter`): masks supplied per image (oracle, synthetic truth, pack masks).
- ``cxas`` (:class:`CXASSegmenter`) and ``hybridgnet`` (:class:`HybridGNetSegmenter`): external models the
  user installs / downloads; missing pieces raise :class:`~cxrground.errors.ConfigError`.
- ``masks`` (:class:`MaskFolderSegmenter`): mask PNGs found in a folder by a name pattern.

Backends are registered in :data:`SEGMENTERS` (names, help, option checks); :func:`write_segmentation`
writes the files of ``cxrground segment lungs``.

torch and safetensors are imported only inside the functions that run a network.
"""

from cxrground.anatomy.segment.adapters import CXASSegmenter, HybridGNetSegmenter, decode_landmarks
from cxrground.anatomy.segment.base import HeartSource, LungHeartMasks, LungHeartSegmenter
from cxrground.anatomy.segment.builtin import (
    GivenMasksSegmenter,
    UNetLungSegmenter,
    default_weights_path,
    heart_from_lungs,
    postprocess_lungs,
)
from cxrground.anatomy.segment.heart import HeartEstimateParams, estimate_heart, score_heart_estimates
from cxrground.anatomy.segment.output import SegmentationOutput, write_segmentation
from cxrground.anatomy.segment.registry import SEGMENTERS, WEIGHTS_OPTION, get_segmenter, weights_options

__all__ = [
    "SEGMENTERS",
    "WEIGHTS_OPTION",
    "CXASSegmenter",
    "GivenMasksSegmenter",
    "HeartEstimateParams",
    "HeartSource",
    "HybridGNetSegmenter",
    "LungHeartMasks",
    "LungHeartSegmenter",
    "SegmentationOutput",
    "UNetLungSegmenter",
    "decode_landmarks",
    "default_weights_path",
    "estimate_heart",
    "get_segmenter",
    "heart_from_lungs",
    "postprocess_lungs",
    "score_heart_estimates",
    "weights_options",
    "write_segmentation",
]
