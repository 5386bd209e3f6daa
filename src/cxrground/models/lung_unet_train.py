"""Training of the built-in lung U-Net on the shippable rows of the data pack.

Data: ONLY ``pack.cohen(shippable_only=True)`` (CC BY 3.0 / CC BY 4.0 / "authorized for everyone" images
with V7 Labs lung masks, CC BY 4.0) train and select the model; about ``val_count`` of them (whole patients)
are held out for early stopping. The CC BY-NC-SA rows are used for evaluation only, after training, and
never influence the weights. No heart channel is trained (the pack has no heart masks; synthetic phantoms
are too far from real images): the heart is estimated from the lungs (:mod:`.heart`).

Synthetic phantoms (``recipe.synthetic_count``; the project's own data from
:func:`cxrground.datasets.synthetic.generate_study`, no licence restriction) can join the *training* split
(:func:`synthetic_samples`: letterboxed like the real rows, loss weight 1 everywhere). Their lungs stop at
the heart border while the real annotations include the retrocardiac lung, so a model trained on real rows
alone over-segments the phantoms' left lung; mixing them in teaches both conventions (the image tells them
apart). Validation / model selection stays real-only. ``metrics.synthetic_eval`` is the Dice on
``synthetic_eval_count`` phantoms of ``synthetic_eval_seed`` (1000), a seed never used for training.
``recipe.init_weights`` fine-tunes an existing model instead of starting fresh.

Recipe (defaults of :class:`TrainRecipe`): images letterboxed to 256² (``zscore-valid`` normalisation);
on-the-fly augmentation per sample: random affine (rotation ±10°, scale 0.88–1.12, shift ±6 % of the
canvas; never a flip: right and left matter), then gamma 0.7–1.45, contrast 0.8–1.25, brightness ±0.08;
loss = BCE + soft Dice (per image and channel), the annotators' "ignore" regions weighted 0; AdamW
(lr 3e-3, weight decay 1e-4), one warm-up epoch then cosine decay to 1 %; batch 8; 40 epochs; keep the
weights of the epoch with the best validation Dice, stop after ``patience`` (15) epochs without improvement.
These defaults, seed 0 and 2 threads made the first ``lung_unet_v1`` (best epoch 27 of 40; about 8–10 s
per epoch on 2 idle cores, i.e. 5.5–7 min; slower when other processes share the cores). The shipped
``lung_unet_v1`` fine-tunes that model (``init_weights``, sha256 ``5de8d3e6…``) with lr 1e-3, warm-up 0.5
epoch, 16 epochs, seed 0, on the same 87 real training rows + 200 phantoms (seed 1, indices 0–199; ~27 s
per epoch, 8.3 min; best real-validation epoch 12): NC Dice 0.915 → 0.932, phantom (seed 1000) left-lung
Dice 0.771 → 0.986.

Determinism: ``torch.manual_seed(seed)``, a seeded ``torch.Generator`` for augmentation, a seeded numpy
generator for the split, ``torch.use_deterministic_algorithms(True)`` (it works for these CPU ops) and a
fixed thread count: the same seed on the same machine and thread count gives identical weights.

The ``pack`` argument is duck-typed (anything with ``cohen(shippable_only=...)`` returning records with
``read()``, ``lungs(shape)``, ``ignore(shape)``, ``image_id``, ``patient_id``, ``license``, ``shippable``)
so that :mod:`cxrground.anatomy` does not import :mod:`cxrground.datasets` (a later stage).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from tqdm.auto import tqdm

from cxrground.anatomy.segment.unet import UNetConfig
from cxrground.errors import ConfigError
from cxrground.io.image import CXRImage
from cxrground.io.transform import Letterbox

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "Augment",
    "PhantomRecord",
    "Samples",
    "TrainRecipe",
    "TrainResult",
    "concat_samples",
    "dice",
    "evaluate_records",
    "evaluate_synthetic",
    "phantom_records",
    "prepare_samples",
    "split_by_patient",
    "synthetic_samples",
    "train_lung_unet",
    "train_on_samples",
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


@dataclass(frozen=True)
class Augment:
    """On-the-fly augmentation ranges (no flips: right and left matter)."""

    rotate_deg: float = 10.0
    scale: tuple[float, float] = (0.88, 1.12)
    shift: float = 0.06
    """Maximum shift as a fraction of the canvas side."""
    gamma: tuple[float, float] = (0.7, 1.45)
    contrast: tuple[float, float] = (0.8, 1.25)
    brightness: float = 0.08
    enabled: bool = True


@dataclass(frozen=True)
class TrainRecipe:
    """Optimisation settings (see the module docstring)."""

    epochs: int = 40
    batch_size: int = 8
    lr: float = 3e-3
    weight_decay: float = 1e-4
    warmup_epochs: float = 1.0
    val_count: int = 10
    patience: int = 15
    bce_weight: float = 1.0
    dice_weight: float = 1.0
    threads: int = 2
    deterministic: bool = True
    augment: Augment = field(default_factory=Augment)
    max_minutes: float | None = None
    """Stop after the epoch that crosses this wall-clock budget (None: no limit)."""
    synthetic_count: int = 0
    """Synthetic phantoms (indices ``0..n-1`` of ``synthetic_seed``) mixed into the training set (not into
    the validation split, which stays real-only)."""
    synthetic_seed: int = 1
    synthetic_eval_seed: int = 1000
    """Seed of the phantoms the ``synthetic_eval`` metrics use; must differ from ``synthetic_seed``."""
    synthetic_eval_count: int = 40
    init_weights: str | None = None
    """Fine-tune from these weights (a model file name, recorded with its sha256) instead of a fresh init."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


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


