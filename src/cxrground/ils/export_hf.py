"""``cxrground ils export --format hf``: an ILS dataset as a Hugging Face dataset (Parquet shards + card).

One row per instruction-answer pair (``rows="pair"``, the default) or per study (``rows="study"``), one split per
dataset split (``train``, ``val``, ``test``; config ``default``). Pair rows have the columns: the study
(``study_key``, ``subject_id``, ``dicom_id``, ``image_path``, ``section_name``, ``section_content``, ``image``),
the pair (``pair_id``, ``polarity`` positive/negative, ``instruction``, ``answer``, ``type``, ``target``,
``seg``, ``reported_location``, ``grounded_location``, ``location``, ``sent_idx``, ``seg_mask_path``,
``certainty``, ``kind``, ``mask``) and, as JSON objects, any other field of the pair (``pair_extra``) and of the
study (``study_extra``), so that :func:`ils_json_from_rows` gives back the MIMIC-ILS JSON exactly, except that pair
rows hold no study without pairs (study rows do).

``image`` holds the source file's bytes when it is a PNG or JPEG and, when it is a DICOM, an 8-bit PNG of the
pixels as the toolkit reads them for its masks (:func:`cxrground.io.image.read_image`: the file's VOI LUT or
window, else contrast-stretched from its minimum to its maximum); ``mask`` holds the mask PNG's bytes as stored (the
dataset's frame, :mod:`cxrground.ils.frames`; None for a negative pair). Every mask is checked against its film as
the other exports check it: at the film's size or in the released frame, on a film of the native size the dataset
records (``mask_frame.json``, ``anatomy.jsonl``); a mismatch is an error naming the file and both sizes. The study
image is repeated on every
pair row of the study (self-contained rows, what VLM trainers read; the export is then several times the size of
the images). Study rows hold each image once: the study columns, ``image``, ``study_extra`` and ``pairs``, a list
of the pair columns (``mask`` included) in file order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ImageReadError, InputError
from cxrground.ils.frames import (
    FRAME_FILE,
    RELEASED_SIZE,
    MaskFrame,
    _anatomy_sizes,
    check_mask_shape,
    is_released,
    read_frame,
)
from cxrground.ils.layout import DATASET_FILE, MASK_DIR
from cxrground.ils.schema import SPLITS, check_splits, iter_dataset
from cxrground.io.export_dir import export_folder
from cxrground.io.hf import HF_NAMES, image_cell, png_cell, require_datasets, write_card, write_splits
from cxrground.io.image import image_header_size, is_dicom, read_image, read_image_bytes, sniff_type
from cxrground.io.masks import read_mask_png

__all__ = ["ROWS", "STUDY_COLUMNS", "export_hf", "ils_features", "ils_json_from_rows", "pair_rows", "stored_frame",
           "study_row"]

#: Row layouts of the export: one row per pair, or one per study with its pairs as a list.
ROWS: Final[tuple[str, str]] = ("pair", "study")

STUDY_COLUMNS: Final[tuple[str, ...]] = ("subject_id", "dicom_id", "image_path", "section_name", "section_content")
_LISTS: Final[tuple[str, ...]] = ("reported_location", "grounded_location", "location")
_OPTIONAL: Final[tuple[str, ...]] = ("sent_idx", "seg_mask_path", "certainty", "kind")
_PAIR_CORE: Final[tuple[str, ...]] = ("pair_id", "instruction", "answer", "type", "target", "seg")
_PAIR_KNOWN: Final[frozenset[str]] = frozenset((*_PAIR_CORE, *_LISTS, *_OPTIONAL))
_STUDY_KNOWN: Final[frozenset[str]] = frozenset((*STUDY_COLUMNS, "instruction_answer_pairs"))
#: Checks a stored mask's shape (``(shape, mask path)``), raising :class:`InputError` when it does not fit its film.
MaskCheck = Callable[[tuple[int, ...], Path], None]


def ils_features(rows: str = "pair") -> Any:
    """The :class:`datasets.Features` of a pair row or of a study row (module docstring)."""
    d = require_datasets()
    string = d.Value("string")
    study = {"study_key": string, **{c: string for c in STUDY_COLUMNS}, "image": d.Image()}
    pair = {"pair_id": string, "polarity": string, "instruction": string, "answer": string, "type": string,
            "target": string, "seg": d.Value("bool"), **{c: d.List(string) for c in _LISTS},
            **{c: string for c in _OPTIONAL}, "mask": d.Image(), "pair_extra": string}
    if rows == "study":
        return d.Features({**study, "study_extra": string, "pairs": d.List(pair)})
    return d.Features({**study, **pair, "study_extra": string})


def _dataset_json(dataset: Path) -> Path:
    path = dataset if dataset.is_file() else dataset / DATASET_FILE
    if not path.is_file():
        raise InputError(f"no {DATASET_FILE} here", dataset)
    return path


def _image(images: Path, rel: str) -> dict[str, Any]:
    """The ``image`` cell of a study; an image that does not decode is an :class:`ImageReadError` naming it."""
    path = images / rel
    if not path.is_file():
        raise ImageReadError("image not found under --images", path)
    if is_dicom(path):
        return png_cell(read_image(path).pixels, Path(rel).with_suffix(".png").name)
    cell = image_cell(path)
    read_image_bytes(cell["bytes"], str(path))  # the stored bytes decode (a truncated file is refused)
    return cell


def _mask(masks: Path, pair: Mapping[str, Any], fits: MaskCheck | None = None) -> dict[str, Any] | None:
    """The ``mask`` cell of a pair (None for a negative); a mask that is missing or does not decode is an
    :class:`InputError` naming it, and so is one ``fits`` refuses (:func:`_mask_check`)."""
    rel = pair.get("seg_mask_path")
    if rel is None:
        return None
    path = masks / rel
    if not path.is_file():
        raise InputError(f"mask of {pair['pair_id']} not found", path)
    mask = read_mask_png(path)
    if fits is not None:
        fits(mask.shape, path)
    return image_cell(path)


def _mask_check(images: Path, study: Mapping[str, Any], frame: MaskFrame, native: tuple[int, int] | None
                ) -> MaskCheck:
    """The check of the study's masks against its film: each at the film's size or in the released frame
    (:func:`cxrground.ils.frames.check_mask_shape`), and a film whose size differs from the native size the
    dataset records (``native``) is refused; each an :class:`InputError` naming the file and both sizes."""
    path = images / study["image_path"]
    hw = _image_size(path)

    def check(shape: tuple[int, ...], mask_path: Path) -> None:
        check_mask_shape(shape, hw, frame, mask_path)
        if native is not None and tuple(native) != tuple(hw):
            raise InputError(f"image is {tuple(hw)}, the dataset records its native size as {tuple(native)} "
                             f"({FRAME_FILE} or anatomy.jsonl): --images must hold the films the dataset was "
                             "built from", path)

    return check


def _row_counts(json_path: Path, rows: str) -> dict[str, int]:
    """Rows per split of the dataset ``json_path`` (read as a stream and checked as
    :func:`~cxrground.ils.schema.iter_dataset` checks it); a pair that lacks a field of :data:`_PAIR_CORE` is an
    :class:`InputError` naming the file and the first such pairs."""
    counts = dict.fromkeys(SPLITS, 0)
    missing: list[str] = []
    for split, key, study in iter_dataset(json_path, STUDY_COLUMNS):
        pairs = [p for kind in ("positive_pairs", "negative_pairs")
                 for p in study["instruction_answer_pairs"].get(kind, [])]
        counts[split] += 1 if rows == "study" else len(pairs)
        missing += [f"{split}.{key} pair {p.get('pair_id', '?')}: no {', '.join(c for c in _PAIR_CORE if c not in p)}"
                    for p in pairs if any(c not in p for c in _PAIR_CORE)]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise InputError(f"pairs without the fields the hf format needs: {'; '.join(missing[:3])}{more}", json_path)
    return counts


def _pair_extra(pair: Mapping[str, Any]) -> dict[str, Any]:
    """Fields of a pair the columns do not give back exactly: unknown ones, and optional ones that are not strings
    (an explicit null, a number)."""
    return {k: v for k, v in pair.items() if k not in _PAIR_KNOWN or (k in _OPTIONAL and not isinstance(v, str))}


def pair_rows(key: str, study: Mapping[str, Any], images: Path, masks: Path, frame: MaskFrame | None = None,
              native: tuple[int, int] | None = None) -> Iterator[dict[str, Any]]:
    """The rows of one study (positive pairs first, in file order). With ``frame`` (the dataset's,
    :func:`~cxrground.ils.frames.read_frame`), every mask is checked against the film and the film against
    ``native``, the native size the dataset records (:func:`_mask_check`)."""
    pairs = study["instruction_answer_pairs"]
    fits = (_mask_check(images, study, frame, native) if frame is not None and pairs.get("positive_pairs")
            else None)
    base = {"study_key": key, **{c: study[c] for c in STUDY_COLUMNS}, "image": _image(images, study["image_path"]),
            "study_extra": json.dumps({k: v for k, v in study.items() if k not in _STUDY_KNOWN}, sort_keys=True)}
    for polarity in ("positive", "negative"):
        for pair in pairs.get(f"{polarity}_pairs", []):
            row = {**base, "polarity": polarity, **{c: pair[c] for c in _PAIR_CORE},
                   **{c: list(pair[c]) if c in pair else None for c in _LISTS},
                   **{c: (None if pair.get(c) is None else str(pair[c])) for c in _OPTIONAL},
                   "pair_extra": json.dumps(_pair_extra(pair), sort_keys=True), "mask": _mask(masks, pair, fits)}
            yield row


def study_row(key: str, study: Mapping[str, Any], images: Path, masks: Path, frame: MaskFrame | None = None,
              native: tuple[int, int] | None = None) -> dict[str, Any]:
    """The study row of one study: its columns, image and pairs (module docstring; ``frame``, ``native``: as
    :func:`pair_rows` checks the masks)."""
    rows = list(pair_rows(key, study, images, masks, frame, native))
    if not rows:
        base = {"study_key": key, **{c: study[c] for c in STUDY_COLUMNS}, "image": _image(images, study["image_path"]),
                "study_extra": json.dumps({k: v for k, v in study.items() if k not in _STUDY_KNOWN}, sort_keys=True)}
        return {**base, "pairs": []}
    shared = ("study_key", *STUDY_COLUMNS, "image", "study_extra")
    return {**{c: rows[0][c] for c in shared}, "pairs": [{k: v for k, v in r.items() if k not in shared}
                                                         for r in rows]}


def _flat(rows: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Pair rows of pair or study rows."""
    for r in rows:
        if "pairs" in r:
            base = {k: v for k, v in r.items() if k != "pairs"}
            for p in r["pairs"]:
                yield {**base, **p}
        else:
            yield r


