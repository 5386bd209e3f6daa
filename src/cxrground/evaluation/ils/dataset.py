"""Whole-dataset ILS evaluation (:func:`evaluate_dataset`): one predictions file scored on one split.

A pair without a prediction is never dropped: it is listed and scored wrong (IoU 0 on a positive, "not
empty" on a negative, text wrong); ``"mask": null`` on a negative pair is an empty prediction. ``split="all"``
scores every split together. Masks are compared at each image's native ``H×W`` (GT masks of another
size are resized nearest-neighbour to the native size, which is read from ``images_root`` or the study's
``height``/``width`` fields when given, else taken from the study's GT masks — right for our generator,
which writes native-size masks).

Predictions made for another dataset are refused (pair ids repeat between datasets, e.g. the same cohort built with
another seed, and the pairs behind them differ): those whose ``<file>.checkpoint.json`` names a dataset JSON of
another sha256, and, without that record (a hand-made file), those whose lines record an ``instruction`` other than
the dataset's for the same pair id (:func:`check_predictions_fit`). Lines without an instruction are not checked.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.errors import InputError, MaskShapeError
from cxrground.evaluation.ils.segmentation import SegmentationMetric
from cxrground.evaluation.ils.text import TextAccuracyMetric
from cxrground.ils.frames import read_frame
from cxrground.ils.layout import DATASET_FILE, MASK_DIR
from cxrground.ils.predictions import (
    Prediction,
    instruction_mismatches,
    load_predictions,
    other_dataset,
    read_source,
    resolve_seg_mode,
    source_path,
    unused_reasons,
)
from cxrground.ils.schema import SPLITS, dataset_splits, iter_dataset, read_dataset
from cxrground.io.files import sha256_file
from cxrground.io.masks import check_shape, read_mask_png

__all__ = ["ALL_SPLITS", "check_predictions_fit", "evaluate_dataset", "unused_why"]

#: The ``split`` value that scores every split of the dataset together.
ALL_SPLITS = "all"


def _resize_nearest(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    im = Image.fromarray(mask.astype(np.uint8) * 255, mode="L")
    return np.asarray(im.resize((shape[1], shape[0]), Image.Resampling.NEAREST)) > 0


def _image_size(path: Path) -> tuple[int, int]:
    from PIL import Image, UnidentifiedImageError

    from cxrground.io.image import exif_orientation, is_dicom, read_image

    if not path.is_file():
        raise InputError("image not found (needed for the native size)", path)
    if not is_dicom(path):
        try:
            with Image.open(path) as im:  # the size read_image gives: sides swapped for a film stored turned
                turned = (exif_orientation(im) or 0) >= 5
                return (int(im.width), int(im.height)) if turned else (int(im.height), int(im.width))
        except (OSError, UnidentifiedImageError):
            pass
    return read_image(path).shape


def _locate(dataset_dir: str | Path) -> tuple[Path, Path]:
    p = Path(dataset_dir)
    if p.is_file():
        return p, p.parent / MASK_DIR
    return p / DATASET_FILE, p / MASK_DIR


def evaluate_dataset(
    dataset_dir: str | Path,
    predictions_path: str | Path,
    split: str = "test",
    limit: int | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    images_root: str | Path | None = None,
    seg_mode: str = "unspecified",
    log: Callable[[str], None] | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Score a predictions JSONL file (see :mod:`cxrground.ils.predictions`) on one split.

    Every pair of the split (or the first ``limit`` pairs in file order, when given) is scored;
    pairs without a prediction are counted wrong and listed under ``missing``. ``seg_mode`` records
    how the masks were produced (``teacher-forced`` / ``free``), as reports must state it; the mode the predictions
    file records is used when none is stated, and a stated mode contradicting it is an error. ``data``: the
    dataset as :func:`~cxrground.ils.schema.read_dataset` gives it (None: read and checked here, only the split
    scored when it is one split).
    """
    json_path, mask_root = _locate(dataset_dir)
    if data is None:
        data = read_dataset(json_path, splits=None if split == ALL_SPLITS else (split,))
        names = list(data) if split == ALL_SPLITS or split in data else dataset_splits(json_path)
    else:
        names = list(data)
    frame = read_frame(json_path)  # released-frame masks map back to the recorded native sizes
    if split != ALL_SPLITS and split not in data:
        raise InputError(f"split {split!r} not in the dataset (has {', '.join(names) or 'none'})", json_path)
    studies = [s for name in (data if split == ALL_SPLITS else [split]) for s in data[name].values()]
    preds = load_predictions(predictions_path)
    seg_mode = resolve_seg_mode(seg_mode, preds, predictions_path)
    check_predictions_fit(preds, predictions_path, json_path, studies, split)
    seg = SegmentationMetric(n_boot=n_boot, seed=seed)
    text = TextAccuracyMetric()
    evaluated: list[str] = []
    missing: list[str] = []
    missing_mask: list[str] = []
    missing_answer: list[str] = []
    resized_from: set[tuple[int, int]] = set()  # GT mask sizes scaled to the native size
    for study in studies:
        if limit is not None and len(evaluated) >= limit:
            break
        pairs = study["instruction_answer_pairs"]
        items = [(p, True) for p in pairs.get("positive_pairs", [])]
        items += [(p, False) for p in pairs.get("negative_pairs", [])]
        if limit is not None:
            items = items[: limit - len(evaluated)]
        native: tuple[int, int] | None = None
        if images_root is not None:
            native = _image_size(Path(images_root) / study["image_path"])
        elif isinstance(study.get("height"), int) and isinstance(study.get("width"), int):
            native = (study["height"], study["width"])
        elif (recorded := frame.native_of(study["image_path"])) is not None:
            native = recorded
        native_known = native is not None
        for pair, is_pos in items:
            pid = pair["pair_id"]
            if is_pos:
                gt = read_mask_png(mask_root / pair["seg_mask_path"])
                if native is None:
                    native = (int(gt.shape[0]), int(gt.shape[1]))
                elif gt.shape != native:
                    if not native_known:  # masks of one study must share the image's size
                        check_shape(gt, native, f"GT mask of pair {pid}", mask_root / pair["seg_mask_path"])
                    resized_from.add((int(gt.shape[0]), int(gt.shape[1])))
                    gt = _resize_nearest(gt, native)
            pred: Prediction | None = preds.get(pid)
            try:
                pred_mask = pred.mask_array(native) if pred is not None else None
            except MaskShapeError as exc:
                if native_known:
                    raise
                raise exc.with_reason(f"{exc.reason}; the size expected is that of the dataset's GT masks, as neither "
                                      "--images nor the dataset records the image's native size (a released-frame "
                                      "dataset without its mask_frame.json?): give --images to score at the native "
                                      "size") from None
            if not is_pos:
                shape = native or (pred_mask.shape if pred_mask is not None else (1, 1))
                gt = np.zeros(shape, bool)
                if pred is not None and pred.null_mask:
                    pred_mask = np.zeros(shape, bool)
            if pred is None:
                missing.append(pid)
            else:
                if pred_mask is None:
                    missing_mask.append(pid)
                if pred.answer is None:
                    missing_answer.append(pid)
            seg.update(pid, pred_mask, gt, pair["target"], pair["type"])
            text.update(pid, pair["instruction"], pair["answer"], pred.answer if pred else None, pair["target"])
            evaluated.append(pid)
    if preds and evaluated and len(missing) == len(evaluated):
        why = unused_why(json_path, list(preds), split, len(evaluated))
        raise InputError(f"none of the {len(evaluated)} pairs of split {split} has a prediction here ({why}): "
                         "nothing to score; give the split the predictions were made for (--split)", predictions_path)
    seg_result = seg.aggregate()
    text_result = text.aggregate()
    counts = {
        t: {"positive": v["positive"]["n"], "negative": v["negative"]["n"]}
        for t, v in seg_result["per_type"].items()
    }
    result = {
        "dataset": str(json_path),
        "predictions": str(predictions_path),
        "split": split,
        "limit": limit,
        "seg_mode": seg_mode,
        "mask_frame": frame.frame if not resized_from or frame.frame != "native" else
        "other sizes (" + ", ".join(f"{w}x{h}" for h, w in sorted(resized_from)) + ") resized to native, nearest",
        "n_pairs": len(evaluated),
        "counts": counts,
        "n_predictions_unused": len(set(preds) - set(evaluated)),
        "missing": missing,
        "missing_mask": missing_mask,
        "missing_answer": missing_answer,
        "segmentation": seg_result,
        "text": text_result,
    }
    if log is not None:
        log(_counts_line(result))
    return result


