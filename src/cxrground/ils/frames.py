"""Mask frames of an ILS dataset (ILS.md §12.1): ``native`` (ours) and ``released`` (MIMIC-ILS as published).

- **native**: every mask PNG has its image's own ``H×W``; the frame is the image's pixel grid.
- **released**: every mask PNG is ``size×size`` (512 in MIMIC-ILS), the **whole image stretched to the square**
  (no padding), nearest neighbour. The ROSALIA/LISA training and evaluation code reads masks in this frame: it
  resizes a mask's longest side to the SAM canvas (a square mask fills the canvas) and stretches its predictions
  from the un-padded region to the GT grid, so a native-size mask (letterboxed by that code) disagrees with its
  own stretched prediction (see ``bench/ils_frames.py``).

:func:`export_dataset` writes a dataset in the other frame: the same JSON (byte for byte), every mask mapped
(:func:`stretch`), the card's mask section restated (with :func:`loader_warning` when a released-frame export's
films are not JPEG/PNG), ``anatomy.jsonl`` copied when the dataset has it (``percept
build`` reads it), and :data:`FRAME_FILE` recording the frame and each image's
native size, so that readers (``ils evaluate``, ``percept build``) map released masks back to the native grid with
:func:`to_native` without the images. A folder without :data:`FRAME_FILE` is in the native frame (what ``ils
build`` writes), except that a square :data:`RELEASED_SIZE` mask on an image of another size is a released-frame
mask (a downloaded MIMIC-ILS folder, read with ``--images`` for the native sizes): :func:`mask_on_image` maps
each mask to its image's grid by that rule.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.errors import InputError
from cxrground.ils.layout import DATASET_FILE, MASK_DIR
from cxrground.io.export_dir import export_folder
from cxrground.io.masks import as_mask, read_mask_png, write_mask_png

__all__ = [
    "ANATOMY_FILE",
    "DATASET_NAMES",
    "FRAMES",
    "FRAME_FILE",
    "FRAME_TEXT",
    "RELEASED_SIZE",
    "MaskFrame",
    "check_mask_shape",
    "export_dataset",
    "is_released",
    "loader_warning",
    "mask_on_image",
    "read_frame",
    "reference_protocol_iou",
    "stretch",
    "to_native",
]

#: The two mask frames.
FRAMES: Final[tuple[str, str]] = ("native", "released")
#: Side of the released MIMIC-ILS masks (the single configuration point of the released frame, ILS.md §18.4).
RELEASED_SIZE: Final[int] = 512
#: The frame record written beside ``mimic_ils_instruction_answer.json`` by :func:`export_dataset`.
FRAME_FILE: Final[str] = "mask_frame.json"
#: The films' native sizes and anatomy masks ``ils build`` records beside the dataset (``percept build`` reads it).
ANATOMY_FILE: Final[str] = "anatomy.jsonl"
#: What :func:`export_dataset` writes at the top of its folder (what ``overwrite`` may replace).
DATASET_NAMES: Final[tuple[str, ...]] = (DATASET_FILE, MASK_DIR, FRAME_FILE, "card.md", ANATOMY_FILE)
#: The card's statement of each frame (``## Masks`` section).
FRAME_TEXT: Final[dict[str, str]] = {
    "native": ("PNG, 8-bit, one channel, values 0/255, **at each image's native size**; the frame is the image's "
               "own pixel grid (no padding, no stretching). `masks.jsonl` holds every mask as COCO RLE. **For the "
               "ROSALIA/LISA training and evaluation code, export this dataset first** (`cxrground ils export "
               "--dataset DIR --frame released --out DIR512`): that code letterboxes a non-square mask while it "
               "stretches its predictions, so it trains and scores native masks of non-square films misaligned, "
               "without an error. `cxrground ils evaluate` and `percept build` read either frame."),
    "released": ("PNG, 8-bit, one channel, values 0/255, **{size}×{size}, the released MIMIC-ILS frame**: the whole "
                 "image stretched to the square (no padding), nearest neighbour; the layout the ROSALIA/LISA "
                 "training and evaluation code reads. `" + FRAME_FILE + "` records the frame and every image's "
                 "native size; `cxrground ils evaluate` and `percept build` map each mask back to its image's "
                 "native grid with nearest neighbour (the recorded transform), and metrics stay native."),
}


@dataclass(frozen=True)
class MaskFrame:
    """The frame of a dataset's masks and the native ``(H, W)`` of each image (keyed by ``image_path``);
    ``recorded``: whether the dataset has :data:`FRAME_FILE` (without it the frame is inferred per mask,
    :func:`mask_on_image`)."""

    frame: str = "native"
    size: int | None = None
    native_hw: dict[str, tuple[int, int]] = field(default_factory=dict)
    recorded: bool = True

    def native_of(self, image_path: str) -> tuple[int, int] | None:
        """The recorded native size of an image (None when not recorded)."""
        hw = self.native_hw.get(image_path)
        return (int(hw[0]), int(hw[1])) if hw is not None else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record (the content of :data:`FRAME_FILE`)."""
        return {"frame": self.frame, "mask_size": [self.size, self.size] if self.size else None,
                "mapping": "whole image stretched to the square, nearest neighbour" if self.frame == "released"
                else "identity (native pixel grid)",
                "native_hw": {k: list(v) for k, v in sorted(self.native_hw.items())}}


