"""Recipe of the shipped normative model (``normative_v1``): which films, which lungs, which threshold.

- **Training films**: the pack's NIH ChestX-ray14 films labelled ``No Finding`` (NIH: no restriction on
  use, attribution required: NIH Clinical Center, https://nihcc.app.box.com/v/ChestXray-NIHCC, Wang et
  al., CVPR 2017). No COVID-19 collection row is used (none is a normal film, and the NC-SA rows may not
  train anything shipped).
- **Lungs**: the lung U-Net :data:`LUNGS` (``lung_unet_v1``), the lungs the shipped ``normative_v1`` was fitted
  through (its sidecar's ``segmenter``); ``anatomy fit-normative --lungs`` names others.
- **Zone threshold**: the zone score that best separates (Youden's J) NIH films with a lung-opacity label
  (:data:`OPACITY_LABELS`, the film's highest zone score) from the normal films, the normal films scored
  out-of-fold (:data:`FOLDS` folds grouped by patient, each fold by a model fitted without it). No
  Brixia-scored film is used for any choice.

``cxrground anatomy fit-normative --out DIR [--lungs NAME|FILE]`` runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np

from cxrground.anatomy.segment.base import LungHeartSegmenter, segment_image
from cxrground.datasets.pack import NIHRecord, Pack
from cxrground.lesions.normative import NORMATIVE_METHOD, NormativeModel, fit_normative

__all__ = ["FOLDS", "LUNGS", "OPACITY_LABELS", "fit_from_pack", "nih_patient", "normal_rows", "patient_folds",
           "youden_threshold"]

#: NIH labels that put opacity (or fluid) into lung zones.
OPACITY_LABELS: Final[frozenset[str]] = frozenset(
    {"Infiltration", "Consolidation", "Pneumonia", "Edema", "Atelectasis", "Effusion", "Mass"})
FOLDS: Final[int] = 5
#: The lung U-Net the shipped ``normative_v1`` was fitted through (its sidecar's ``segmenter``).
LUNGS: Final[str] = "lung_unet_v1"


def nih_patient(record: NIHRecord) -> str:
    """NIH patient id: the image id's part before the underscore (``00000075_000`` → ``00000075``)."""
    return record.image_id.split("_")[0]


def normal_rows(records: Sequence[NIHRecord]) -> list[NIHRecord]:
    """The films labelled ``No Finding``."""
    return [r for r in records if r.labels == ("No Finding",)]


def patient_folds(patients: Sequence[str], folds: int = FOLDS) -> np.ndarray:
    """Fold index per item, every patient in one fold (patients sorted, dealt round-robin)."""
    order = {p: i % folds for i, p in enumerate(sorted(set(patients)))}
    return np.array([order[p] for p in patients], dtype=np.int64)


def youden_threshold(positive: np.ndarray, negative: np.ndarray) -> float:
    """The threshold ``t`` (flag when ``score > t``) that maximises sensitivity + specificity − 1."""
    pos, neg = np.asarray(positive, float), np.asarray(negative, float)
    cands = np.unique(np.concatenate([pos, neg]))
    best, best_t = -2.0, float(cands[0]) if cands.size else 0.0
    for t in cands:
        j = float((pos > t).mean() - (neg > t).mean())
        if j > best:
            best, best_t = j, float(t)
    return best_t


Lungs = Callable[[NIHRecord], "tuple[np.ndarray, np.ndarray, np.ndarray] | None"]


def _film_lungs(segmenter: LungHeartSegmenter) -> Lungs:
    def read(rec: NIHRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        im = rec.read()
        seg = segment_image(segmenter, im)
        if not seg.right_lung.any() or not seg.left_lung.any():
            return None
        return im.pixels, seg.right_lung, seg.left_lung
    return read


def fit_from_pack(pack: Pack, segmenter: LungHeartSegmenter, grid: tuple[int, int] = (16, 8)) -> NormativeModel:
    """Fit ``normative_v1`` as described in the module docstring; the sidecar lists every film used."""
    records = pack.nih()
    lungs = _film_lungs(segmenter)
    normals = [(r, f) for r in normal_rows(records) if (f := lungs(r)) is not None]
    folds = patient_folds([nih_patient(r) for r, _ in normals])
    normal_scores: list[float] = []
    for k in range(FOLDS):
        model = fit_normative([f for (_, f), fk in zip(normals, folds, strict=True) if fk != k], grid)
        for (_, f), fk in zip(normals, folds, strict=True):
            if fk == k:
                normal_scores.append(_film_score(model, f))
    model = fit_normative([f for _, f in normals], grid)
    opacity = [f for r in records if OPACITY_LABELS & set(r.labels) and (f := lungs(r)) is not None]
    threshold = youden_threshold(np.array([_film_score(model, f) for f in opacity]), np.array(normal_scores))
    meta: dict[str, Any] = {
        "name": "normative_v1", "method": NORMATIVE_METHOD,
        "summary": f"{len(normals)} NIH ChestX-ray14 films labelled No Finding (cxr-pack-v1 nih/), lungs from "
                   "the shipped lung U-Net; zone threshold by Youden's J between "
                   f"{len(opacity)} NIH films with a lung-opacity label and the normal films scored out-of-fold",
        "attribution": "NIH Clinical Center, https://nihcc.app.box.com/v/ChestXray-NIHCC; Wang et al., "
                       "ChestX-ray8, CVPR 2017",
        "films": [r.image_id for r, _ in normals],
        "threshold_rule": {"positive_labels": sorted(OPACITY_LABELS), "positives": len(opacity),
                           "negatives": len(normal_scores), "folds": FOLDS, "score": "max over zones A-F"},
        "segmenter": segmenter.provenance().get("model_name", segmenter.name),
    }
    return NormativeModel(model.median, model.scale, threshold, meta)


def _film_score(model: NormativeModel, film: tuple[np.ndarray, np.ndarray, np.ndarray]) -> float:
    """The film's highest zone score."""
    pixels, right, left = film
    scores = model.zone_scores(model.z_map(pixels, right, left), right, left)
    vals = [v for v in scores.values() if np.isfinite(v)]
    return float(max(vals)) if vals else float("nan")