def ils_json_from_rows(rows_by_split: Mapping[str, Iterable[Mapping[str, Any]]]) -> dict[str, Any]:
    """The MIMIC-ILS JSON (``{split: {study_key: study}}``) of exported pair or study rows (images and masks
    ignored; a study row without pairs gives back a study without pairs, while pair rows hold no such study)."""
    out: dict[str, Any] = {}
    for split, rows in rows_by_split.items():
        studies: dict[str, Any] = {}
        rows = list(rows)
        for r in rows:
            if "pairs" in r and not r["pairs"]:
                studies[r["study_key"]] = {**{c: r[c] for c in STUDY_COLUMNS}, **json.loads(r["study_extra"]),
                                           "instruction_answer_pairs": {"positive_pairs": [], "negative_pairs": []}}
        for r in _flat(rows):
            study = studies.get(r["study_key"])
            if study is None:
                study = {**{c: r[c] for c in STUDY_COLUMNS}, **json.loads(r["study_extra"]),
                         "instruction_answer_pairs": {"positive_pairs": [], "negative_pairs": []}}
                studies[r["study_key"]] = study
            pair = {**{c: r[c] for c in _PAIR_CORE}, **{c: list(r[c]) for c in _LISTS if r[c] is not None},
                    **{c: r[c] for c in _OPTIONAL if r[c] is not None}, **json.loads(r["pair_extra"])}
            study["instruction_answer_pairs"][f"{r['polarity']}_pairs"].append(pair)
        out[split] = studies
    return out


