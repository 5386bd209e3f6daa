"""Pairs, images and masks of an ILS dataset at the baseline's working size, cached in memory or on disk.

- :func:`prepare_image`: native grey pixels → ``zscore-valid`` canvas of ``config.size`` (centred
  :class:`~cxrground.io.transform.Letterbox`, the same normalisation as the lung U-Net) plus the anatomy
  planes: right lung, left lung and the ten ILS location-label masks (:mod:`cxrground.anatomy.ils_locations`)
  computed on the canvas from the shipped lung U-Net's lungs (all zero with ``anatomy="none"``).
- :func:`load_pairs`: the pairs of one split with their training labels (presence, lesion-inference
  lesion and certainty, grounded location labels).
- :class:`PairTensors`: a torch ``Dataset`` over those pairs whose images and masks are read once and resized,
  kept in memory or in a memory-mapped cache folder a later run reuses; an unreadable image is recorded as a
  :class:`~cxrground.errors.Failure` and its pairs are left out.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cxrground.anatomy.ils_locations import ils_location_masks
from cxrground.anatomy.segment.builtin import UNetLungSegmenter, postprocess_lungs
from cxrground.anatomy.segment.unet import prepare_input
from cxrground.errors import ConfigError, Failure, InputError
from cxrground.ils.frames import read_native_mask, released_side
from cxrground.ils.layout import DATASET_FILE, MASK_DIR
from cxrground.ils.schema import check_splits, iter_dataset
from cxrground.ils.tasks import file_state
from cxrground.io.files import atomic_write_text, sha256_json
from cxrground.io.image import CXRImage, read_image
from cxrground.io.progress import progress_bar
from cxrground.io.transform import Letterbox
from cxrground.models.baseline.conditioning import CERTAINTIES, LI_LESIONS, encode, location_vector, parse
from cxrground.models.baseline.config import BaselineConfig
from cxrground.models.train_failures import STAGE
from cxrground.vocab.ils_templates import positive_answer
from cxrground.vocab.locations import ILS_LOCATION_LABELS

__all__ = ["CACHE_FILE", "PairRecord", "PairTensors", "WorkingImage", "cache_key", "check_lungs", "dataset_paths",
           "load_pairs", "lungs_identity", "make_segmenter", "prepare_image"]

#: Anatomy planes: right lung, left lung, then the ILS labels in vocabulary order.
N_ANATOMY = 2 + len(ILS_LOCATION_LABELS)


@dataclass(frozen=True)
class WorkingImage:
    """One image on the working canvas: normalised pixels ``(S, S)``, anatomy planes ``(12, S, S)``, letterbox."""

    image: np.ndarray
    anatomy: np.ndarray
    box: Letterbox


def make_segmenter(config: BaselineConfig) -> UNetLungSegmenter | None:
    """The lung segmenter the configuration asks for (None for ``anatomy="none"``)."""
    if config.anatomy != "unet":
        return None
    return UNetLungSegmenter(config.lung_weights or None, threads=config.threads, estimate_heart=False)


def lungs_identity(segmenter: UNetLungSegmenter | None) -> dict[str, str] | None:
    """Name and sha256 of the lung U-Net weights behind ``segmenter`` (None without one), for ``checkpoint.json``."""
    return None if segmenter is None else segmenter.identity()


def check_lungs(recorded: Mapping[str, Any] | None, segmenter: UNetLungSegmenter | None, where: str) -> None:
    """Raise :class:`~cxrground.errors.ConfigError` when a checkpoint's recorded lungs (``recorded``; None for
    checkpoints that predate the record) are not those of ``segmenter``."""
    if recorded is None or segmenter is None:
        return
    have = lungs_identity(segmenter)
    if have is None or recorded.get("sha256") == have["sha256"]:
        return
    raise ConfigError(f"{where} was trained with the lung U-Net {recorded.get('name')} (sha256 "
                      f"{str(recorded.get('sha256'))[:12]}…), not {have['name']} ({have['sha256'][:12]}…); set "
                      f"lung_weights to the weights it was trained with")


def prepare_image(pixels: np.ndarray, config: BaselineConfig, segmenter: UNetLungSegmenter | None) -> WorkingImage:
    """Letterbox and normalise ``pixels`` and add the anatomy planes (see the module docstring)."""
    canvas, box = prepare_input(pixels, config.size)
    anatomy = np.zeros((N_ANATOMY, config.size, config.size), dtype=bool)
    if segmenter is not None:
        p_right, p_left, _ = segmenter.probabilities(CXRImage(pixels))
        right, left = postprocess_lungs(p_right, p_left, segmenter.threshold)
        right_c, left_c = box.mask_to_canvas(right), box.mask_to_canvas(left)
        labels = ils_location_masks(right_c, left_c)
        anatomy[0], anatomy[1] = right_c, left_c
        for i, label in enumerate(ILS_LOCATION_LABELS):
            anatomy[2 + i] = labels[label]
    return WorkingImage(canvas.astype(np.float32), anatomy, box)


@dataclass(frozen=True, slots=True)
class PairRecord:
    """One instruction-answer pair with the labels the baseline learns from."""

    pair_id: str
    study: str
    image_path: str
    instruction: str
    answer: str
    kind: str
    target: str
    positive: bool
    mask_path: Path | None
    locations: tuple[str, ...]
    li_lesion: int
    certainty: int
    released_size: int | None = None
    """The side of the dataset's released-frame masks (its ``mask_frame.json`` says so), None otherwise."""