@dataclass
class TrainResult:
    """What :func:`train_lung_unet` produced."""

    weights_path: Path
    sidecar_path: Path
    metrics: dict[str, Any]
    history: list[dict[str, float]]
    train_seconds: float
    sidecar: dict[str, Any]


def prepare_samples(records: Iterable[LungRecord], size: int = 256, progress: bool = False) -> Samples:
    """Read images and lung masks, letterbox them to ``size``² (masks nearest-neighbour)."""
    images, targets, weights, valid, ids = [], [], [], [], []
    for rec in tqdm(list(records), desc="load", unit="img", disable=not progress):
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
    for rec in tqdm(phantom_records(n, seed, config), desc="phantoms", unit="img", disable=not progress):
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


# --- torch parts ------------------------------------------------------------------------------------

def _augment_batch(
    img: torch.Tensor, tgt: torch.Tensor, wgt: torch.Tensor, val: torch.Tensor, aug: Augment, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random affine (image bilinear, masks bilinear then > 0.5, weights/valid nearest) + intensity."""
    import torch
    import torch.nn.functional as F

    b = img.shape[0]

    def uni(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(b, generator=gen)

    ang = uni(-aug.rotate_deg, aug.rotate_deg) * (math.pi / 180.0)
    scale = torch.exp(uni(math.log(aug.scale[0]), math.log(aug.scale[1])))
    tx, ty = uni(-2 * aug.shift, 2 * aug.shift), uni(-2 * aug.shift, 2 * aug.shift)
    cos, sin = torch.cos(ang) / scale, torch.sin(ang) / scale
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(theta, list(img.shape), align_corners=False)
    img = F.grid_sample(img, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    tgt = (F.grid_sample(tgt, grid, mode="bilinear", padding_mode="zeros", align_corners=False) > 0.5).float()
    ign = F.grid_sample(1.0 - wgt, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    wgt = 1.0 - ign
    val = F.grid_sample(val, grid, mode="nearest", padding_mode="zeros", align_corners=False)

    gamma = torch.exp(uni(math.log(aug.gamma[0]), math.log(aug.gamma[1]))).view(b, 1, 1, 1)
    contrast = uni(*aug.contrast).view(b, 1, 1, 1)
    bright = uni(-aug.brightness, aug.brightness).view(b, 1, 1, 1)
    img = img.clamp(0.0, 1.0) ** gamma
    img = ((img - 0.5) * contrast + 0.5 + bright).clamp(0.0, 1.0)
    return img, tgt, wgt, val


def _normalise(img: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """Per-sample ``zscore-valid`` normalisation (see :func:`.unet.normalise_canvas`)."""
    import torch

    from cxrground.anatomy.segment.unet import NORM_EPS

    n = val.sum(dim=(1, 2, 3), keepdim=True).clamp_min(1.0)
    mean = (img * val).sum(dim=(1, 2, 3), keepdim=True) / n
    var = (((img - mean) * val) ** 2).sum(dim=(1, 2, 3), keepdim=True) / n
    out = (img - mean) / torch.sqrt(var).clamp_min(NORM_EPS)
    return out * val


def _loss(logits: torch.Tensor, tgt: torch.Tensor, wgt: torch.Tensor, recipe: TrainRecipe) -> torch.Tensor:
    import torch
    import torch.nn.functional as F

    w = wgt.expand_as(tgt)
    bce = (F.binary_cross_entropy_with_logits(logits, tgt, reduction="none") * w).sum() / w.sum().clamp_min(1.0)
    prob = torch.sigmoid(logits)
    inter = (prob * tgt * w).sum(dim=(2, 3))
    denom = (prob * w).sum(dim=(2, 3)) + (tgt * w).sum(dim=(2, 3))
    soft_dice = (2.0 * inter + 1.0) / (denom + 1.0)
    return recipe.bce_weight * bce + recipe.dice_weight * (1.0 - soft_dice.mean())


def dice(pred: np.ndarray, truth: np.ndarray, ignore: np.ndarray | None = None) -> float:
    """Dice of two bool masks (pixels in ``ignore`` left out); 1.0 when both are empty."""
    if ignore is not None:
        pred, truth = pred & ~ignore, truth & ~ignore
    total = int(pred.sum()) + int(truth.sum())
    return 1.0 if total == 0 else 2.0 * int((pred & truth).sum()) / total


def _canvas_dice(model: torch.nn.Module, samples: Samples, batch: int = 8) -> float:
    """Mean Dice over images and lungs on the canvas (logit > 0), ignore regions left out."""
    import torch

    scores = []
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(samples), batch):
            sl = slice(start, start + batch)
            img = torch.from_numpy(samples.images[sl])[:, None]
            val = torch.from_numpy(samples.valid[sl].astype(np.float32))[:, None]
            logits = model(_normalise(img, val)).numpy()
            for k in range(logits.shape[0]):
                ign = samples.weights[sl][k] == 0
                for c in range(logits.shape[1]):
                    scores.append(dice(logits[k, c] > 0, samples.targets[sl][k, c] > 0.5, ign))
    model.train()
    return float(np.mean(scores)) if scores else float("nan")


def train_on_samples(
    train: Samples,
    val: Samples | None,
    config: UNetConfig,
    recipe: TrainRecipe,
    seed: int = 0,
    progress: bool = True,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
    init_state: dict[str, Any] | None = None,
) -> tuple[torch.nn.Module, list[dict[str, float]]]:
    """Train a U-Net on in-memory samples; returns the best-on-validation (or last) model and the history.

    ``recipe.epochs`` epochs (fewer with early stopping or ``max_minutes``); one history row per epoch:
    ``epoch``, ``loss`` (mean training loss), ``val_dice`` (when ``val`` is given), ``seconds``.
    ``init_state`` (a state dict) starts from those weights instead of a fresh initialisation.
    """
    import torch

    from cxrground.anatomy.segment.unet import build_unet

    if len(train) == 0:
        raise ConfigError("no training samples")
    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    if recipe.threads > 0:
        torch.set_num_threads(recipe.threads)
    if recipe.deterministic:
        torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        model = build_unet(config)
        if init_state is not None:
            model.load_state_dict(init_state)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
        steps_per_epoch = max(1, math.ceil(len(train) / recipe.batch_size))
        total = steps_per_epoch * recipe.epochs
        warm = max(1, round(recipe.warmup_epochs * steps_per_epoch))

        def lr_at(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            t = (step - warm) / max(1, total - warm)
            return 0.01 + 0.99 * 0.5 * (1.0 + math.cos(math.pi * min(t, 1.0)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
        images = torch.from_numpy(train.images)[:, None]
        targets = torch.from_numpy(train.targets)
        weights = torch.from_numpy(train.weights)[:, None]
        valid = torch.from_numpy(train.valid.astype(np.float32))[:, None]

        history: list[dict[str, float]] = []
        best_state, best_score, since_best = None, -1.0, 0
        start = time.perf_counter()
        bar = tqdm(total=total, desc="train lungs", unit="step", disable=not progress)
        for epoch in range(recipe.epochs):
            perm = torch.randperm(len(train), generator=gen)
            losses = []
            for s in range(steps_per_epoch):
                idx = perm[s * recipe.batch_size : (s + 1) * recipe.batch_size]
                img, tgt, wgt, val_ = images[idx], targets[idx], weights[idx], valid[idx]
                if recipe.augment.enabled:
                    img, tgt, wgt, val_ = _augment_batch(img, tgt, wgt, val_, recipe.augment, gen)
                logits = model(_normalise(img, val_))
                loss = _loss(logits, tgt, wgt, recipe)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                losses.append(float(loss.detach()))
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}")
            row: dict[str, float] = {"epoch": epoch + 1, "loss": float(np.mean(losses)),
                                     "seconds": time.perf_counter() - start}
            if val is not None and len(val):
                score = _canvas_dice(model, val)
                row["val_dice"] = score
                if score > best_score:
                    best_score, since_best = score, 0
                    best_state = copy.deepcopy(model.state_dict())
                    row["best"] = 1.0
                else:
                    since_best += 1
                bar.set_postfix(epoch=epoch + 1, loss=f"{row['loss']:.4f}", val_dice=f"{score:.4f}")
            history.append(row)
            if on_epoch is not None:
                on_epoch(row)
            if val is not None and since_best >= recipe.patience:
                break
            if recipe.max_minutes is not None and row["seconds"] > 60.0 * recipe.max_minutes:
                break
        bar.close()
        if best_state is not None:
            model.load_state_dict(best_state)
        model.eval()
        return model, history
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det)


def evaluate_records(segmenter: Any, records: Iterable[LungRecord], progress: bool = False) -> dict[str, Any]:
    """Dice per lung at native size (annotators' ignore regions left out) of ``segmenter.segment``."""
    rows = []
    for rec in tqdm(list(records), desc="evaluate", unit="img", disable=not progress):
        im = rec.read()
        right, left = rec.lungs(im.shape)
        ign = rec.ignore(im.shape)
        masks = segmenter.segment(im)
        rows.append((rec.image_id, dice(masks.right_lung, right, ign), dice(masks.left_lung, left, ign)))
    if not rows:
        return {"n": 0}
    arr = np.asarray([(r, lft) for _, r, lft in rows], dtype=np.float64)
    both = arr.mean(axis=1)
    return {
        "n": len(rows),
        "dice_mean": round(float(both.mean()), 4),
        "dice_right_mean": round(float(arr[:, 0].mean()), 4),
        "dice_left_mean": round(float(arr[:, 1].mean()), 4),
        "dice_median": round(float(np.median(both)), 4),
        "dice_right_median": round(float(np.median(arr[:, 0])), 4),
        "dice_left_median": round(float(np.median(arr[:, 1])), 4),
        "dice_min": round(float(both.min()), 4),
        "below_0_8": int((both < 0.8).sum()),
        "per_image": {i: [round(r, 4), round(lft, 4)] for i, r, lft in rows},
    }


def evaluate_synthetic(segmenter: Any, n: int = 40, seed: int = 1000, config: Any = None,
                       progress: bool = False) -> dict[str, Any]:
    """:func:`evaluate_records` on phantoms ``0..n-1`` of ``seed`` (exact lung masks), without per-image rows."""
    recs = phantom_records(n, seed, config)
    res = _strip(evaluate_records(segmenter, recs, progress=progress))
    for r in recs:
        r.release()
    return res


def _synthetic_entry(seed: int, n: int, config: Any, use: str) -> dict[str, Any]:
    from cxrground.datasets.synthetic import SynthConfig
    from cxrground.datasets.synthetic.config import GENERATOR_NAME, GENERATOR_VERSION

    cfg = config or SynthConfig()
    return {"generator": GENERATOR_NAME, "generator_version": GENERATOR_VERSION, "config_hash": cfg.config_hash(),
            "config": "SynthConfig() defaults" if config is None else "custom SynthConfig",
            "seed": int(seed), "indices": f"0..{int(n) - 1}", "count": int(n),
            "license": "the project's own synthetic phantoms (no licence restriction)", "use": use}


def _record_entry(rec: LungRecord) -> dict[str, str]:
    return {"image": rec.image_id, "patient": rec.patient_id, "license": rec.license,
            "source_url": rec.source_url, "doi": rec.doi}


def _licence_counts(records: Iterable[LungRecord]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[r.license] = out.get(r.license, 0) + 1
    return dict(sorted(out.items()))


def train_lung_unet(
    pack: LungPack,
    out_dir: str | Path,
    epochs: int = 40,
    seed: int = 0,
    *,
    recipe: TrainRecipe | None = None,
    config: UNetConfig | None = None,
    name: str = "lung_unet_v1",
    evaluate: bool = True,
    progress: bool = True,
    storage_dtype: str = "float16",
    limit: int | None = None,
    synth_config: Any = None,
) -> TrainResult:
    """Train the lung U-Net on the pack's shippable rows, evaluate on the NC rows, write model + sidecar.

    ``epochs`` overrides ``recipe.epochs``. ``limit`` (tests) caps the number of training images.
    ``recipe.synthetic_count`` phantoms of ``recipe.synthetic_seed`` (``synth_config``, default
    ``SynthConfig()``) join the training split; ``recipe.synthetic_eval_count`` phantoms of
    ``recipe.synthetic_eval_seed`` are evaluated (``metrics.synthetic_eval``). ``recipe.init_weights``
    fine-tunes from an existing model file. Writes ``out_dir/NAME.safetensors`` and ``out_dir/NAME.json``.
    """
    import torch

    from cxrground.anatomy.segment.builtin import UNetLungSegmenter
    from cxrground.anatomy.segment.heart import HEART_METHOD
    from cxrground.anatomy.segment.unet import save_model, update_sidecar

    recipe = recipe or TrainRecipe()
    recipe = dataclasses.replace(recipe, epochs=int(epochs))
    config = config or UNetConfig()
    if recipe.synthetic_count and recipe.synthetic_eval_count and recipe.synthetic_seed == recipe.synthetic_eval_seed:
        raise ConfigError(f"synthetic training seed {recipe.synthetic_seed} is also the evaluation seed")
    init_state, init_info = None, None
    if recipe.init_weights:
        from cxrground.anatomy.segment.unet import load_model

        init_model, init_meta = load_model(recipe.init_weights)
        if UNetConfig.from_dict(init_meta["architecture"]) != config:
            raise ConfigError(f"{recipe.init_weights}: architecture differs from the training config")
        init_state = {k: v.clone() for k, v in init_model.state_dict().items()}
        init_training = init_meta.get("training", {})
        init_info = {"name": init_meta.get("name"), "sha256": init_meta.get("sha256"),
                     "training": {k: init_training[k] for k in ("recipe", "seed", "epochs_run", "train_seconds", "init")
                                  if k in init_training},
                     "metrics": {k: _strip(v) if isinstance(v, dict) else v
                                 for k, v in init_meta.get("metrics", {}).items()}}
    shippable = [r for r in pack.cohen(shippable_only=True) if r.shippable]
    if limit is not None:
        shippable = shippable[: int(limit)]
    if len(shippable) < 2:
        raise ConfigError(f"need at least 2 shippable training images, found {len(shippable)}")
    train_idx, val_idx = split_by_patient(shippable, min(recipe.val_count, len(shippable) // 2), seed)
    t0 = time.perf_counter()
    samples = prepare_samples(shippable, config.input_size, progress=progress)
    train_s, val_s = samples.subset(train_idx), samples.subset(val_idx)
    if recipe.synthetic_count:
        synth = synthetic_samples(recipe.synthetic_count, recipe.synthetic_seed, synth_config, config.input_size,
                                  progress=progress)
        train_s = concat_samples(train_s, synth)
    load_seconds = time.perf_counter() - t0
    model, history = train_on_samples(train_s, val_s, config, recipe, seed=seed, progress=progress,
                                      init_state=init_state)
    train_seconds = history[-1]["seconds"] if history else 0.0
    best = max((h for h in history if "val_dice" in h), key=lambda h: h["val_dice"], default=None)
    eval_records: list[LungRecord] = []
    if evaluate:
        eval_records = [r for r in pack.cohen(shippable_only=False) if not r.shippable]
        if limit is not None:
            eval_records = eval_records[: int(limit)]

    sidecar = {
        "name": name,
        "training": {
            "recipe": recipe.to_dict(),
            "seed": seed,
            "epochs_run": len(history),
            "train_seconds": round(train_seconds, 1),
            "load_seconds": round(load_seconds, 1),
            "history": [{k: round(v, 5) for k, v in h.items()} for h in history],
            "loss": "BCE + soft Dice (per image and channel), ignore regions weighted 0",
            "selection": "weights of the epoch with the best validation Dice (canvas, logit > 0)",
            "deterministic": recipe.deterministic,
            "hardware": f"CPU, {recipe.threads} threads, {platform.machine()}",
            "init": init_info or "fresh initialisation (torch defaults, seeded)",
        },
        "data": {
            "summary": (f"{len(train_idx)} train + {len(val_idx)} validation images from cxr-pack-v1 cohen/ "
                        f"rows with licences {sorted(_licence_counts(shippable))}"
                        + (f" + {recipe.synthetic_count} synthetic phantoms (train only)" if recipe.synthetic_count
                           else "")
                        + "; NC rows for evaluation only"),
            "collection": "COVID-19 image data collection, Cohen, Morrison, Dao, arXiv:2003.11597 (2020)",
            "masks": "V7 Labs COVID-19 X-ray annotations (lung masks), CC BY 4.0; split into right/left lungs",
            "train": [_record_entry(shippable[i]) for i in train_idx],
            "validation": [_record_entry(shippable[i]) for i in val_idx],
            "train_licences": _licence_counts(shippable),
            "evaluation": {
                "rows": len(eval_records),
                "licences": _licence_counts(eval_records),
                "use": "evaluation only (non-commercial licences); never used for training or model selection",
            },
            "synthetic_train": (_synthetic_entry(recipe.synthetic_seed, recipe.synthetic_count, synth_config,
                                                 "training split only (not validation / model selection)")
                                if recipe.synthetic_count else None),
            "synthetic_eval": (_synthetic_entry(recipe.synthetic_eval_seed, recipe.synthetic_eval_count,
                                                synth_config, "evaluation only (metrics.synthetic_eval)")
                               if evaluate and recipe.synthetic_eval_count else None),
        },
        "metrics": {},
        "heart": f"not predicted; estimated from the lungs ({HEART_METHOD}), heart_source='estimate'",
        "software": {"torch": torch.__version__, "python": platform.python_version()},
    }
    out = Path(out_dir)
    weights_path, json_path = save_model(model, config, out / name, sidecar, storage_dtype=storage_dtype)

    # metrics of the weights as stored (float16 storage), through the segmenter users get
    segmenter = UNetLungSegmenter(weights_path, estimate_heart=False)
    metrics: dict[str, Any] = {
        "val_canvas_dice_best": round(best["val_dice"], 4) if best else None,
        "best_epoch": int(best["epoch"]) if best else None,
    }
    if evaluate:
        metrics["val_native"] = _strip(evaluate_records(segmenter, [shippable[i] for i in val_idx]))
        t1 = time.perf_counter()
        nc = evaluate_records(segmenter, eval_records, progress=progress)
        nc["seconds"] = round(time.perf_counter() - t1, 1)
        metrics["nc_eval"] = nc
        if recipe.synthetic_eval_count:
            t1 = time.perf_counter()
            syn = evaluate_synthetic(segmenter, recipe.synthetic_eval_count, recipe.synthetic_eval_seed,
                                     synth_config, progress=progress)
            syn["seconds"] = round(time.perf_counter() - t1, 1)
            metrics["synthetic_eval"] = syn
    final = update_sidecar(json_path, {"metrics": metrics})
    return TrainResult(weights_path, json_path, metrics, history, train_seconds, final)


def _strip(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "per_image"}
