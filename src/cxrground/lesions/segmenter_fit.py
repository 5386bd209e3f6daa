"""Recipe of the lesion segmenter ``lesion_unet_v1``: a small U-Net trained on the CPU on lesions inserted into
real NIH films (all shippable data).

- **Base films**: the pack's NIH ChestX-ray14 films whose labels name no lung opacity, fluid or mass
  (:data:`BASE_EXCLUDED_LABELS`; ``No Finding``, Cardiomegaly, Emphysema, Pneumothorax, Hernia … stay): the
  unmodified parts of these films — ribs, clavicles, heart borders, breast shadows, large hearts — are the hard
  negatives. NIH: no restriction on use, attribution required. Lungs from the shipped lung U-Net. No COVID-19
  or Brixia-scored film is used.
- **Samples**: at every step each film of the batch gets a fresh simulated copy
  (:func:`~cxrground.lesions.lesion_sim.simulate_lesions` with :data:`PORTABLE_PARAMS`: more basal and diffuse
  disease, peripheral gradients and effusions that spill past the lung edge and hide the diaphragm), on the
  256-px letterboxed canvas, then a random small affine (scale, shift, rotation) and, on half the copies, a
  portable-film look (blur, lower contrast, noise). Pixel truth: added attenuation ≥ ``label_attenuation``.
- **Training**: Adam, BCE + soft Dice, :attr:`LesionUNetRecipe.steps` steps, one thread, deterministic for the
  seed. The films of one patient fold (:attr:`LesionUNetRecipe.val_fold` of
  :data:`~cxrground.lesions.normative_fit.FOLDS`) are held out and only choose the pixel threshold (highest
  pooled Dice on their simulated copies).

Rebuild the shipped file: ``python bench/lesion_unet_fit.py --out src/cxrground/lesions/weights/lesion_unet_v1``.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from scipy import ndimage

from cxrground.anatomy.segment.base import LungHeartSegmenter, segment_image
from cxrground.anatomy.segment.unet import UNetConfig, build_unet, normalise_canvas, save_model
from cxrground.datasets.pack import NIHRecord, Pack
from cxrground.errors import ConfigError
from cxrground.io.transform import Letterbox
from cxrground.lesions.lesion_sim import LesionSimParams, simulate_lesions
from cxrground.lesions.normative_fit import FOLDS, nih_patient, patient_folds
from cxrground.lesions.segmenter import LESION_UNET

__all__ = ["BASE_EXCLUDED_LABELS", "MIL_POSITIVE_LABELS", "PORTABLE_PARAMS", "BaseFilm", "LabelledFilm",
           "LesionUNetRecipe", "base_films", "choose_threshold", "film_score", "fit_from_pack", "labelled_films",
           "labelled_sample", "simulated_sample", "split_labelled", "train_segmenter"]

#: NIH labels that put lesions into the lungs; films carrying one are not used as base films.
BASE_EXCLUDED_LABELS: Final[frozenset[str]] = frozenset(
    {"Infiltration", "Consolidation", "Pneumonia", "Edema", "Atelectasis", "Effusion", "Mass", "Nodule",
     "Fibrosis", "Pleural_Thickening"})

#: NIH labels taken as "this film has a lung lesion of an ILS kind" for the multiple-instance loss.
MIL_POSITIVE_LABELS: Final[frozenset[str]] = frozenset(
    {"Infiltration", "Consolidation", "Pneumonia", "Edema", "Atelectasis", "Effusion"})

#: Lesions as on portable films: basal and diffuse disease more often, peripheral gradients, spilling effusions.
PORTABLE_PARAMS: Final[LesionSimParams] = LesionSimParams(
    p_negative=0.2, p_all_zones=0.3, lower_bias=3.0, p_effusion=0.35, p_ground_glass=0.45,
    ground_glass_attenuation=(0.08, 0.4), airspace_attenuation=(0.15, 0.8), effusion_attenuation=(0.3, 1.0),
    lateral_gradient=(0.0, 1.0), effusion_spill=(0.0, 0.12))


@dataclass(frozen=True)
class LesionUNetRecipe:
    """Everything that decides the trained segmenter."""

    params: LesionSimParams = PORTABLE_PARAMS
    channels: tuple[int, ...] = (8, 16, 32, 64, 128)
    size: int = 256
    steps: int = 700
    batch: int = 6
    lr: float = 3e-3
    seed: int = 0
    val_fold: int = 0
    val_copies: int = 3
    label_attenuation: float = 0.05
    p_portable: float = 0.5
    """Share of copies given the portable-film look (blur, lower contrast, noise)."""
    affine: tuple[float, float, float] = (0.12, 0.05, 6.0)
    """Random scale (±), shift (± fraction of the canvas) and rotation (± degrees)."""
    thresholds: tuple[float, ...] = (0.3, 0.4, 0.5, 0.6, 0.7)
    mil_weight: float = 0.0
    """Weight of the multiple-instance loss on real NIH films with image-level labels (0: simulated lesions only)."""
    mil_batch: int = 4
    """Real labelled films per step when ``mil_weight`` > 0 (half lung-lesion-labelled, half No Finding)."""
    mil_top: float = 0.02
    """The film's score is the mean probability of its top ``mil_top`` share of lung pixels (centre removed)."""
    init: str | None = None
    """Start from these weights (a lesion U-Net ``.safetensors``) instead of a random initialisation."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.lr <= 0:
            raise ConfigError("lesion U-Net recipe needs steps >= 1, batch >= 1 and lr > 0")
        if self.mil_weight < 0 or self.mil_batch < 2 or not 0 < self.mil_top <= 1:
            raise ConfigError("lesion U-Net recipe needs mil_weight >= 0, mil_batch >= 2 and mil_top in (0, 1]")
        if not 0 <= self.val_fold < FOLDS:
            raise ConfigError(f"val_fold must be in [0, {FOLDS}), got {self.val_fold}")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready description (for the sidecar)."""
        return {**asdict(self), "params": asdict(self.params)}


