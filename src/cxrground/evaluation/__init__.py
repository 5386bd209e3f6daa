"""Evaluation stages: ILS segmentation and text metrics (ILS.md §15, :mod:`.ils`) and the CheXpercept harness
(:mod:`.percept`); :mod:`.bootstrap` gives both their confidence intervals."""

from cxrground.evaluation.ils import (
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
