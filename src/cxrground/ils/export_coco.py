"""``cxrground ils export --format coco``: an ILS dataset as COCO instance annotations (pycocotools reads them).

Per split with studies, ``annotations/instances_{split}.json``:

- ``images``: one per study (``id``, ``file_name`` = ``image_path``, ``width``, ``height`` of the image's native
  grid, plus ``study_key``, ``dicom_id``, ``subject_id``);
- ``categories``: the seven lesions of :data:`cxrground.vocab.lesions.LESIONS`, ids 1-7 in that order,
  supercategory ``lesion``;
- ``annotations``: one per lesion mask of a study (several pairs may share one mask file): ``segmentation`` as
  compressed COCO RLE on the native grid (a released-frame mask is mapped back with
  :func:`cxrground.ils.frames.mask_on_image`), ``area`` and ``bbox`` ``[x, y, w, h]`` computed by pycocotools,
  ``iscrowd`` 0, ``category_id`` of the mask's lesion, plus ``seg_mask_path`` and the ``pair_ids`` grounded to it.
  An empty mask has no annotation (an empty region would be a zero-area box that lowers COCOeval scores).

``pairs.jsonl`` (the side file): one line per instruction-answer pair of every split, the pair as in the
MIMIC-ILS JSON plus ``split``, ``study_key``, ``image_id`` and ``annotation_id`` (None for a negative pair, and
for a pair whose mask is empty, which also has ``no_annotation: "empty mask"``), so that a detection or
segmentation pipeline joins instructions to its annotations by id.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.errors import InputError
from cxrground.ils.frames import MaskFrame, _native_sizes, mask_on_image, read_frame
from cxrground.ils.layout import DATASET_FILE, MASK_DIR
from cxrground.ils.schema import SPLITS, check_splits, iter_dataset
from cxrground.io.export_dir import export_folder
from cxrground.io.masks import encode_rle, read_mask_png
from cxrground.vocab.lesions import LESIONS

__all__ = ["ANNOTATION_DIR", "CATEGORIES", "COCO_NAMES", "EMPTY_MASK", "NO_ANNOTATION", "PAIRS_FILE", "export_coco"]

ANNOTATION_DIR: Final[str] = "annotations"
PAIRS_FILE: Final[str] = "pairs.jsonl"
#: The ``pairs.jsonl`` field that says why a pair with a mask has no annotation, and its value for an empty mask.
NO_ANNOTATION: Final[str] = "no_annotation"
EMPTY_MASK: Final[str] = "empty mask"
#: What a coco export writes at its top (what ``overwrite`` may replace).
COCO_NAMES: Final[tuple[str, ...]] = (ANNOTATION_DIR, PAIRS_FILE)
#: COCO categories: the seven lesions, ids 1..7 in the paper's table order.
CATEGORIES: Final[list[dict[str, Any]]] = [{"id": i, "name": lesion, "supercategory": "lesion"}
                                           for i, lesion in enumerate(LESIONS, start=1)]
_CATEGORY_ID: Final[dict[str, int]] = {c["name"]: c["id"] for c in CATEGORIES}
#: The study fields the export writes (a study without them is refused).
_STUDY_FIELDS: Final[tuple[str, ...]] = ("image_path", "dicom_id", "subject_id")


def _annotation(ann_id: int, image_id: int, lesion: str, mask: np.ndarray, rel: str) -> dict[str, Any]:
    from pycocotools import mask as coco_mask

    rle = encode_rle(mask)
    coded = {"size": rle["size"], "counts": rle["counts"].encode("ascii")}
    return {"id": ann_id, "image_id": image_id, "category_id": _CATEGORY_ID[lesion], "segmentation": rle,
            "area": float(coco_mask.area(coded)), "bbox": [float(v) for v in coco_mask.toBbox(coded)],
            "iscrowd": 0, "seg_mask_path": rel, "pair_ids": []}


def _write(json_path: Path, sizes: dict[str, tuple[int, int]], mask_root: Path, frame: MaskFrame,
           dest: Path) -> dict[str, int]:
    """Write the annotation files and the pair side file of the dataset ``json_path`` (read as a stream, split by
    split) into the folder ``dest``; returns counts."""
    (dest / ANNOTATION_DIR).mkdir()
    counts = {"images": 0, "annotations": 0, "pairs": 0, "empty_masks": 0}
    image_id = ann_id = 0
    with (dest / PAIRS_FILE).open("w", encoding="utf-8") as pair_file:
        for split in SPLITS:
            coco: dict[str, Any] = {"info": {"description": f"ILS dataset {json_path.parent.name}, split {split}",
                                             "version": "1.0"},
                                    "licenses": [], "images": [], "annotations": [], "categories": CATEGORIES}
            for _split, key, study in iter_dataset(json_path, _STUDY_FIELDS, splits=(split,)):
                image_id += 1
                hw = sizes.get(study["image_path"])
                if hw is None:
                    raise InputError(f"{split}.{key}: size of {study['image_path']} unknown; pass --images",
                                     json_path)
                coco["images"].append({"id": image_id, "file_name": study["image_path"], "height": hw[0],
                                       "width": hw[1], "study_key": key, "dicom_id": study["dicom_id"],
                                       "subject_id": study["subject_id"]})
                by_mask: dict[str, dict[str, Any] | None] = {}
                pairs = study["instruction_answer_pairs"]
                for polarity in ("positive", "negative"):
                    for pair in pairs.get(f"{polarity}_pairs", []):
                        ann = None
                        rel = pair.get("seg_mask_path")
                        if rel is not None:
                            if rel not in by_mask:
                                mask = mask_on_image(read_mask_png(mask_root / rel), hw, frame, mask_root / rel)
                                if mask.any():
                                    ann_id += 1
                                    by_mask[rel] = _annotation(ann_id, image_id, pair["target"], mask, rel)
                                    coco["annotations"].append(by_mask[rel])
                                else:
                                    by_mask[rel] = None
                                    counts["empty_masks"] += 1
                            ann = by_mask[rel]
                            if ann is not None:
                                ann["pair_ids"].append(pair["pair_id"])
                        line = {**pair, "split": split, "study_key": key, "image_id": image_id,
                                "annotation_id": None if ann is None else ann["id"]}
                        if rel is not None and ann is None:
                            line[NO_ANNOTATION] = EMPTY_MASK
                        pair_file.write(json.dumps(line, ensure_ascii=False) + "\n")
                        counts["pairs"] += 1
            if coco["images"]:  # a split without studies has no annotation file
                (dest / ANNOTATION_DIR / f"instances_{split}.json").write_text(json.dumps(coco), encoding="utf-8")
                counts["images"] += len(coco["images"])
                counts["annotations"] += len(coco["annotations"])
    return counts


def export_coco(dataset: str | Path, out: str | Path, images: str | Path | None = None, *, overwrite: bool = False
                ) -> dict[str, int]:
    """Write ``dataset`` as COCO annotations + ``pairs.jsonl`` in ``out`` (module docstring); returns counts.

    Image sizes come from the dataset (its frame record, native masks, ``anatomy.jsonl``) or, when given, from
    the images under ``images``; a study whose size is unknown is an error naming it. ``out`` must be empty or,
    with ``overwrite``, hold an earlier coco export, which is replaced (:mod:`cxrground.io.export_dir`).
    """
    from cxrground.io.image import read_image

    dataset = Path(dataset)
    json_path = dataset if dataset.is_file() else dataset / DATASET_FILE
    if not json_path.is_file():
        raise InputError(f"no {DATASET_FILE} here", dataset)
    out = Path(out)
    check_splits(json_path)
    mask_root = json_path.parent / MASK_DIR
    frame = read_frame(json_path)
    size_of: Callable[[str], tuple[int, int]] | None = (
        None if images is None else (lambda rel: read_image(Path(images) / rel).shape))
    sizes = _native_sizes(iter_dataset(json_path, _STUDY_FIELDS), mask_root, frame, json_path.parent, size_of)
    with export_folder(out, overwrite, COCO_NAMES, "coco") as stage:
        counts = _write(json_path, sizes, mask_root, frame, stage)
    return counts
