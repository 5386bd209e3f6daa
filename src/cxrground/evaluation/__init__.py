"""Evaluation stages: ILS segmentation and text metrics (ILS.md §15)."""

from cxrground.evaluation.ils_metrics import (
    SegmentationMetric,
    TextAccuracyMetric,
    evaluate_dataset,
    format_report,
    parse_answer,
)
from cxrground.ils.predictions import Prediction, load_predictions

__all__ = [
    "Prediction",
    "SegmentationMetric",
    "TextAccuracyMetric",
    "evaluate_dataset",
    "format_report",
    "load_predictions",
    "parse_answer",
]
