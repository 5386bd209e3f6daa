"""Pairs, images and masks of an ILS dataset at the baseline's working size, cached in memory.

- :func:`prepare_image`: native grey pixels → ``zscore-valid`` canvas of ``config.size`` (centred
  :class:`~cxrground.io.transform.Letterbox`, the same normalisation as the lung U-Net) plus the anatomy
  planes: right lung, left lung and the ten ILS location-label masks (:mod:`cxrground.anatomy.ils_locations`)
  computed on the canvas from the shipped lung U-Net's lungs (all zero with ``anatomy="none"``).
- :func:`load_pairs`: the pairs of one split with their training labels (presence, lesion-inference
  lesion and certainty, grounded location labels).
- :class:`PairTensors`: a torch ``Dataset`` over those pairs whose images and masks are read once, resized
  and kept in memory; an unreadable image is recorded as a :class:`~cxrground.errors.Failure` and its pairs
  are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from cxrground.anatomy.ils_locations import ils_location_masks
from cxrground.anatomy.segment.builtin import UNetLungSegmenter, postprocess_lungs
from cxrground.anatomy.segment.unet import prepare_input
from cxrground.errors import ConfigError, Failure, InputError
from cxrground.ils.frames import read_native_mask, released_side
from cxrground.ils.layout import DATASET_FILE, MASK_DIR
from cxrground.ils.schema import read_dataset
from cxrground.io.image import CXRImage, read_image
from cxrground.io.transform import Letterbox
from cxrground.models.baseline.conditioning import CERTAINTIES, LI_LESIONS, encode, location_vector, parse
from cxrground.models.baseline.config import BaselineConfig
from cxrground.models.train_failures import STAGE
from cxrground.vocab.ils_templates import positive_answer
from cxrground.vocab.locations import ILS_LOCATION_LABELS

__all__ = ["PairRecord", "PairTensors", "WorkingImage", "check_lungs", "dataset_paths", "load_pairs", "lungs_identity",
           "make_segmenter", "prepare_image"]

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


@dataclass(frozen=True)
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
    ``data``: the dataset as :func:`~cxrground.ils.schema.read_dataset` gives it (read and checked here when
    None; a file it refuses is an :class:`~cxrground.errors.InputError` naming the file and the record)."""
    json_path, mask_root = dataset_paths(dataset)
    data = read_dataset(json_path) if data is None else data
    released = released_side(json_path)
    out: list[PairRecord] = []
    for key, study in data.get(split, {}).items():
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
    """Cached working-size tensors of a list of pairs; ``batch(indices)`` stacks a mini-batch."""

    def __init__(self, pairs: Sequence[PairRecord], images_root: Path, config: BaselineConfig,
                 segmenter: UNetLungSegmenter | None, progress: bool = True,
                 log: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.failures: list[Failure] = []
        studies: dict[str, WorkingImage] = {}
        by_study: dict[str, str] = {}
        for p in pairs:
            by_study.setdefault(p.study, p.image_path)
        for study, rel in tqdm(by_study.items(), desc="cache images", unit="img", disable=not progress):
            try:
                studies[study] = prepare_image(read_image(images_root / rel).pixels, config, segmenter)
            except InputError as exc:
                self.failures.append(Failure.from_exception((images_root / rel).absolute(), STAGE, exc))
                if log is not None:
                    log(f"skipping study {study}: {exc}")
        self.pairs = [p for p in pairs if p.study in studies]
        self.study_keys = list(studies)
        index = {k: i for i, k in enumerate(self.study_keys)}
        self.images = np.stack([studies[k].image for k in self.study_keys]) if studies else np.zeros((0,))
        self.anatomy = np.stack([studies[k].anatomy for k in self.study_keys]) if studies else np.zeros((0,))
        self.study_index = np.array([index[p.study] for p in self.pairs], dtype=np.int64)
        masks: dict[Path, int] = {}
        mask_list: list[np.ndarray] = [np.zeros((config.size, config.size), dtype=bool)]  # 0 = empty mask
        self.mask_index = np.zeros(len(self.pairs), dtype=np.int64)
        for i, p in enumerate(self.pairs):
            if p.mask_path is None:
                continue
            if p.mask_path not in masks:
                box = studies[p.study].box
                masks[p.mask_path] = len(mask_list)
                mask_list.append(box.mask_to_canvas(read_native_mask(p.mask_path, box.src_hw, p.released_size)))
            self.mask_index[i] = masks[p.mask_path]
        self.masks = np.stack(mask_list)
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