def dataset_paths(dataset: str | Path) -> tuple[Path, Path]:
    """The dataset JSON and the ``lesion_mask`` folder of a dataset folder (or of its JSON file)."""
    p = Path(dataset)
    if p.is_file():
        return p, p.parent / MASK_DIR
    return p / DATASET_FILE, p / MASK_DIR


def _certainty(pair: dict[str, Any]) -> int:
    for i, cert in enumerate(CERTAINTIES):
        if positive_answer("lesion_inference", pair["target"], certainty=cert) == pair["answer"]:
            return i
    return -1


def load_pairs(dataset: str | Path, split: str, data: dict[str, Any] | None = None) -> list[PairRecord]:
    """Every pair of ``split`` in file order (positives then negatives per study); [] when the split is absent.
    ``data``: the dataset as :func:`~cxrground.ils.schema.read_dataset` gives it (None: only ``split`` is read, as a
    stream, and checked; a file it refuses is an :class:`~cxrground.errors.InputError` naming the file and the
    record)."""
    json_path, mask_root = dataset_paths(dataset)
    if data is None:
        check_splits(json_path)
    studies = (((key, study) for _split, key, study in iter_dataset(json_path, splits=(split,))) if data is None
               else data.get(split, {}).items())
    released = released_side(json_path)
    out: list[PairRecord] = []
    for key, study in studies:
        pairs = study["instruction_answer_pairs"]
        for pair, positive in [(p, True) for p in pairs.get("positive_pairs", [])] + \
                              [(p, False) for p in pairs.get("negative_pairs", [])]:
            li = positive and pair["type"] == "lesion_inference" and pair["target"] in LI_LESIONS
            out.append(PairRecord(
                pair_id=pair["pair_id"], study=key, image_path=study["image_path"],
                instruction=pair["instruction"], answer=pair["answer"], kind=pair["type"], target=pair["target"],
                positive=positive, mask_path=(mask_root / pair["seg_mask_path"]) if positive else None,
                locations=tuple(pair.get("grounded_location", ())) if positive else (),
                li_lesion=LI_LESIONS.index(pair["target"]) if li else -1,
                certainty=_certainty(pair) if li else -1, released_size=released,
            ))
    return out