def stored_frame(studies: Iterable[tuple[str, str, Mapping[str, Any]]], images: Path, masks: Path,
                 frame: MaskFrame) -> str:
    """The frame of the dataset's masks as stored, as the card states it: the recorded one; native for an ``ils
    build`` folder (it records its films' sizes in ``anatomy.jsonl``); else the one each mask of ``(split, study
    key, study)`` is in (:func:`cxrground.ils.frames.is_released`; a MIMIC-ILS download is released)."""
    from PIL import Image

    if frame.recorded:
        return f"{frame.frame} frame"
    if (masks.parent / "anatomy.jsonl").is_file():
        return "native frame"
    seen: set[str] = set()
    for _split, _key, study in studies:
        positives = study["instruction_answer_pairs"].get("positive_pairs", [])
        if not positives:
            continue
        hw = _image_size(images / study["image_path"])
        for pair in positives:
            with Image.open(masks / pair["seg_mask_path"]) as im:
                shape = (im.height, im.width)
            seen.add("released" if is_released(shape, hw, frame) else "native")
        if len(seen) == 2:
            break
    if seen == {"released"}:
        return f"released frame, {RELEASED_SIZE}x{RELEASED_SIZE}"
    if len(seen) == 2:
        return f"native frame, or the released {RELEASED_SIZE}x{RELEASED_SIZE} frame where a mask is that size"
    return "native frame"


