"""Training data of the lung U-Net: pack rows and synthetic phantoms, letterboxed to in-memory :class:`Samples`.

The ``pack`` rows are duck-typed (:class:`LungRecord`, :class:`LungPack`; anything with
``cohen(shippable_only=...)`` returning records with ``read()``, ``lungs(shape)``, ``ignore(shape)``,
``image_id``, ``patient_id``, ``license``, ``shippable``). :class:`PhantomRecord` makes a synthetic phantom
look like such a row; :func:`split_by_patient` keeps a patient's images on one side of the split.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from cxrground.errors import ConfigError
from cxrground.io.image import CXRImage
from cxrground.io.progress import progress_bar
from cxrground.io.transform import Letterbox

__all__ = [
    "LungPack",
    "LungRecord",
    "PhantomRecord",
    "Samples",
    "concat_samples",
    "lesioned_samples",
    "phantom_records",
    "prepare_samples",
    "split_by_patient",
    "synthetic_samples",
]


class LungRecord(Protocol):
    """What training needs from a pack row (``cxrground.datasets.pack.CohenRecord`` satisfies it)."""

    image_id: str
    patient_id: str
    license: str
    source_url: str
    doi: str

    @property
    def shippable(self) -> bool: ...

    def read(self) -> CXRImage: ...

    def lungs(self, shape: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]: ...

    def ignore(self, shape: tuple[int, int]) -> np.ndarray | None: ...


class LungPack(Protocol):
    """What training needs from the pack (``cxrground.datasets.pack.Pack`` satisfies it)."""

    def cohen(self, shippable_only: bool = False) -> Sequence[LungRecord]: ...


@dataclass
class Samples:
    """Letterboxed training arrays: images in [0, 1], targets, loss weights (0 = ignore), valid regions."""

    images: np.ndarray  # (N, S, S) float32
    targets: np.ndarray  # (N, C, S, S) float32 0/1
    weights: np.ndarray  # (N, S, S) float32
    valid: np.ndarray  # (N, S, S) bool, the un-padded canvas
    ids: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def subset(self, idx: Sequence[int]) -> Samples:
        """The samples at ``idx``."""
        ix = np.asarray(idx, dtype=np.int64)
        return Samples(self.images[ix], self.targets[ix], self.weights[ix], self.valid[ix],
                       [self.ids[i] for i in ix] if self.ids else [])


def prepare_samples(records: Iterable[LungRecord], size: int = 256, progress: bool = False) -> Samples:
    """Read images and lung masks, letterbox them to ``size``² (masks nearest-neighbour)."""
    images, targets, weights, valid, ids = [], [], [], [], []
    for rec in progress_bar(list(records), desc="load", unit="img", progress=progress):
        im = rec.read()
        right, left = rec.lungs(im.shape)
        ignore = rec.ignore(im.shape)
        box = Letterbox.fit(im.shape, size)
        images.append(box.image_to_canvas(im.pixels).astype(np.float32) / 255.0)
        targets.append(np.stack([box.mask_to_canvas(right), box.mask_to_canvas(left)]).astype(np.float32))
        w = np.ones((size, size), dtype=np.float32)
        if ignore is not None:
            w[box.mask_to_canvas(ignore)] = 0.0
        weights.append(w)
        v = np.zeros((size, size), dtype=bool)
        v[box.valid_region()] = True
        valid.append(v)
        ids.append(rec.image_id)
    if not images:
        raise ConfigError("no training records")
    return Samples(np.stack(images), np.stack(targets), np.stack(weights), np.stack(valid), ids)


class PhantomRecord:
    """A synthetic phantom as a pack-like row (exact right/left lung masks, no ignore region).

    The study is generated on first use (``cxrground.datasets.synthetic.generate_study``, imported lazily:
    :mod:`cxrground.anatomy` does not import :mod:`cxrground.datasets` at import time) and kept.
    """

    license = "cxrground synthetic phantom (the project's own data, no licence restriction)"
    source_url = ""
    doi = ""
    shippable = True

    def __init__(self, seed: int, index: int, config: Any = None) -> None:
        self.seed, self.index, self.config = int(seed), int(index), config
        self.image_id = f"synth-{self.seed}-{self.index}"
        self.patient_id = self.image_id
        self._study: Any = None

    def _get(self) -> Any:
        if self._study is None:
            from cxrground.datasets.synthetic import generate_study

            self._study = generate_study(self.seed, self.index, self.config)
        return self._study

    def read(self) -> CXRImage:
        return CXRImage(self._get().image)

    def lungs(self, shape: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        m = self._get().anatomy_masks
        if shape is not None and tuple(shape) != m["right_lung"].shape:
            raise ConfigError(f"phantom {self.image_id} has shape {m['right_lung'].shape}, not {shape}")
        return m["right_lung"].astype(bool), m["left_lung"].astype(bool)

    def ignore(self, shape: tuple[int, int]) -> np.ndarray | None:
        return None

    def release(self) -> None:
        """Drop the generated study (it is regenerated identically on the next use)."""
        self._study = None


def phantom_records(n: int, seed: int, config: Any = None) -> list[PhantomRecord]:
    """Phantoms ``0..n-1`` of ``seed`` as :class:`PhantomRecord` rows (``config``: a ``SynthConfig``)."""
    return [PhantomRecord(seed, i, config) for i in range(int(n))]


def synthetic_samples(n: int, seed: int, config: Any = None, size: int = 256, progress: bool = False) -> Samples:
    """Training arrays of phantoms ``0..n-1`` of ``seed``, letterboxed like the real rows (weights all 1)."""
    parts = []
    for rec in progress_bar(phantom_records(n, seed, config), desc="phantoms", unit="img", progress=progress):
        parts.append(prepare_samples([rec], size))
        rec.release()
    return concat_samples(*parts)


def concat_samples(*parts: Samples) -> Samples:
    """The samples of ``parts`` one after the other."""
    parts = tuple(p for p in parts if len(p))
    if not parts:
        raise ConfigError("no samples to concatenate")
    return Samples(np.concatenate([p.images for p in parts]), np.concatenate([p.targets for p in parts]),
                   np.concatenate([p.weights for p in parts]), np.concatenate([p.valid for p in parts]),
                   [i for p in parts for i in p.ids])


def lesioned_samples(samples: Samples, copies: int, seed: int, params: Any = None) -> Samples:
    """``copies`` variants of every sample with simulated lesions inside its lungs, targets unchanged.

    Lesions come from :func:`cxrground.lesions.lesion_sim.simulate_lesions` (``params``: its
    ``LesionSimParams``) on the letterboxed canvas, seed ``seed * 1_000_003 + sample * 101 + copy``; the
    padding stays 0. A sample with an empty lung is skipped. Ids get ``#lesionK``.
    """
    from cxrground.errors import InputError
    from cxrground.lesions.lesion_sim import simulate_lesions

    images, keep, ids = [], [], []
    for i in range(len(samples)):
        right, left = samples.targets[i, 0] > 0.5, samples.targets[i, 1] > 0.5
        px = np.clip(np.rint(samples.images[i] * 255.0), 0, 255).astype(np.uint8)
        for c in range(int(copies)):
            try:
                film = simulate_lesions(px, right, left, params, seed=int(seed) * 1_000_003 + i * 101 + c)
            except InputError:
                continue
            images.append((film.pixels.astype(np.float32) / 255.0) * samples.valid[i])
            keep.append(i)
            ids.append(f"{samples.ids[i] if samples.ids else i}#lesion{c}")
    if not images:
        raise ConfigError("no lesioned samples (every sample has an empty lung)")
    ix = np.asarray(keep, dtype=np.int64)
    return Samples(np.stack(images).astype(np.float32), samples.targets[ix].copy(), samples.weights[ix].copy(),
                   samples.valid[ix].copy(), ids)


def split_by_patient(records: Sequence[LungRecord], val_count: int, seed: int) -> tuple[list[int], list[int]]:
    """Indices (train, val): whole patients drawn in a seeded order until ``val`` has ≥ ``val_count`` images."""
    patients = sorted({r.patient_id for r in records})
    order = np.random.default_rng(seed).permutation(len(patients))
    val_patients: set[str] = set()
    n_val = 0
    for k in order:
        if n_val >= val_count:
            break
        pid = patients[int(k)]
        val_patients.add(pid)
        n_val += sum(r.patient_id == pid for r in records)
    val = [i for i, r in enumerate(records) if r.patient_id in val_patients]
    train = [i for i, r in enumerate(records) if r.patient_id not in val_patients]
    return train, val