class PairTensors(torch.utils.data.Dataset):
    """Working-size tensors of a list of pairs; ``batch(indices)`` stacks a mini-batch.

    Each film is read and prepared once (:func:`prepare_image`); a film that cannot be read is a
    :class:`~cxrground.errors.Failure` and its pairs are left out. The image, anatomy and mask arrays are
    preallocated and filled film by film: in memory without ``cache``; with a ``cache`` folder, as ``.npy`` files
    memory-mapped from it (a split larger than memory trains from disk), recorded last in ``cache.json`` with what
    they were made from (:func:`cache_key`: the pairs, the image root, each film's size and modification time, and
    ``identity``, what else changes the preparation), so a later run over the same pairs reads the arrays instead
    of the films.
    """

    def __init__(self, pairs: Sequence[PairRecord], images_root: Path, config: BaselineConfig,
                 segmenter: UNetLungSegmenter | None, progress: bool = True,
                 log: Callable[[str], None] | None = None, cache: Path | None = None,
                 identity: Mapping[str, Any] | None = None) -> None:
        self.config = config
        by_study: dict[str, str] = {}
        for p in pairs:
            by_study.setdefault(p.study, p.image_path)
        key = cache_key(pairs, images_root, by_study, config, identity) if cache is not None else None
        loaded = _read_cache(cache, key) if cache is not None else None
        self.from_cache = loaded is not None
        if loaded is None:
            loaded = _prepare(pairs, by_study, images_root, config, segmenter, progress, log, cache, key)
        rows, mask_rows, self.failures, (self.images, self.anatomy, self.masks) = loaded
        self.pairs = [p for p in pairs if p.study in rows]
        self.study_keys = [s for s in by_study if s in rows]
        self.study_index = np.array([rows[p.study] for p in self.pairs], dtype=np.int64)
        self.mask_index = np.array([mask_rows.get(str(p.mask_path), 0) if p.mask_path is not None else 0
                                    for p in self.pairs], dtype=np.int64)
        self.cond = np.stack([encode(parse(p.instruction)) for p in self.pairs]) if self.pairs else np.zeros((0,))
        self.presence = np.array([p.positive for p in self.pairs], dtype=np.float32)
        self.li_lesion = np.array([p.li_lesion for p in self.pairs], dtype=np.int64)
        self.certainty = np.array([p.certainty for p in self.pairs], dtype=np.int64)
        self.location = (np.stack([location_vector(p.locations) for p in self.pairs]) if self.pairs
                         else np.zeros((0, len(ILS_LOCATION_LABELS)), dtype=np.float32))
        self.location_valid = np.array([p.positive and bool(p.locations) for p in self.pairs], dtype=bool)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.batch([i])

    @property
    def positives(self) -> list[int]:
        """Indices of the positive pairs."""
        return [i for i, p in enumerate(self.pairs) if p.positive]

    @property
    def negatives(self) -> list[int]:
        """Indices of the negative pairs."""
        return [i for i, p in enumerate(self.pairs) if not p.positive]

    def batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, torch.Tensor]:
        """Stacked tensors of the pairs at ``indices`` (images, anatomy, cond, targets)."""
        idx = np.asarray(indices, dtype=np.int64)
        s = self.study_index[idx]
        return {
            "image": torch.from_numpy(self.images[s][:, None]),
            "anatomy": torch.from_numpy(self.anatomy[s].astype(np.float32)),
            "cond": torch.from_numpy(self.cond[idx]),
            "mask": torch.from_numpy(self.masks[self.mask_index[idx]].astype(np.float32)),
            "presence": torch.from_numpy(self.presence[idx]),
            "li_lesion": torch.from_numpy(self.li_lesion[idx]),
            "certainty": torch.from_numpy(self.certainty[idx]),
            "location": torch.from_numpy(self.location[idx]),
            "location_valid": torch.from_numpy(self.location_valid[idx]),
        }


#: The arrays of a :class:`PairTensors` cache, with their dtypes.
_CACHE_ARRAYS: tuple[tuple[str, type], ...] = (("images", np.float32), ("anatomy", np.bool_), ("masks", np.bool_))
#: The record of a complete cache, written after its arrays.
CACHE_FILE = "cache.json"

_Prepared = tuple[dict[str, int], dict[str, int], list[Failure], tuple[np.ndarray, np.ndarray, np.ndarray]]


#: The layout of a :class:`PairTensors` cache: a cache of another layout is made again.
CACHE_VERSION = 1


def cache_key(pairs: Sequence[PairRecord], images_root: Path, films: Mapping[str, str], config: BaselineConfig,
              identity: Mapping[str, Any] | None) -> str:
    """What a :class:`PairTensors` cache is made from, as a hash: the pairs (ids, studies, films, masks and their
    frame), the image root, each film's and mask file's size and modification time
    (:func:`~cxrground.ils.tasks.file_state`), the working size and anatomy setting, the cache layout and
    ``identity`` (e.g. the lung segmenter's weights)."""
    root = Path(images_root).resolve()
    masks = {str(p.mask_path) for p in pairs if p.mask_path is not None}
    states = {name: file_state(path) for name, path in (*((rel, root / rel) for rel in films.values()),
                                                       *((m, Path(m)) for m in sorted(masks)))}
    return sha256_json({"pairs": [[p.pair_id, p.study, p.image_path, str(p.mask_path), p.released_size]
                                  for p in pairs],
                        "images": str(root), "files": states, "size": config.size, "anatomy": config.anatomy,
                        "layout": CACHE_VERSION, "identity": identity}, default=str)