def _image_size(path: Path) -> tuple[int, int]:
    """``(H, W)`` of the image file ``path`` from its header."""
    with path.open("rb") as f:
        kind = sniff_type(f.read(132))
        if kind is None:
            return read_image(path).shape
        f.seek(0)
        return image_header_size(f, kind)


def _card_body(source: Path, frame: str, info: dict[str, dict[str, int]], rows: str) -> str:
    counts = ", ".join(f"{s}: {v['num_examples']} {rows}s" for s, v in info.items())
    if rows == "pair":
        layout = "every pair of the source JSON as one row, with the study image (`image`"
        where = ""
        kept = (" A study without pairs has no row: export with `--hf-rows study` to keep it. Apart from those "
                "studies, the source JSON is recovered exactly")
        example = "row = ds['train'][0]  # row['image'], row['mask']: PIL images; row['instruction'], row['answer']"
    else:
        layout = "every study as one row with its image (`image`"
        where = " in the list `pairs`"
        example = "study = ds['train'][0]  # study['image']: PIL image; study['pairs'][0]['instruction'], ['mask']"
        kept = " The source JSON is recovered exactly"
    files = ", ".join(f'"{s}": "data/{s}-*.parquet"' for s in info)
    return f"""# ILS dataset (instruction-guided lesion segmentation)

Instruction-answer pairs over chest X-rays, each grounded to a lesion mask (MIMIC-ILS format), exported with
`cxrground ils export --format hf` from `{source.name}` ({counts}).

## How it was built

`cxrground ils build` generated the pairs from the reports and the images (see the source dataset's `card.md` for
its sources, models and quality numbers); this export writes {layout}; DICOM images as 8-bit PNG of the
pixels as cxrground reads them: the file's VOI LUT or window, else contrast-stretched to 0-255) and each pair's
lesion mask{where} (`mask`, the PNG as stored, {frame}; empty for negative pairs).
`pair_extra` / `study_extra` hold any other field as a JSON object.{kept} with
`cxrground.ils.export_hf.ils_json_from_rows` (a split without rows is left out).

## Load

```python
from datasets import load_dataset
ds = load_dataset("parquet", data_files={{{files}}})
{example}
```

## Licence

Fill in the `license` field above with the licence of the source images and reports before publishing.
"""


def export_hf(dataset: str | Path, images: str | Path, out: str | Path, *, shard_rows: int = 500,
              arrow: bool = False, rows: str = "pair", overwrite: bool = False) -> dict[str, Any]:
    """Write ``dataset`` (a folder or its JSON) with the images under ``images`` as a Hugging Face dataset in
    ``out`` with one row per pair or per study (module docstring); returns ``{split: {num_examples, num_bytes,
    shards}}`` and the row total. ``out`` must be empty or, with ``overwrite``, hold an earlier hf export, which
    is replaced (:mod:`cxrground.io.export_dir`)."""
    if rows not in ROWS:
        raise InputError(f"rows must be one of {ROWS}, got {rows!r}")
    json_path = _dataset_json(Path(dataset))
    images, out = Path(images), Path(out)
    check_splits(json_path)
    counts = _row_counts(json_path, rows)
    masks = json_path.parent / MASK_DIR
    features = ils_features(rows)
    frame = read_frame(json_path)
    anatomy = _anatomy_sizes(json_path.parent)

    def native(key: str, study: Mapping[str, Any]) -> tuple[int, int] | None:
        return frame.native_of(study["image_path"]) or anatomy.get(key)

    def studies(split: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
        return iter_dataset(json_path, STUDY_COLUMNS, splits=(split,))

    def split_rows(split: str) -> Any:
        if rows == "study":
            return lambda: (study_row(key, s, images, masks, frame, native(key, s)) for _, key, s in studies(split))
        return lambda: (r for _, key, s in studies(split) for r in pair_rows(key, s, images, masks, frame,
                                                                               native(key, s)))

    with export_folder(out, overwrite, HF_NAMES, "hf") as stage:
        info = write_splits(stage, features, {s: (counts[s], split_rows(s)) for s in SPLITS}, shard_rows, arrow)
        stored = stored_frame(iter_dataset(json_path, STUDY_COLUMNS), images, masks, frame)
        body = _card_body(json_path.parent, stored, info, rows)
        write_card(stage, features, info, "ILS dataset", body,
                   tags=("medical", "chest-x-ray", "segmentation", "referring-segmentation"))
    return {"splits": info, "rows": sum(v["num_examples"] for v in info.values())}
