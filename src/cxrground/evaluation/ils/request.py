"""Scoring a predictions file as a request (:class:`EvaluateRequest`) and :func:`evaluate_request`.

Each field documents itself (:func:`cxrground.fields.option`); ``cxrground ils evaluate`` offers one option per
field. The metrics are :func:`cxrground.evaluation.ils.evaluate_dataset`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cxrground.evaluation.ils.dataset import evaluate_dataset
from cxrground.evaluation.ils.report import format_report
from cxrground.fields import check_bounds, option
from cxrground.ils.predictions import SEG_MODES

__all__ = ["EvaluateRequest", "evaluate_request"]


@dataclass(frozen=True, kw_only=True)
class EvaluateRequest:
    """Which predictions to score against which dataset split, how, and where the full result goes."""

    dataset: Path = option(path="existing", help="Dataset folder (mimic_ils_instruction_answer.json + lesion_mask/) "
                           "or the JSON file.")
    predictions: Path = option(path="file", help="Predictions JSONL: {pair_id, answer, mask (COCO RLE) | mask_path "
                               "(PNG)} per line.")
    split: str = option("test", choices=("train", "val", "test", "all"),
                        help="Split to score ('all': every split together).")
    out: Path | None = option(None, path="out_file", help="Write the full result as JSON here.")
    images: Path | None = option(None, path="dir", help="Image root (MIMIC-CXR-JPG files/) to read native sizes; GT "
                                 "masks of another size (e.g. released 512x512) are resized nearest-neighbour to it.")
    n_boot: int = option(1000, flag="--bootstrap", low=0, help="Bootstrap resamples for the 95 % CIs (0 = none).")
    seed: int = option(0, low=0, help="Seed of the bootstrap.")
    limit: int | None = option(None, help="Score only the first N pairs (default: the full split).")
    seg_mode: str = option("unspecified", choices=("unspecified", *SEG_MODES),
                           help="How the masks were produced, stated in the report (teacher-forced | free); default: "
                                "the mode the predictions file records (ils predict --mode).")

    def __post_init__(self) -> None:
        """Refuse values outside their range (:class:`OptionValueError`, a usage error on the command line)."""
        check_bounds(self)


def evaluate_request(request: EvaluateRequest, log: Callable[[str], None]) -> str:
    """Score the predictions, write the full result to ``request.out`` when given, and return the Markdown report;
    progress and the written file are told through ``log``."""
    r = request
    result = evaluate_dataset(r.dataset, r.predictions, split=r.split, limit=r.limit, n_boot=r.n_boot, seed=r.seed,
                              images_root=r.images, seg_mode=r.seg_mode, log=log)
    if r.out is not None:
        r.out.parent.mkdir(parents=True, exist_ok=True)
        r.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
        log(f"wrote {r.out}")
    return format_report(result)