def read_frame(dataset: str | Path) -> MaskFrame:
    """The frame of a dataset folder (or its JSON file): :data:`FRAME_FILE` when present, else native and not
    recorded (a mask may then be in the released frame, :func:`mask_on_image`)."""
    folder = Path(dataset)
    folder = folder.parent if folder.is_file() else folder
    path = folder / FRAME_FILE
    if not path.is_file():
        return MaskFrame(recorded=False)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        frame = raw["frame"]
        size = raw.get("mask_size")
        native = {str(k): (int(v[0]), int(v[1])) for k, v in (raw.get("native_hw") or {}).items()}
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise InputError(f"unreadable mask-frame record ({exc})", path) from exc
    if frame not in FRAMES:
        raise InputError(f"frame must be one of {FRAMES}, got {frame!r}", path)
    if frame == "released" and (not isinstance(size, list) or len(size) != 2 or size[0] != size[1]):
        raise InputError(f"a released frame needs a square mask_size, got {size!r}", path)
    return MaskFrame(frame, int(size[0]) if frame == "released" else None, native)


def stretch(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A bool mask resized to ``shape`` with nearest neighbour over the whole grid (no padding, aspect not kept)."""
    from PIL import Image

    mask = as_mask(mask)
    if mask.shape == tuple(shape):
        return mask.copy()
    im = Image.fromarray(mask.astype(np.uint8) * 255, mode="L")
    return np.asarray(im.resize((int(shape[1]), int(shape[0])), Image.Resampling.NEAREST)) >= 128


def to_native(mask: np.ndarray, native_hw: tuple[int, int]) -> np.ndarray:
    """A released-frame mask (any square size) mapped to its image's native ``H×W`` (the inverse stretch)."""
    return stretch(mask, native_hw)


def read_native_mask(path: str | Path, shape: tuple[int, int], released_size: int | None = None) -> np.ndarray:
    """The mask PNG at ``path`` on its image's native ``shape``: a native-size mask as it is; a released-frame mask
    (``released_size``: the side the dataset's :data:`FRAME_FILE` records; without one, a MIMIC-ILS download: a
    square :data:`RELEASED_SIZE` mask on a film of another size) mapped back with :func:`to_native`. Any other size
    is a :class:`~cxrground.errors.MaskShapeError` naming the mask."""
    from cxrground.errors import MaskShapeError

    try:
        return read_mask_png(path, shape=shape)
    except MaskShapeError as exc:
        side = released_size or RELEASED_SIZE
        if exc.got != (side, side):
            raise MaskShapeError(shape, exc.got, f"mask (native size, or {side}x{side} in the released frame)",
                                 path) from exc
        return to_native(read_mask_png(path), shape)


def is_released(shape: tuple[int, ...], hw: tuple[int, int], frame: MaskFrame) -> bool:
    """Whether a stored mask of ``shape`` on an image of native ``hw`` is in the released frame: the dataset's
    :data:`FRAME_FILE` says so and the mask has the recorded side or, without one, it is a square
    :data:`RELEASED_SIZE` mask on an image of another size (a MIMIC-ILS download, as :func:`read_native_mask` reads
    it)."""
    if frame.recorded:
        side = frame.size or RELEASED_SIZE
        return frame.frame == "released" and tuple(shape) == (side, side)
    if tuple(shape) == tuple(hw):
        return False
    return tuple(shape) == (RELEASED_SIZE, RELEASED_SIZE)


def mask_on_image(mask: np.ndarray, hw: tuple[int, int], frame: MaskFrame, path: str | Path) -> np.ndarray:
    """A stored mask of a dataset in ``frame`` on its image's native grid ``hw``: a native-size mask as it is, a
    released-frame mask (:func:`is_released`) mapped back with :func:`to_native`; any other size is an
    :class:`~cxrground.errors.InputError` naming the mask (``path``)."""
    mask = as_mask(mask)
    if mask.shape == tuple(hw):
        return mask
    check_mask_shape(mask.shape, hw, frame, path)
    return to_native(mask, hw)


def check_mask_shape(shape: tuple[int, ...], hw: tuple[int, int], frame: MaskFrame, path: str | Path) -> None:
    """Raise :class:`~cxrground.errors.InputError` naming the mask ``path`` unless a stored mask of ``shape`` fits
    its image of native ``hw``: at the image's size, or in the released frame (:func:`is_released`)."""
    if tuple(shape) != tuple(hw) and not is_released(shape, hw, frame):
        side = frame.size or RELEASED_SIZE
        raise InputError(f"mask is {tuple(shape)}, its image {tuple(hw)} (a mask is at its image's size, or "
                         f"{side}x{side} in the released frame)", path)


def released_side(dataset: str | Path) -> int | None:
    """The side of a dataset's released-frame masks as its :data:`FRAME_FILE` records it (None: no record, or
    native)."""
    frame = read_frame(dataset)
    return frame.size if frame.frame == "released" else None


def _longest_side(hw: tuple[int, int], side: int) -> tuple[int, int]:
    """SAM's ``ResizeLongestSide`` output shape (round half up)."""
    scale = side / max(hw)
    return int(hw[0] * scale + 0.5), int(hw[1] * scale + 0.5)


def reference_protocol_iou(gt_file_mask: np.ndarray, pred_native: np.ndarray, canvas: int = 1024) -> float:
    """The per-sample IoU the ROSALIA/LISA evaluation code computes (a measurement of the frames, not our metric).

    The GT mask *as stored* (native or released frame) is resized longest side to ``canvas`` and padded
    bottom/right; the prediction, made on the letterboxed image, is cropped to the image's un-padded region and
    stretched to that padded GT grid (nearest neighbour stands in for the bilinear resize of ±logits). IoU =
    I / (U + 1e-5), 1.0 when both are empty (as the reference).
    """
    gt_file_mask = as_mask(gt_file_mask)
    nh, nw = _longest_side(gt_file_mask.shape, canvas)
    gt = np.zeros((canvas, canvas), bool)
    gt[:nh, :nw] = stretch(gt_file_mask, (nh, nw))
    pred = stretch(stretch(pred_native, _longest_side(as_mask(pred_native).shape, canvas)), gt.shape)
    inter, union = float((gt & pred).sum()), float((gt | pred).sum())
    return 1.0 if union == 0 else inter / (union + 1e-5)


def _dataset_paths(dataset: Path) -> tuple[Path, Path]:
    json_path = dataset if dataset.is_file() else dataset / DATASET_FILE
    if not json_path.is_file():
        raise InputError(f"no {DATASET_FILE} here", dataset)
    return json_path, json_path.parent / MASK_DIR


def _anatomy_sizes(folder: Path) -> dict[str, tuple[int, int]]:
    """Native sizes from ``anatomy.jsonl`` (keyed by study key), when the dataset has it."""
    path = folder / ANATOMY_FILE
    out: dict[str, tuple[int, int]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                key = row.get("study_key") or row.get("study")
                if key and isinstance(row.get("height"), int) and isinstance(row.get("width"), int):
                    out[str(key)] = (row["height"], row["width"])
    return out


def _native_sizes(studies: Iterable[tuple[str, str, dict[str, Any]]], mask_root: Path, source: MaskFrame,
                  folder: Path, image_size: Callable[[str], tuple[int, int]] | None) -> dict[str, tuple[int, int]]:
    """Native ``(H, W)`` per ``image_path`` of ``(split, study key, study)``
    (:func:`~cxrground.ils.schema.iter_dataset`): the frame record, the images, ``anatomy.jsonl``, then native masks
    (a square released-size mask with no frame record and no other source is an :class:`InputError`: a downloaded
    MIMIC-ILS's masks are that size whatever its films')."""
    anatomy = _anatomy_sizes(folder)
    sizes: dict[str, tuple[int, int]] = {}
    for _split, key, study in studies:
        rel = study["image_path"]
        hw = source.native_of(rel)
        if hw is None and image_size is not None:
            hw = image_size(rel)
        hw = hw or anatomy.get(key)  # ils build records each film's size
        if hw is None and source.frame == "native":
            pos = study["instruction_answer_pairs"].get("positive_pairs", [])
            if pos:
                hw = read_mask_png(mask_root / pos[0]["seg_mask_path"]).shape
                if not source.recorded and tuple(hw) == (RELEASED_SIZE, RELEASED_SIZE):
                    raise InputError(f"{rel}: its masks are {RELEASED_SIZE}x{RELEASED_SIZE} and the dataset "
                                     f"records neither their frame ({FRAME_FILE}) nor its films' sizes "
                                     "(anatomy.jsonl), as a downloaded MIMIC-ILS does: give --images (the "
                                     "image root) for the films' native sizes", folder)
        if hw is not None:
            sizes[rel] = (int(hw[0]), int(hw[1]))
    return sizes


#: Image suffixes the ROSALIA/LISA loader reads (``cv2.imread``); it cannot read DICOM.
_LOADER_SUFFIXES: Final[frozenset[str]] = frozenset((".jpg", ".jpeg", ".png"))


def loader_warning(image_paths: Iterable[str]) -> str | None:
    """The warning for a released-frame export whose films the ROSALIA/LISA loader cannot read (``image_path``
    values that are not JPEG or PNG, e.g. DICOM); None when every one is."""
    other = sorted({rel for rel in image_paths if Path(rel).suffix.lower() not in _LOADER_SUFFIXES})
    if not other:
        return None
    return (f"{len(other)} image_path value(s) are not JPEG or PNG (e.g. {other[0]}): the ROSALIA/LISA loader reads "
            "each film with cv2.imread, which cannot read DICOM, so it stops on the first such sample. Convert the "
            "films to 8-bit JPEG or PNG (as MIMIC-CXR-JPG, the image root ILS.md §12.2 names) and rewrite "
            "image_path to them before training, or use `cxrground ils export --format hf`, which stores DICOM "
            "films as 8-bit PNG.")


def _card(folder: Path, out: Path, frame: str, size: int, warning: str | None = None) -> None:
    """Copy ``card.md`` with its mask section stating ``frame`` (a section is appended when it has none) and
    ``warning`` after it."""
    src = folder / "card.md"
    if not src.is_file():
        return
    text = src.read_text(encoding="utf-8")
    new = FRAME_TEXT[frame].format(size=size)
    for old in (FRAME_TEXT[f].format(size=size) for f in FRAMES):
        if old in text:
            text = text.replace(old, new)
            break
    else:
        text += f"\n## Masks\n\n{new}\n"
    if warning:
        text = text.replace(new, f"{new}\n\n**Warning:** {warning}", 1)
    (out / "card.md").write_text(text, encoding="utf-8")


def export_dataset(dataset: str | Path, out: str | Path, frame: str = "released", size: int = RELEASED_SIZE,
                   image_size: Callable[[str], tuple[int, int]] | None = None, *, overwrite: bool = False
                   ) -> dict[str, Any]:
    """Write ``dataset`` with its masks in ``frame`` to ``out`` (see the module docstring); returns counts.

    ``image_size(image_path) -> (H, W)`` gives native sizes the dataset does not record (needed to export a
    released-frame folder without :data:`FRAME_FILE` to the native frame). ``out`` must be empty or, with
    ``overwrite``, hold an earlier export of a dataset, which is replaced; the export is written in a staging
    folder and moved into place only when complete, so a failed one leaves ``out`` as it was
    (:mod:`cxrground.io.export_dir`).
    """
    from cxrground.ils.schema import check_splits, iter_dataset

    if frame not in FRAMES:
        raise InputError(f"frame must be one of {FRAMES}, got {frame!r}")
    json_path, mask_root = _dataset_paths(Path(dataset))
    out = Path(out)
    if out.resolve() == json_path.parent.resolve():
        raise InputError("the export must go to another folder than the dataset", out)
    source = read_frame(json_path)
    check_splits(json_path)
    sizes = _native_sizes(iter_dataset(json_path), mask_root, source, json_path.parent, image_size)
    warning = loader_warning(s["image_path"] for _, _, s in iter_dataset(json_path)) if frame == "released" else None
    with export_folder(out, overwrite, DATASET_NAMES, "mimic-ils") as stage:
        shutil.copyfile(json_path, stage / DATASET_FILE)
        if (json_path.parent / ANATOMY_FILE).is_file():  # on the native grid in either frame
            shutil.copyfile(json_path.parent / ANATOMY_FILE, stage / ANATOMY_FILE)
        written, studies = _write_masks(iter_dataset(json_path), sizes, mask_root, source, frame, size, stage)
        record = MaskFrame(frame, size if frame == "released" else None, sizes)
        (stage / FRAME_FILE).write_text(json.dumps(record.to_dict(), indent=1), encoding="utf-8")
        _card(json_path.parent, stage, frame, size, warning)
    return {"frame": frame, "masks": written, "studies": studies, "native_sizes": len(sizes), "warning": warning}


def _write_masks(studies: Iterable[tuple[str, str, dict[str, Any]]], sizes: dict[str, tuple[int, int]],
                 mask_root: Path, source: MaskFrame, frame: str, size: int, dest: Path) -> tuple[int, int]:
    """Write every mask of ``(split, study key, study)`` (in the ``source`` frame under ``mask_root``) in ``frame``
    under ``dest``; returns the number of mask files and of studies."""
    written: set[str] = set()
    n_studies = 0
    for _split, _key, study in studies:
        n_studies += 1
        hw = sizes.get(study["image_path"])
        for pair in study["instruction_answer_pairs"].get("positive_pairs", []):
            rel = pair["seg_mask_path"]
            if rel in written:
                continue
            mask = read_mask_png(mask_root / rel)
            if hw is not None:
                check_mask_shape(mask.shape, hw, source, mask_root / rel)
            if frame == "released":
                target: tuple[int, int] = (size, size)
            elif hw is None:
                raise InputError(f"native size of {study['image_path']} unknown: pass the images",
                                 mask_root / rel)
            else:
                target = hw
            write_mask_png(dest / MASK_DIR / rel, stretch(mask, target))
            written.add(rel)
    return len(written), n_studies