def check_predictions_fit(preds: dict[str, Prediction], predictions_path: str | Path, json_path: Path,
                          studies: list[dict[str, Any]], split: str) -> None:
    """Refuse (:class:`InputError` naming the predictions file and the dataset) predictions made for another
    dataset: their record (``<file>.checkpoint.json``) names a dataset JSON of another sha256, or, without a record
    naming one, a line records another instruction than ``studies`` (the scored ones) give its pair id."""
    pairs = [p for study in studies for kind in ("positive_pairs", "negative_pairs")
             for p in study["instruction_answer_pairs"].get(kind, [])]
    differ = instruction_mismatches(preds, pairs)
    record = read_source(predictions_path) or {}
    other = other_dataset(record, json_path, sha256_file(json_path)) if "dataset_sha256" in record else None
    if other is None and ("dataset_sha256" in record or not differ):
        return
    shared = sum(1 for p in pairs if p["pair_id"] in preds)
    if differ:
        pair = next(p for p in pairs if p["pair_id"] == differ[0])
        which = (f"{len(differ)} of its {shared} predictions for pairs of split {split} were made for another "
                 f"instruction (e.g. {differ[0]}: {preds[differ[0]].instruction!r}; here {pair['instruction']!r})")
    else:
        which = (f"its {shared} predictions for pairs of split {split} share this dataset's pair ids, but their "
                 "lines record no instruction to compare the pairs by")
    fix = "predict this dataset's split (ils predict)"
    if other is not None:
        fix += (f", or, for a dataset rewritten with the same pairs, remove {source_path(predictions_path).name} so "
                "the instructions each line records are checked instead")
        raise InputError(f"holds predictions of {other}: {which}; nothing scored: {fix}", predictions_path)
    raise InputError(f"holds predictions of another dataset than {json_path}: {which}; nothing scored: {fix}",
                     predictions_path)


def unused_why(dataset: str | Path, predicted: list[str], split: str, n_scored: int) -> str:
    """Why the ``predicted`` pair ids went unscored when the first ``n_scored`` pairs of ``split`` were scored
    (:func:`~cxrground.ils.predictions.unused_reasons`; the dataset read again as a stream, its splits in file order
    as ``split="all"`` scores them), e.g. "46 pairs of split test"; a dataset whose other splits cannot be read
    leaves the why untold and says so."""
    try:
        order = [s for s in dataset_splits(dataset) if s in SPLITS] if split == ALL_SPLITS else SPLITS
        studies = ((name, study) for name, _key, study in iter_dataset(dataset, (), splits=order))
        reasons = unused_reasons(studies, predicted, split, n_scored)
    except InputError as exc:
        return f"why could not be told: {exc}"
    return "; ".join(f"{n} {reason}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]))


def _counts_line(result: dict[str, Any]) -> str:
    parts = [f"{t}: {c['positive']} pos / {c['negative']} neg" for t, c in result["counts"].items()]
    return (f"evaluated {result['n_pairs']} pairs of split {result['split']} ({'; '.join(parts)}); "
            f"missing predictions: {len(result['missing'])}")
