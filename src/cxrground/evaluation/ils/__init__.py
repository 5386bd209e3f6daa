"""ILS evaluation (ILS.md §15): segmentation gIoU / cIoU / N-Acc / Dice and templated-text accuracy.

Modules: :mod:`.answers` (§15.2 answer parsing), :mod:`.segmentation` (§15.1 :class:`SegmentationMetric`),
:mod:`.text` (§15.2 :class:`TextAccuracyMetric`), :mod:`.dataset` (:func:`evaluate_dataset`, a predictions
file on one split at native resolution), :mod:`.report` (:func:`format_report`, Markdown). The metrics are
cumulative objects in the MONAI style (``update`` per pair, ``aggregate`` at the end); bootstrap CIs come
from :func:`cxrground.evaluation.bootstrap.bootstrap_ci`.
"""

from cxrground.evaluation.ils.answers import NOT_EXTRACTED, ParsedAnswer, clean_answer, parse_answer, question_type
from cxrground.evaluation.ils.dataset import evaluate_dataset
from cxrground.evaluation.ils.report import format_report
from cxrground.evaluation.ils.segmentation import SegmentationMetric, sample_iou
from cxrground.evaluation.ils.text import TextAccuracyMetric

__all__ = [
    "NOT_EXTRACTED",
    "ParsedAnswer",
    "SegmentationMetric",
    "TextAccuracyMetric",
    "clean_answer",
    "evaluate_dataset",
    "format_report",
    "parse_answer",
    "question_type",
    "sample_iou",
]