def _read_cache(cache: Path, key: str | None) -> _Prepared | None:
    """The arrays of a complete cache in ``cache`` made for ``key`` (memory-mapped read-only); None otherwise."""
    try:
        record = json.loads((cache / CACHE_FILE).read_text(encoding="utf-8"))
        if record.get("key") != key:
            return None
        arrays = tuple(np.load(cache / f"{name}.npy", mmap_mode="r") for name, _ in _CACHE_ARRAYS)
        failures = [Failure(**f) for f in record["failures"]]
        return record["rows"], record["masks"], failures, arrays  # type: ignore[return-value]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no cache, or not one of this layout
        return None


def _array(cache: Path | None, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A zero-filled array: in memory, or a new ``.npy`` file in ``cache`` mapped into memory, its disk space
    reserved first (a full disk is an ``OSError`` here, not a crash while the array is filled)."""
    if cache is None:
        return np.zeros(shape, dtype=dtype)
    array = np.lib.format.open_memmap(cache / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)
    if hasattr(os, "posix_fallocate"):
        with (cache / f"{name}.npy").open("r+b") as fh:
            try:
                os.posix_fallocate(fh.fileno(), 0, os.fstat(fh.fileno()).st_size)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system that cannot reserve: go on
                    raise
    return array


def _prepare(pairs: Sequence[PairRecord], by_study: Mapping[str, str], images_root: Path, config: BaselineConfig,
             segmenter: UNetLungSegmenter | None, progress: bool, log: Callable[[str], None] | None,
             cache: Path | None, key: str | None) -> _Prepared:
    """Read and prepare every film of ``by_study`` and the masks of the pairs on the films that could be read; the
    rows of the studies and masks, the failures and the arrays (written to ``cache`` and recorded there when
    given)."""
    if cache is not None:
        for name in (CACHE_FILE, *(f"{array}.npy" for array, _ in _CACHE_ARRAYS)):  # its own files only
            (cache / name).unlink(missing_ok=True)
        cache.mkdir(parents=True, exist_ok=True)
    size = config.size
    images = _array(cache, "images", (len(by_study), size, size), np.float32)
    anatomy = _array(cache, "anatomy", (len(by_study), N_ANATOMY, size, size), np.bool_)
    rows: dict[str, int] = {}
    boxes: dict[str, Letterbox] = {}
    failures: list[Failure] = []
    bar = progress_bar(by_study.items(), desc="cache images", unit="img", progress=progress)
    for row, (study, rel) in enumerate(bar):
        try:
            work = prepare_image(read_image(images_root / rel).pixels, config, segmenter)
        except InputError as exc:
            failures.append(Failure.from_exception((images_root / rel).absolute(), STAGE, exc))
            if log is not None:
                log(f"skipping study {study}: {exc}")
            continue
        images[row], anatomy[row] = work.image, work.anatomy
        rows[study], boxes[study] = row, work.box
    first: dict[str, PairRecord] = {}  # each mask file once, read on the canvas of its study's film
    for p in pairs:
        if p.mask_path is not None and p.study in rows:
            first.setdefault(str(p.mask_path), p)
    masks = _array(cache, "masks", (1 + len(first), size, size), np.bool_)  # row 0: the empty mask
    mask_rows: dict[str, int] = {}
    for i, (path, p) in enumerate(first.items(), start=1):
        box = boxes[p.study]
        masks[i] = box.mask_to_canvas(read_native_mask(Path(path), box.src_hw, p.released_size))
        mask_rows[path] = i
    if cache is None:
        return rows, mask_rows, failures, (images, anatomy, masks)
    for array in (images, anatomy, masks):
        array.flush()  # type: ignore[attr-defined]
    del images, anatomy, masks
    atomic_write_text(cache / CACHE_FILE, json.dumps({"key": key, "rows": rows, "masks": mask_rows,
                                                      "failures": [f.to_dict() for f in failures]}))
    loaded = _read_cache(cache, key)
    assert loaded is not None  # just written
    return loaded
