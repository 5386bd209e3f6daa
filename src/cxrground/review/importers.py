"""Review items from an ILS dataset folder (one item per instruction-answer pair) or a CheXpercept benchmark
(one item per case, one decision part per question as the model is asked it).

Both give item dicts for :meth:`cxrground.review.db.ReviewDB.add_items`. Every image is located, checked to
exist (benchmark images also to lie inside the benchmark folder) and measured here, at import time; the server
later reads only these stored paths. ``--sample N`` draws N items without replacement with a NumPy generator
seeded by ``--seed`` and keeps them in dataset order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.errors import InputError, OptionError
from cxrground.evaluation.percept.conversation import plan_case, safe_image_path
from cxrground.fields import option
from cxrground.ils.layout import DATASET_FILE, MASK_DIR
from cxrground.ils.schema import SPLITS, load_dataset
from cxrground.io.image import read_image
from cxrground.io.masks import encode_rle, read_mask_png
from cxrground.percept.cases import key_id
from cxrground.percept.schema import load_benchmark
from cxrground.reports.sentences import parse_numbered

__all__ = ["STAGE_TITLES", "ImportRequest", "bench_items", "ils_items", "import_items", "import_request",
           "sample_items"]

#: Part labels shown on the case page, by the harness's question id.
STAGE_TITLES = {
    "detection": "Stage 1: detection", "contour_eval": "Stage 2: contour evaluation",
    "expansion": "Stage 3a: expansion points", "contraction": "Stage 3b: contraction points",
    "revision_result": "Stage 3c: revision result", "distribution": "Stage 4: distribution",
    "location": "Stage 4: location", "severity": "Stage 4: severity/measurement", "comparison": "Stage 4: comparison",
}


def sample_items(items: Sequence[dict[str, Any]], n: int | None, seed: int) -> list[dict[str, Any]]:
    """``n`` items drawn without replacement (seeded), in their original order; all when ``n`` is None."""
    if n is None or n >= len(items):
        return list(items)
    if n < 1:
        raise ValueError(f"--sample must be at least 1, got {n}")
    keep = sorted(np.random.default_rng(seed).choice(len(items), size=n, replace=False).tolist())
    return [items[i] for i in keep]


def _sentence(section_content: str, sent_idx: str | None) -> str:
    """The numbered report sentence ``sent_idx`` (empty when absent or when the section is not numbered)."""
    if not sent_idx:
        return ""
    try:
        numbered = parse_numbered(section_content)
    except ValueError:
        return ""
    return next((text for k, text in numbered if str(k) == str(sent_idx)), "")


def ils_items(ils_dir: str | Path, images: str | Path, splits: Sequence[str] = SPLITS) -> list[dict[str, Any]]:
    """One item per pair of the chosen splits: image, instruction, answer, report sentence, generated mask."""
    ils_dir, images = Path(ils_dir).resolve(), Path(images).resolve()
    data = load_dataset(ils_dir / DATASET_FILE)
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise InputError(f"unknown split(s) {unknown}; expected {', '.join(SPLITS)}", ils_dir)
    out: list[dict[str, Any]] = []
    for split in splits:
        for study_key, study in (data.get(split) or {}).items():
            image = images / study["image_path"]
            if not image.is_file():
                raise InputError(f"image of {study_key} not found under the --images folder", image)
            h, w = read_image(image).shape
            pairs = study["instruction_answer_pairs"]
            for positive, group in ((True, pairs.get("positive_pairs", [])), (False, pairs.get("negative_pairs", []))):
                for p in group:
                    mask = None
                    if positive:
                        mask = encode_rle(read_mask_png(ils_dir / MASK_DIR / p["seg_mask_path"], shape=(h, w)))
                    out.append({
                        "kind": "ils", "key": key_id(p["target"], p["pair_id"]), "lesion": p["target"],
                        "item_type": f"{p['type']} {'positive' if positive else 'negative'}", "positive": positive,
                        "source": str(ils_dir), "height": h, "width": w,
                        "images": [{"path": str(image), "role": "cxr", "label": "CXR"}], "mask": mask,
                        "payload": {
                            "pair_id": p["pair_id"], "study": study_key, "split": split, "dicom_id": study["dicom_id"],
                            "instruction": p["instruction"], "answer": p["answer"], "type": p["type"],
                            "locations": p.get("grounded_location") or p.get("location") or [],
                            "sentence": _sentence(study.get("section_content", ""), p.get("sent_idx")),
                            "section_name": study.get("section_name", ""),
                            "section_content": study.get("section_content", ""),
                            "seg_mask_path": p.get("seg_mask_path"), "parts": ["pair"]},
                    })
    return out


def _size(root: Path, rel: str) -> tuple[int, int]:
    from PIL import Image

    path = safe_image_path(root, rel)
    try:
        with Image.open(path) as im:
            return int(im.height), int(im.width)
    except OSError as exc:
        raise InputError(f"benchmark image unreadable ({exc})", path) from exc


def bench_items(bench_dir: str | Path) -> list[dict[str, Any]]:
    """One item per case; its questions as the model is asked them (text, images, options) with the key."""
    bench = load_benchmark(bench_dir)
    root = Path(bench.root or bench_dir).resolve()
    out: list[dict[str, Any]] = []
    for key, case in bench.cases.items():
        plan = plan_case(key, case)
        images: list[dict[str, str]] = []
        index: dict[str, int] = {}
        questions = []
        for q in plan.questions:
            refs = []
            for rel in q.images:
                if rel not in index:
                    path = safe_image_path(root, rel)
                    if not path.is_file():
                        raise InputError(f"case {key}: image {rel!r} not found", root)
                    index[rel] = len(images)
                    images.append({"path": str(path.resolve()), "role": "png", "label": Path(rel).name})
                refs.append(index[rel])
            questions.append({"part": q.qid, "title": STAGE_TITLES.get(q.qid, q.qid), "stage": q.stage,
                              "prefix": q.prefix, "question": q.text, "options": list(q.options),
                              "answer_index": list(q.gt), "answer": [q.options[i - 1] for i in q.gt],
                              "images": refs})
        h, w = case.image_size or _size(root, plan.questions[0].images[0])
        out.append({
            "kind": "bench", "key": key, "lesion": plan.lesion, "item_type": plan.path,
            "positive": plan.path != "LF", "source": str(root), "height": int(h), "width": int(w),
            "images": images, "mask": None,
            "payload": {"pair_id": case.pair_id, "dicom_id": case.dicom_id, "case_id": case.case_id or key,
                        "path": plan.path, "questions": questions, "parts": [q.qid for q in plan.questions]},
        })
    return out


def import_items(db: Any, items: Sequence[dict[str, Any]], sample: int | None, seed: int,
                 per_item: int) -> dict[str, int]:
    """Sample ``items``, add the new ones to ``db`` and give each to ``per_item`` reviewers; returns counts."""
    chosen = sample_items(items, sample, seed)
    ids = db.add_items(chosen)
    made = db.assign(ids, per_item)
    return {"found": len(items), "sampled": len(chosen), "added": len(ids), "already_there": len(chosen) - len(ids),
            "assignments": made}


@dataclass(frozen=True, kw_only=True)
class ImportRequest:
    """What to import into a review database (an ILS dataset or a benchmark), how much, and for how many reviewers
    (each field documents itself, :func:`cxrground.fields.option`; ``cxrground review import`` offers them)."""

    ils_dir: Path | None = option(None, flag="--ils", path="dir",
                                  help="An ILS dataset folder: one item per instruction-answer pair.")
    images: Path | None = option(None, path="dir",
                                 help="With --ils: the image root its image_path values are relative to.")
    splits: tuple[str, ...] = option((), flag="--split", choices=("train", "val", "test"),
                                     help="With --ils: splits to import (repeatable; default all).")
    bench_dir: Path | None = option(None, flag="--bench", path="dir", help="A CheXpercept benchmark folder: one item "
                                    "per case, one decision per question.")
    sample: int | None = option(None, low=1, help="Import N items drawn at random (seeded).")
    seed: int = option(0)
    per_item: int = option(2, low=1, help="Reviewers per item (K); needs at least K reviewers in the database.")


def import_request(db_path: Path, request: ImportRequest) -> str:
    """Import the request's items into the database at ``db_path`` (new ones only) and assign them; returns the
    counts as one line. Neither or both of ``ils_dir`` and ``bench_dir``, or ``ils_dir`` without ``images``, is an
    :class:`OptionError`."""
    from cxrground.review.db import ReviewDB

    r = request
    if (r.ils_dir is None) == (r.bench_dir is None):
        raise OptionError("give exactly one of --ils DIR or --bench DIR")
    if r.ils_dir is not None and r.images is None:
        raise OptionError("--ils needs --images (the folder the dataset's image_path values are relative to)")
    db = ReviewDB(db_path)
    items = ils_items(r.ils_dir, r.images, r.splits or SPLITS) if r.ils_dir is not None else bench_items(r.bench_dir)
    counts = import_items(db, items, r.sample, r.seed, r.per_item)
    return (f"{counts['found']} items found, {counts['sampled']} sampled, {counts['added']} added "
            f"({counts['already_there']} already there), {counts['assignments']} assignments")