@dataclass(frozen=True, eq=False)
class BaseFilm:
    """A base film on the training canvas: uint8 pixels, lungs and the un-padded region."""

    film_id: str
    patient: str
    pixels: np.ndarray
    right: np.ndarray
    left: np.ndarray
    valid: np.ndarray = field(repr=False)


@dataclass(frozen=True, eq=False)
class LabelledFilm:
    """A real NIH film with its image-level label (1: a lung-lesion label, 0: No Finding) on the training canvas;
    ``region`` is where a lung lesion may be (lungs minus heart and mediastinum)."""

    film: BaseFilm
    label: int
    region: np.ndarray = field(repr=False)


def base_records(records: Sequence[NIHRecord]) -> list[NIHRecord]:
    """NIH records usable as base films (no label in :data:`BASE_EXCLUDED_LABELS`)."""
    return [r for r in records if not BASE_EXCLUDED_LABELS & set(r.labels)]


def _canvas_film(rec: NIHRecord, segmenter: LungHeartSegmenter, size: int) -> tuple[BaseFilm, np.ndarray | None] | None:
    """One record on the ``size`` canvas with the segmenter's lungs (and heart), or None without both lungs."""
    im = rec.read()
    seg = segment_image(segmenter, im)
    box = Letterbox.fit(im.pixels.shape[:2], size)
    r, lft = box.mask_to_canvas(seg.right_lung), box.mask_to_canvas(seg.left_lung)
    if not (r.any() and lft.any()):
        return None
    valid = np.zeros(box.canvas_hw, bool)
    valid[box.valid_region()] = True
    pix = np.clip(np.rint(box.image_to_canvas(im.pixels)), 0, 255).astype(np.uint8)
    heart = box.mask_to_canvas(seg.heart) if seg.heart is not None else None
    return BaseFilm(rec.image_id, nih_patient(rec), pix, r, lft, valid), heart


def base_films(records: Sequence[NIHRecord], segmenter: LungHeartSegmenter, size: int) -> list[BaseFilm]:
    """The base films on the ``size`` canvas with the segmenter's lungs; a film without both lungs is skipped."""
    films = (_canvas_film(rec, segmenter, size) for rec in base_records(records))
    return [f[0] for f in films if f is not None]


def labelled_films(records: Sequence[NIHRecord], segmenter: LungHeartSegmenter, size: int) -> list[LabelledFilm]:
    """The NIH films with a label of :data:`MIL_POSITIVE_LABELS` (label 1) or only ``No Finding`` (label 0), on
    the ``size`` canvas; films without both lungs are skipped."""
    from cxrground.lesions.lesion_zones import central_mask

    out = []
    for rec in records:
        labels = set(rec.labels)
        label = 1 if MIL_POSITIVE_LABELS & labels else 0 if labels == {"No Finding"} else None
        if label is None:
            continue
        made = _canvas_film(rec, segmenter, size)
        if made is None:
            continue
        film, heart = made
        region = (film.right | film.left) & ~central_mask(film.right, film.left, heart)
        out.append(LabelledFilm(film, label, region))
    return out


