"""Lung/heart segmentation backends behind one interface (:class:`LungHeartSegmenter`)."""

from cxrground.anatomy.segment.base import HeartSource, LungHeartMasks, LungHeartSegmenter

__all__ = ["HeartSource", "LungHeartMasks", "LungHeartSegmenter"]
