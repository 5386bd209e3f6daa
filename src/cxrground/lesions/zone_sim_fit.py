"""Recipe of a zone reader trained on simulated lesions in real normal films (all shippable data).

- **Films**: the pack's NIH ChestX-ray14 films labelled ``No Finding`` (NIH: no restriction on use, attribution
  required), lungs from the shipped lung U-Net, on the anatomy working grid.
- **Zone labels**: each film gets :attr:`ZoneSimRecipe.copies` simulated versions
  (:func:`cxrground.lesions.lesion_sim.simulate_lesions`, seeds from the recipe's seed and the film id), the six
  zone labels read off the inserted lesions; some copies stay negative.
- **Features**: :func:`cxrground.lesions.zone_features.film_zone_features` under a normative model that never saw
  the film, read with the clean film's lungs or, when :attr:`ZoneSimRecipe.resegment` is set, with the lungs the
  shipped U-Net finds on the simulated copy (as ``anatomy zones`` reads an abnormal film; a copy on which it loses
  a lung is dropped), while the zone labels stay those of the inserted field on the clean lung zones. The NIH
  films are split into :data:`~cxrground.lesions.normative_fit.FOLDS` patient-grouped folds and each film's copies
  are read by the normative model fitted on the other folds' No Finding films (at inference the shipped
  ``normative_v1``, fitted on all of them, reads films it never saw either).
- **Classifier**: :meth:`cxrground.lesions.zone_classifier.ZoneClassifier.fit` (L2 logistic) on the recipe's
  feature columns; the flag threshold is Youden's J on the out-of-fold probabilities of the simulated zones (same
  folds). No COVID-19 or Brixia-scored film is used.

:func:`fit_from_pack` rebuilds the shipped file; :func:`simulated_zone_rows` and :func:`fit_zone_sim` are the
steps, used by ``bench/zone_sim.py`` too.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.anatomy.segment.base import LungHeartSegmenter, segment_image
from cxrground.anatomy.segment.builtin import work_box
from cxrground.datasets.pack import Pack
from cxrground.errors import ConfigError
from cxrground.io.cxr_image import CXRImage
from cxrground.lesions.lesion_sim import LesionSimParams, simulate_lesions
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS, NORMATIVE_METHOD, NormativeModel, fit_normative
from cxrground.lesions.normative_fit import FOLDS, nih_patient, patient_folds
from cxrground.lesions.zone_classifier import SHIPPED_ZONE_READER, ZoneClassifier, shipped_zone_reader_path
from cxrground.lesions.zone_features import FEATURE_NAMES, feature_columns, film_zone_features, normative_hash

__all__ = ["ZONE_SIM_NAME", "ZONE_SIM_V1", "ZoneSimRecipe", "default_zone_sim_path", "fit_from_pack", "fit_zone_sim",
           "fold_models", "oof_probability", "sim_seed", "simulated_zone_rows", "working_film", "youden_probability",
           "zone_probabilities"]

ZONE_SIM_NAME: Final[str] = SHIPPED_ZONE_READER

Film = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class ZoneSimRecipe:
    """Everything that decides the trained reader: lesions, copies per film, features, penalty, seed."""

    params: LesionSimParams = field(default_factory=LesionSimParams)
    copies: int = 8
    features: tuple[str, ...] = FEATURE_NAMES
    l2: float = 1.0
    seed: int = 0
    resegment: bool = False
    """Read each copy's features with the lungs the U-Net segments on the copy (round 2; labels unchanged)."""

    def __post_init__(self) -> None:
        if self.copies < 1:
            raise ConfigError(f"zone simulation needs at least one copy per film, got {self.copies}")
        if self.l2 < 0:
            raise ConfigError(f"l2 must be >= 0, got {self.l2}")
        feature_columns(self.features)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready description (for the sidecar); round-2 settings appear only when used, so round-1 recipes
        (``zone_sim_v1``'s sidecar) read as before."""
        params = asdict(self.params)
        if params["effusion_spill"] == (0.0, 0.0):
            params.pop("effusion_spill")
        out = {"params": params, "copies": self.copies, "features": list(self.features), "l2": self.l2,
               "seed": self.seed}
        return {**out, "resegment": True} if self.resegment else out


#: The shipped reader's recipe: chosen by the pre-registered rule of ``bench/zone_sim.py`` (default lesions, all
#: features, penalty 1; 8 copies per film, seed 0).
ZONE_SIM_V1: Final[ZoneSimRecipe] = ZoneSimRecipe()


def sim_seed(seed: int, film_id: str, copy: int) -> int:
    """The simulation seed of one copy of one film (stable across runs and film orders)."""
    return zlib.crc32(f"{seed}/{film_id}/{copy}".encode())


def working_film(pixels: np.ndarray, right: np.ndarray, left: np.ndarray) -> Film:
    """The film and lungs on the anatomy working grid (as ``anatomy zones`` reads a film)."""
    box = work_box(np.asarray(pixels).shape)
    if box is None:
        return pixels, right, left
    return box.image_to_canvas(pixels), box.mask_to_canvas(right), box.mask_to_canvas(left)


def simulated_zone_rows(films: Sequence[Film], film_ids: Sequence[str], models: Sequence[NormativeModel],
                        params: LesionSimParams, copies: int, seed: int,
                        segmenter: LungHeartSegmenter | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, y, film)``: all :data:`FEATURE_NAMES` of every simulated copy (copies × 6 × d), its zone labels and
    the index of its source film. ``films`` are on the working grid; ``models[i]`` reads film ``i``.

    With ``segmenter`` the features of a copy are read with the lungs it segments on the copy (the labels stay
    those of the clean film's zones); a copy on which it finds no right or no left lung is left out, so
    ``len(films) * copies - len(x)`` copies were dropped."""
    xs, ys, src = [], [], []
    for i, ((pixels, right, left), fid, model) in enumerate(zip(films, film_ids, models, strict=True)):
        for c in range(copies):
            sim = simulate_lesions(pixels, right, left, params, sim_seed(seed, fid, c))
            r, lft = right, left
            if segmenter is not None:
                seg = segment_image(segmenter, CXRImage(sim.pixels))
                r, lft = seg.right_lung, seg.left_lung
                if not (r.any() and lft.any()):
                    continue
            xs.append(film_zone_features(model, sim.pixels, r, lft)[0])
            ys.append(sim.labels)
            src.append(i)
    return np.array(xs), np.array(ys, dtype=bool), np.array(src, dtype=np.int64)


def youden_probability(pos: np.ndarray, neg: np.ndarray) -> float:
    """Probability threshold (flag when ≥) with the highest sensitivity + specificity − 1."""
    cands = np.unique(np.round(np.concatenate([np.ravel(pos), np.ravel(neg)]), 4))
    return float(max(cands, key=lambda t: (pos >= t).mean() - (neg >= t).mean()))


def oof_probability(x: np.ndarray, y: np.ndarray, folds: np.ndarray, features: Sequence[str],
                    l2: float) -> np.ndarray:
    """Out-of-fold zone probabilities (films × 6) of the classifier on ``features``; ``folds`` one per film."""
    cols = feature_columns(tuple(features))
    prob = np.zeros(y.shape)
    for k in np.unique(folds):
        tr = folds != k
        clf = ZoneClassifier.fit(x[tr][:, :, cols].reshape(-1, len(cols)), y[tr].ravel().astype(float),
                                 list(features), l2)
        prob[~tr] = clf.probability(x[~tr][:, :, cols].reshape(-1, len(cols))).reshape(-1, 6)
    return prob


def fit_zone_sim(x: np.ndarray, y: np.ndarray, folds: np.ndarray, recipe: ZoneSimRecipe,
                 meta: dict[str, Any] | None = None) -> ZoneClassifier:
    """The reader on all rows, its threshold by Youden's J on the out-of-fold simulated zones (``folds``)."""
    prob = oof_probability(x, y, folds, recipe.features, recipe.l2)
    threshold = youden_probability(prob[y], prob[~y])
    cols = feature_columns(recipe.features)
    return ZoneClassifier.fit(x[:, :, cols].reshape(-1, len(cols)), y.ravel().astype(float), list(recipe.features),
                              recipe.l2, threshold, meta)


def zone_probabilities(reader: ZoneClassifier, normative: NormativeModel, pixels: np.ndarray, right: np.ndarray,
                       left: np.ndarray) -> dict[str, float]:
    """Probability that each Brixia zone A–F is abnormal, as the reader was trained: the film on the anatomy
    working grid, features under ``normative`` (the shipped ``normative_v1``); flag a zone when it is at least
    ``reader.threshold``."""
    feats = film_zone_features(normative, *working_film(pixels, right, left))[0]
    prob = reader.probability(feats[:, feature_columns(reader.feature_names)])
    return {z: float(p) for z, p in zip(BRIXIA_ZONE_LABELS, prob, strict=True)}


def fold_models(films: Sequence[Film], patients: Sequence[str],
                normal: Sequence[bool] | None = None) -> tuple[list[NormativeModel], np.ndarray]:
    """Per film, the normative model fitted on the ``normal`` films (default: all) of the other folds; and the
    fold of each film (:func:`~cxrground.lesions.normative_fit.patient_folds`)."""
    folds = patient_folds(list(patients))
    ok = np.ones(len(films), bool) if normal is None else np.asarray(normal, bool)
    fitted = {k: fit_normative([f for f, fk, n in zip(films, folds, ok, strict=True) if fk != k and n])
              for k in range(FOLDS)}
    return [fitted[int(k)] for k in folds], folds


def default_zone_sim_path() -> Path:
    """Path of the shipped ``zone_sim_v1.npz`` (inside the installed package, next to ``normative_v1``)."""
    return shipped_zone_reader_path()


def _shipped_normative_record() -> dict[str, Any]:
    """The normative model whose z-map the reader reads at inference (``anatomy zones`` checks its sha256)."""
    shipped = NormativeModel.load()
    return {"path": Path(str(shipped.meta.get("path", "normative_v1.npz"))).name, "sha256": normative_hash(shipped),
            "method": NORMATIVE_METHOD}


def fit_from_pack(pack: Pack, segmenter: LungHeartSegmenter, recipe: ZoneSimRecipe | None = None) -> ZoneClassifier:
    """Rebuild the reader as described in the module docstring; the sidecar lists films, licence and recipe.

    The folds are those of ``bench/zone_sim.py``: every NIH film with both lungs, grouped by patient; each fold's
    No Finding films are read by the normative model of the other folds' No Finding films.
    """
    recipe = recipe or ZONE_SIM_V1
    films, ids, patients, normal = [], [], [], []
    for rec in pack.nih():
        im = rec.read()
        seg = segment_image(segmenter, im)
        if seg.right_lung.any() and seg.left_lung.any():
            films.append(working_film(im.pixels, seg.right_lung, seg.left_lung))
            ids.append(rec.image_id)
            patients.append(nih_patient(rec))
            normal.append(rec.labels == ("No Finding",))
    models, folds = fold_models(films, patients, normal)
    idx = np.flatnonzero(normal)
    x, y, src = simulated_zone_rows([films[i] for i in idx], [ids[i] for i in idx], [models[i] for i in idx],
                                    recipe.params, recipe.copies, recipe.seed,
                                    segmenter if recipe.resegment else None)
    lungs = "features read with the lungs the U-Net segments on each copy (copies losing a lung dropped), " \
        if recipe.resegment else ""
    meta: dict[str, Any] = {
        "name": ZONE_SIM_NAME,
        "summary": f"L2 logistic zone reader trained on {len(x)} simulated-lesion copies of {len(idx)} NIH "
                   "ChestX-ray14 films labelled No Finding (cxr-pack-v1 nih/), lungs from the shipped lung U-Net, "
                   f"{lungs}zone labels from the inserted lesions (cxrground.lesions.lesion_sim); threshold by "
                   "Youden's J on out-of-fold simulated zones. No COVID-19 film, no Brixia score used.",
        "licence": "NIH ChestX-ray14: no restriction on use, attribution required",
        "attribution": "NIH Clinical Center, https://nihcc.app.box.com/v/ChestXray-NIHCC; Wang et al., "
                       "ChestX-ray8, CVPR 2017",
        "films": [ids[i] for i in idx], "recipe": recipe.as_dict(), "copies_total": len(x),
        "abnormal_zones": int(y.sum()), "zones_total": int(y.size),
        "segmenter": segmenter.provenance().get("model_name", segmenter.name),
        "features_from": "normative z-map: per fold, the No Finding films of the other folds (inference: the "
                         "shipped normative_v1); anatomy working grid",
        "rebuild": "cxrground.lesions.zone_sim_fit.fit_from_pack(Pack(), get_segmenter('unet')).save(PATH)",
        "normative": _shipped_normative_record(),
    }
    return fit_zone_sim(x, y, folds[idx][src], recipe, meta)