def _affine(rng: np.random.Generator, recipe: LesionUNetRecipe, arrays: Sequence[np.ndarray],
            orders: Sequence[int]) -> list[np.ndarray]:
    """The same random scale/shift/rotation applied to every array (about the canvas centre)."""
    s_amp, t_amp, r_amp = recipe.affine
    scale = 1.0 + rng.uniform(-s_amp, s_amp)
    ang = np.deg2rad(rng.uniform(-r_amp, r_amp))
    n = arrays[0].shape[0]
    shift = rng.uniform(-t_amp, t_amp, 2) * n
    rot = np.array([[np.cos(ang), -np.sin(ang)], [np.sin(ang), np.cos(ang)]]) / scale
    c = np.array([(n - 1) / 2.0] * 2)
    offset = c - rot @ (c + shift)
    return [ndimage.affine_transform(a, rot, offset, order=o, mode="constant", cval=0.0)
            for a, o in zip(arrays, orders, strict=True)]


def _portable(rng: np.random.Generator, img: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Blur, contrast reduction and noise, as on a bedside film (grey levels 0–255, float)."""
    out = ndimage.gaussian_filter(img, rng.uniform(0.3, 1.5))
    mean = float(out[valid].mean()) if valid.any() else 0.0
    out = mean + rng.uniform(0.65, 1.0) * (out - mean)
    out = out + rng.normal(0.0, rng.uniform(0.0, 5.0), img.shape)
    return np.clip(out, 0, 255)


def simulated_sample(film: BaseFilm, recipe: LesionUNetRecipe, seed: int,
                     augment: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(input, truth)``: the normalised canvas of one simulated copy and its lesion pixels (bool)."""
    sim = simulate_lesions(film.pixels, film.right, film.left, recipe.params, seed)
    truth = sim.attenuation >= recipe.label_attenuation
    return _network_input(sim.pixels, truth, film.valid, recipe, seed, augment)


def _network_input(pixels: np.ndarray, mask: np.ndarray, valid: np.ndarray, recipe: LesionUNetRecipe, seed: int,
                   augment: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(input, mask)`` of a canvas: the same random affine for image, mask and valid region, the portable look on
    :attr:`LesionUNetRecipe.p_portable` of the copies, then normalisation over the valid region."""
    img, m, v = pixels.astype(np.float32), mask.astype(np.float32), valid.astype(np.float32)
    if augment:
        rng = np.random.default_rng(seed ^ 0x5EED)
        img, m, v = _affine(rng, recipe, [img, m, v], [1, 0, 0])
        if rng.random() < recipe.p_portable:
            img = _portable(rng, img, v > 0.5)
    inside = v > 0.5
    return normalise_canvas(img / 255.0, inside), (m > 0.5) & inside


def labelled_sample(item: LabelledFilm, recipe: LesionUNetRecipe, seed: int,
                    augment: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(input, region)``: the normalised canvas of one real labelled film (augmented as the simulated copies)
    and the pixels its film score pools over."""
    return _network_input(item.film.pixels, item.region, item.film.valid, recipe, seed, augment)


def film_score(prob: Any, region: Any, top: float) -> Any:
    """Per film, the mean of the top ``top`` share of ``prob`` inside ``region`` (torch tensors ``(B, H, W)``;
    a film with an empty region scores 0)."""
    import torch

    scores = []
    for p, m in zip(prob, region, strict=True):
        vals = p[m]
        if vals.numel() == 0:
            scores.append(p.sum() * 0)
            continue
        k = max(1, round(top * vals.numel()))
        scores.append(torch.topk(vals, k).values.mean())
    return torch.stack(scores)


def _seed(recipe: LesionUNetRecipe, film_id: str, step: int) -> int:
    return zlib.crc32(f"{recipe.seed}/{film_id}/{step}".encode())


def split_labelled(labelled: Sequence[LabelledFilm], held: Sequence[BaseFilm],
                   val_fold: int) -> tuple[list[LabelledFilm], list[LabelledFilm]]:
    """``(train, held_out)`` labelled films: a film is held out when its patient has a held-out base film or
    falls in ``val_fold`` of the patient folds over the labelled films, so no held-out patient trains."""
    held_patients = {f.patient for f in held}
    folds = patient_folds([f.film.patient for f in labelled]) if labelled else np.zeros(0, np.int64)
    out: tuple[list[LabelledFilm], list[LabelledFilm]] = ([], [])
    for f, k in zip(labelled, folds, strict=True):
        out[int(f.film.patient in held_patients or k == val_fold)].append(f)
    return out


def _mil_pick(rng: np.random.Generator, labelled: Sequence[LabelledFilm], n: int) -> list[int]:
    """``n`` labelled films, half with label 1 and half with label 0 (with replacement when a class is short)."""
    out: list[int] = []
    for label, count in ((1, n - n // 2), (0, n // 2)):
        idx = [i for i, f in enumerate(labelled) if f.label == label]
        if not idx:
            raise ConfigError(f"the multiple-instance loss needs films with label {label}")
        out += [int(i) for i in rng.choice(idx, size=count, replace=len(idx) < count)]
    return out


def _mil_loss(model: Any, labelled: Sequence[LabelledFilm], recipe: LesionUNetRecipe, rng: np.random.Generator,
              step: int) -> Any:
    """Binary cross-entropy of the pooled film scores of a balanced batch of real labelled films."""
    import torch
    import torch.nn.functional as F

    pick = _mil_pick(rng, labelled, recipe.mil_batch)
    xs, regions = zip(*(labelled_sample(labelled[i], recipe, _seed(recipe, labelled[i].film.film_id, step))
                        for i in pick), strict=True)
    prob = torch.sigmoid(model(torch.from_numpy(np.stack(xs))[:, None]))[:, 0]
    score = film_score(prob, torch.from_numpy(np.stack(regions)), recipe.mil_top).clamp(1e-4, 1 - 1e-4)
    target = torch.tensor([float(labelled[i].label) for i in pick])
    return F.binary_cross_entropy(score, target)


def train_segmenter(films: Sequence[BaseFilm], recipe: LesionUNetRecipe,
                    log: Callable[[str], None] = print, labelled: Sequence[LabelledFilm] = ()) -> Any:
    """The trained U-Net (eval mode) on ``films`` (and, with ``recipe.mil_weight`` > 0, the image-level labels of
    ``labelled``); progress every 25 steps through ``log``."""
    import torch
    import torch.nn.functional as F

    from cxrground.anatomy.segment.unet import load_model

    torch.manual_seed(recipe.seed)
    config = UNetConfig(channels=recipe.channels, out_channels=1, input_size=recipe.size, classes=("lesion",))
    if recipe.init:
        model, _ = load_model(recipe.init)
    else:
        model = build_unet(config)
    opt = torch.optim.Adam(model.parameters(), lr=recipe.lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.lr, total_steps=recipe.steps, pct_start=0.1)
    rng = np.random.default_rng(recipe.seed)
    model.train()
    t0, run = time.time(), []
    for step in range(recipe.steps):
        pick = rng.choice(len(films), size=recipe.batch, replace=len(films) < recipe.batch)
        xs, ys = zip(*(simulated_sample(films[i], recipe, _seed(recipe, films[i].film_id, step)) for i in pick),
                     strict=True)
        x = torch.from_numpy(np.stack(xs))[:, None]
        y = torch.from_numpy(np.stack(ys).astype(np.float32))[:, None]
        logits = model(x)
        prob = torch.sigmoid(logits)
        dice = 1 - (2 * (prob * y).sum() + 1) / (prob.sum() + y.sum() + 1)
        loss = F.binary_cross_entropy_with_logits(logits, y) + dice
        if recipe.mil_weight > 0:
            loss = loss + recipe.mil_weight * _mil_loss(model, labelled, recipe, rng, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        run.append(loss.item())
        if (step + 1) % 25 == 0 or step == recipe.steps - 1:
            log(f"step {step + 1}/{recipe.steps} loss {np.mean(run[-25:]):.4f} {time.time() - t0:.0f}s")
    model.eval()
    return model, config


def film_scores(model: Any, labelled: Sequence[LabelledFilm], recipe: LesionUNetRecipe) -> np.ndarray:
    """The pooled film score (:func:`film_score`) of each labelled film, unaugmented."""
    import torch

    from cxrground.anatomy.segment.unet import predict_logits

    out = []
    for item in labelled:
        x, region = labelled_sample(item, recipe, 0, augment=False)
        p = torch.sigmoid(torch.from_numpy(predict_logits(model, x[None], 1)[0]))
        out.append(float(film_score(p, torch.from_numpy(region[None]), recipe.mil_top)[0]))
    return np.array(out)


def film_auroc(model: Any, labelled: Sequence[LabelledFilm], recipe: LesionUNetRecipe) -> float:
    """AUROC of the pooled film score, lung-lesion-labelled films against No Finding films (nan without both)."""
    from cxrground.lesions.zone_fit import auroc

    scores = film_scores(model, labelled, recipe)
    labels = np.array([f.label for f in labelled])
    return auroc(scores, labels.astype(bool)) if 0 < labels.sum() < len(labels) else float("nan")


def choose_threshold(model: Any, films: Sequence[BaseFilm], recipe: LesionUNetRecipe) -> tuple[float, dict[str, float]]:
    """The threshold of :attr:`LesionUNetRecipe.thresholds` with the highest pooled Dice on simulated copies of
    the held-out ``films`` (no augmentation), and the Dice of each."""
    from cxrground.anatomy.segment.unet import predict_logits

    inter = dict.fromkeys(recipe.thresholds, 0.0)
    total = dict.fromkeys(recipe.thresholds, 0.0)
    for film in films:
        for c in range(recipe.val_copies):
            x, y = simulated_sample(film, recipe, _seed(recipe, film.film_id, -1 - c), augment=False)
            p = 1 / (1 + np.exp(-predict_logits(model, x[None], 1)[0, 0]))
            for t in recipe.thresholds:
                m = p >= t
                inter[t] += float((m & y).sum())
                total[t] += float(m.sum() + y.sum())
    dice = {str(t): 2 * inter[t] / total[t] if total[t] else 0.0 for t in recipe.thresholds}
    best = max(recipe.thresholds, key=lambda t: (dice[str(t)], -abs(t - 0.5)))
    return float(best), dice


def fit_from_pack(pack: Pack, segmenter: LungHeartSegmenter, out: str | Path,
                  recipe: LesionUNetRecipe | None = None, log: Callable[[str], None] = print,
                  rebuild: str | None = None) -> dict[str, Any]:
    """Train a lesion U-Net as the module docstring says and write ``out.safetensors`` + ``out.json`` (``rebuild``:
    the command recorded in the sidecar); returns the sidecar's extra fields."""
    import torch

    r = recipe or LesionUNetRecipe()
    torch.set_num_threads(1)
    films = base_films(pack.nih(), segmenter, r.size)
    folds = patient_folds([f.patient for f in films])
    train = [f for f, k in zip(films, folds, strict=True) if k != r.val_fold]
    held = [f for f, k in zip(films, folds, strict=True) if k == r.val_fold]
    log(f"{len(train)} training films, {len(held)} held-out films")
    labelled = labelled_films(pack.nih(), segmenter, r.size) if r.mil_weight > 0 else []
    mil_train, mil_held = split_labelled(labelled, held, r.val_fold)
    if labelled:
        log(f"multiple-instance loss: {len(mil_train)} labelled training films "
            f"({sum(f.label for f in mil_train)} lung-lesion), {len(mil_held)} held out")
    model, config = train_segmenter(train, r, log, mil_train)
    threshold, dice = choose_threshold(model, held, r)
    log(f"held-out pooled Dice by threshold: {dice}; chosen {threshold}")
    weak: dict[str, Any] = {}
    if labelled:
        auroc = film_auroc(model, mil_held, r)
        log(f"held-out film AUROC (lung-lesion label vs No Finding, {len(mil_held)} films): {auroc:.3f}")
        weak = {"mil_training_films": [f.film.film_id for f in mil_train],
                "mil_held_out_films": [f.film.film_id for f in mil_held], "held_out_film_auroc": round(auroc, 4)}
    meta = {
        "name": Path(out).stem or LESION_UNET, "threshold": threshold,
        "summary": f"lesion U-Net trained on simulated lesions in {len(train)} NIH ChestX-ray14 films without lung "
                   f"lesion labels (cxr-pack-v1 nih/); pixel threshold by pooled Dice on {len(held)} held-out "
                   "patients' films",
        "licence": "NIH ChestX-ray14: no restriction on use; attribution required",
        "attribution": "NIH Clinical Center, https://nihcc.app.box.com/v/ChestXray-NIHCC; Wang et al., "
                       "ChestX-ray8, CVPR 2017",
        "recipe": r.as_dict(), "held_out_dice": dice,
        "training_films": [f.film_id for f in train], "held_out_films": [f.film_id for f in held],
        "segmenter": segmenter.provenance().get("model_name", segmenter.name),
        "rebuild": rebuild or "python bench/lesion_unet_fit.py --out src/cxrground/lesions/weights/lesion_unet_v1",
        **weak,
    }
    save_model(model, config, out, meta)
    return meta
