"""Review items from an ILS dataset folder (one item per instruction-answer pair) or a CheXpercept benchmark
(one item per case, one decision part per question as the model is asked it).

Both give item dicts for :meth:`cxrground.review.db.ReviewDB.add_items`. Every image is located, checked to
exist (benchmark images also to lie inside the benchmark folder) and measured here, at import time; the server
later reads only these stored paths. An ILS item records its film's view (PA, AP, LATERAL, ...) from the film's
DICOM header, the study's ``view`` field or the build's unit record, the first that has one (else it is unknown); a
benchmark records no view per case (unknown). ``--sample N`` draws N items without replacement with a NumPy generator
seeded by ``--seed`` and keeps them in dataset order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.errors import Failure, InputError, OptionError, first_failure
from cxrground.evaluation.percept.conversation import plan_case, safe_image_path
from cxrground.fields import option
from cxrground.ils.frames import MaskFrame, mask_on_image, read_frame
from cxrground.ils.layout import MASK_DIR, UNITS_DIR
from cxrground.ils.schema import SPLITS, dataset_location, read_dataset
from cxrground.io.files import atomic_write_text
from cxrground.io.image import load_pixels, read_image
from cxrground.io.masks import encode_rle, read_mask_png
from cxrground.percept.cases import key_id
from cxrground.percept.paths import unsafe_reason
from cxrground.percept.schema import load_benchmark
from cxrground.reports.sentences import parse_numbered
from cxrground.vocab.views import BENCH_VIEW

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


def _inside(root: Path, rel: str, what: str, where: Path) -> Path:
    """``root/rel`` when ``rel`` stays inside ``root`` (no absolute path, no ``..``, no symlink out)."""
    reason = unsafe_reason(root, rel)
    if reason is not None:
        reason = reason.replace("the benchmark folder", str(root))
        raise InputError(f"{what} {rel!r} {reason}; refusing to read it", where)
    return root / rel


def _mapping(value: Any, what: str, where: Path) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{what} must be a JSON object, got {type(value).__name__}", where)
    return value


def ils_items(ils_dir: str | Path, images: str | Path, splits: Sequence[str] = SPLITS,
              failures: list[Failure] | None = None) -> list[dict[str, Any]]:
    """One item per pair of the chosen splits: image, instruction, answer, report sentence, generated mask.
    ``ils_dir``: the dataset folder or its JSON file (each item's source is the folder).

    Image paths must lie inside ``images`` and mask paths inside the dataset's mask folder; a malformed dataset
    (not an object, a study without pairs, a pair without its fields, a field of another type: the shared check
    :func:`~cxrground.ils.schema.read_dataset`) is an :class:`InputError` naming the file and the record. A study
    whose film is missing or unreadable, or one of whose masks is, is left out and recorded in ``failures`` (given:
    the others are imported; when no study is left the first study's error is raised), else its error is raised."""
    (ils_dir, dataset_file), images = dataset_location(Path(ils_dir).resolve()), Path(images).resolve()
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise InputError(f"unknown split(s) {unknown}; expected {', '.join(SPLITS)}", ils_dir)
    data = read_dataset(dataset_file, ("image_path", "dicom_id"), splits=splits)
    frame = read_frame(ils_dir)  # released-frame masks are mapped back to each film's grid
    out: list[dict[str, Any]] = []
    left_out: list[tuple[_UnreadableFile, str]] = []
    for split in splits:
        for study_key, study in _mapping(data.get(split) or {}, f"split {split!r}", dataset_file).items():
            try:
                out.extend(_study_items(dataset_file, images, split, study_key, study, frame))
            except (KeyError, TypeError, AttributeError) as exc:
                raise InputError(f"study {study_key} of split {split} is malformed ({type(exc).__name__}: {exc})",
                                 dataset_file) from exc
            except _UnreadableFile as exc:
                if failures is None:
                    raise exc.error from None
                left_out.append((exc, study_key))
    if left_out and not out:
        raise left_out[0][0].error
    if failures is not None:
        failures.extend(Failure(exc.error.path or str(dataset_file), "review-import",
                                f"study {key}: {exc.error.reason}", type(exc.error).__name__)
                        for exc, key in left_out)
    return out


class _UnreadableFile(Exception):
    """A study's film or mask cannot be read (:func:`ils_items` leaves the study out); ``error`` says why."""

    def __init__(self, error: InputError) -> None:
        super().__init__(str(error))
        self.error = error


def _unit_record(ils_dir: Path, study_key: str) -> dict[str, Any]:
    """The study's unit record in the build folder (empty when the folder holds no readable one: a dataset copied
    without its build)."""
    unit = ils_dir / UNITS_DIR / f"{study_key}.json"
    try:
        record = json.loads(unit.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _pose_warning(unit: dict[str, Any]) -> dict[str, Any] | None:
    """The pose reader's warning about the study's film from its unit record (None when the film was not flagged)."""
    warning = unit.get("pose_warning")
    return warning if isinstance(warning, dict) and isinstance(warning.get("correction"), str) else None


def _view(*candidates: Any) -> str | None:
    """The first recorded view among ``candidates`` (the film's DICOM header, the study record, the build's unit
    record), upper case; None when none records one."""
    return next((str(v).strip().upper() for v in candidates if isinstance(v, str) and v.strip()), None)


def _study_items(dataset_file: Path, images: Path, split: str, study_key: str, study: Any,
                 frame: MaskFrame) -> list[dict[str, Any]]:
    ils_dir = dataset_file.parent
    study = _mapping(study, f"study {study_key}", dataset_file)
    image = _inside(images, str(study["image_path"]), f"image_path of {study_key}", dataset_file)
    if not image.is_file():
        raise _UnreadableFile(InputError(f"image of {study_key} not found under the --images folder", image))
    try:
        film = read_image(image)
    except InputError as exc:
        raise _UnreadableFile(exc) from exc
    h, w = film.shape
    unit = _unit_record(ils_dir, study_key)
    pose = _pose_warning(unit)
    view = _view(film.view, study.get("view"), unit.get("view"))
    pairs = _mapping(study["instruction_answer_pairs"], f"instruction_answer_pairs of {study_key}",
                     dataset_file)
    out: list[dict[str, Any]] = []
    for positive, group in ((True, pairs.get("positive_pairs", [])), (False, pairs.get("negative_pairs", []))):
        for p in group:
            mask = None
            if positive:
                mask_path = _inside(ils_dir / MASK_DIR, str(p["seg_mask_path"]),
                                    f"seg_mask_path of {p['pair_id']}", dataset_file)
                try:
                    mask = encode_rle(mask_on_image(read_mask_png(mask_path), (h, w), frame, mask_path))
                except InputError as exc:
                    raise _UnreadableFile(exc) from exc
            out.append({
                "kind": "ils", "key": key_id(p["target"], p["pair_id"]), "lesion": p["target"],
                "item_type": f"{p['type']} {'positive' if positive else 'negative'}", "positive": positive,
                "source": str(ils_dir), "height": h, "width": w,
                "images": [{"path": str(image.resolve()), "role": "cxr", "label": "CXR"}], "mask": mask, "view": view,
                "payload": {
                    "pair_id": p["pair_id"], "study": study_key, "split": split, "dicom_id": study["dicom_id"],
                    "instruction": p["instruction"], "answer": p["answer"], "type": p["type"],
                    "locations": p.get("grounded_location") or p.get("location") or [],
                    "sentence": _sentence(study.get("section_content", ""), p.get("sent_idx")),
                    "section_name": study.get("section_name", ""),
                    "section_content": study.get("section_content", ""),
                    "seg_mask_path": p.get("seg_mask_path"), "parts": ["pair"], "pose_warning": pose},
            })
    return out


def _decoded_size(path: Path) -> tuple[int, int]:
    """Height and width of a benchmark PNG after decoding it fully (a file that does not decode is refused)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            if im.format != "PNG":
                raise InputError(f"benchmark image is {im.format}, not a PNG", path)
            if im.width * im.height > Image.MAX_IMAGE_PIXELS:
                raise InputError(f"benchmark image is {im.width}x{im.height}, too large to review", path)
            load_pixels(im)
            return int(im.height), int(im.width)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise InputError(f"benchmark image does not decode ({exc})", path) from exc


def bench_items(bench_dir: str | Path) -> list[dict[str, Any]]:
    """One item per case; its questions as the model is asked them (text, images, options) with the key."""
    bench = load_benchmark(bench_dir)
    root = Path(bench.root or bench_dir).resolve()
    out: list[dict[str, Any]] = []
    for key, case in bench.cases.items():
        plan = plan_case(key, case)
        images: list[dict[str, str]] = []
        index: dict[str, int] = {}
        sizes: dict[str, tuple[int, int]] = {}
        questions = []
        for q in plan.questions:
            refs = []
            for rel in q.images:
                if rel not in index:
                    path = safe_image_path(root, rel)
                    if not path.is_file():
                        raise InputError(f"case {key}: image {rel!r} not found", root)
                    sizes[rel] = _decoded_size(path)
                    index[rel] = len(images)
                    images.append({"path": str(path.resolve()), "role": "png", "label": Path(rel).name})
                refs.append(index[rel])
            questions.append({"part": q.qid, "title": STAGE_TITLES.get(q.qid, q.qid), "stage": q.stage,
                              "prefix": q.prefix, "question": q.text, "options": list(q.options),
                              "answer_index": list(q.gt), "answer": [q.options[i - 1] for i in q.gt],
                              "images": refs})
        h, w = case.image_size or sizes[plan.questions[0].images[0]]
        out.append({
            "kind": "bench", "key": key, "lesion": plan.lesion, "item_type": plan.path,
            "positive": plan.path != "LF", "source": str(root), "height": int(h), "width": int(w),
            "images": images, "mask": None, "view": BENCH_VIEW,
            "payload": {"pair_id": case.pair_id, "dicom_id": case.dicom_id, "case_id": case.case_id or key,
                        "path": plan.path, "questions": questions, "parts": [q.qid for q in plan.questions]},
        })
    return out


def import_items(db: Any, items: Sequence[dict[str, Any]], sample: int | None, seed: int,
                 per_item: int) -> dict[str, int]:
    """Sample ``items``, add the new ones to ``db`` and give each item in no queue yet to ``per_item`` reviewers,
    all in one transaction; returns counts."""
    chosen = sample_items(items, sample, seed)
    added, picked_up, made = db.add_and_assign(chosen, per_item)
    return {"found": len(items), "sampled": len(chosen), "added": added, "already_there": len(chosen) - added,
            "picked_up": picked_up, "assignments": made}


@dataclass(frozen=True, kw_only=True)
class ImportRequest:
    """What to import into a review database (an ILS dataset or a benchmark), how much, and for how many reviewers
    (each field documents itself, :func:`cxrground.fields.option`; ``cxrground review import`` offers them)."""

    ils_dir: Path | None = option(None, flag="--ils", path="existing",
                                  help="An ILS dataset folder or its JSON file: one item per instruction-answer pair.")
    images: Path | None = option(None, path="dir",
                                 help="With --ils: the image root its image_path values are relative to.")
    splits: tuple[str, ...] = option((), flag="--split", choices=("train", "val", "test"),
                                     help="With --ils: splits to import (repeatable; default all).")
    bench_dir: Path | None = option(None, flag="--bench", path="dir", help="A CheXpercept benchmark folder: one item "
                                    "per case, one decision per question.")
    sample: int | None = option(None, low=1, help="Import N items drawn at random (seeded).")
    seed: int = option(0, low=0, help="Seed of --sample (which items are drawn); the assignment to reviewers does "
                       "not use it (least loaded first, ties by user id).")
    per_item: int = option(2, low=1, help="Reviewers per item (K); needs at least K reviewers in the database.")


def import_request(db_path: Path, request: ImportRequest) -> str:
    """Import the request's items into the database at ``db_path`` (new ones only) and assign them; returns the
    counts as one line. Neither or both of ``ils_dir`` and ``bench_dir``, ``ils_dir`` without ``images``, and
    ``bench_dir`` with ``images`` or ``splits`` (a benchmark records no split per case and its images lie in its
    folder) are an :class:`OptionError`."""
    from cxrground.review.db import ReviewDB

    r = request
    if (r.ils_dir is None) == (r.bench_dir is None):
        raise OptionError("give exactly one of --ils DATASET or --bench DIR")
    if r.ils_dir is not None and r.images is None:
        raise OptionError("--ils needs --images (the folder the dataset's image_path values are relative to)")
    if r.bench_dir is not None and (r.splits or r.images is not None):
        given = [name for name, used in (("--split", bool(r.splits)), ("--images", r.images is not None)) if used]
        raise OptionError(f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to --ils only: a "
                          "benchmark records no split per case and its images lie in its folder (import it whole, "
                          "or --sample N of its cases)")
    db = ReviewDB(db_path)
    failures: list[Failure] = []
    items = (ils_items(r.ils_dir, r.images, r.splits or SPLITS, failures) if r.ils_dir is not None
             else bench_items(r.bench_dir))
    counts = import_items(db, items, r.sample, r.seed, r.per_item)
    record = Path(f"{db_path}.failures.jsonl")
    if failures:  # the last import's: an import without failures removes an earlier list
        atomic_write_text(record, "".join(json.dumps(f.to_dict()) + "\n" for f in failures))
    else:
        record.unlink(missing_ok=True)
    return (f"{counts['found']} items found, {counts['sampled']} sampled, {counts['added']} added "
            f"({counts['already_there']} already there"
            + (f", {counts['picked_up']} of them in no queue until now" if counts["picked_up"] else "")
            + f"), {counts['assignments']} assignments"
            + (f"; {len(failures)} studies left out (film or mask unreadable), listed in {record}"
               + first_failure(failures) if failures else ""))
