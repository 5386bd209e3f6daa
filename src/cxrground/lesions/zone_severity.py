"""Film severity of the zone reader ``zone_prior_v2``: a film-level logistic model on both image readers.

``zone_prior_v1`` takes the film severity ``S`` from ``zone_sim_v1`` alone. ``zone_prior_v2`` takes it from a
:class:`SeverityModel`: a logistic regression on a few film features (:data:`SEVERITY_FEATURES`) of the two image
readers, ``zone_sim_v1``'s zone probabilities ``p_z`` and the lesion segmenter's zone shares ``s_z``, trained to
tell diseased films from normal ones. Its severity is the model's logit minus the logit of its own operating
threshold, clipped to ``±clip``: ``S = clip(β₀ + β·x − logit(τ), −clip, clip)``.

The shipped model ``zone_prior_v2_severity.json`` is fitted by ``bench/zone_prior_v2_fit.py`` on films whose
licence allows shipping and that have no Brixia score (rule: ``bench/records/zone_prior_v2_preregistration.md``);
:func:`select_model` and :func:`weighted_youden` are the choices that recipe makes, on its training rows only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.errors import ConfigError, InputError
from cxrground.lesions.zone_classifier import fit_logistic, patient_folds

__all__ = ["SEVERITY_CLIP", "SEVERITY_FEATURES", "SEVERITY_MODEL", "SEVERITY_V3_MODEL", "CandidateScore",
           "SeverityModel", "cross_validate", "fit_severity", "logit", "select_model", "severity_features",
           "shipped_severity_path", "weighted_log_loss", "weighted_youden"]

#: Name of the shipped severity model file (``weights/zone_prior_v2_severity.json``).
SEVERITY_MODEL: Final[str] = "zone_prior_v2_severity"
#: The same model refitted by the same recipe on readings through the shipped lungs (``zone_prior_v3``).
SEVERITY_V3_MODEL: Final[str] = "zone_prior_v3_severity"
#: Film severities are clipped to ``±SEVERITY_CLIP`` (no flag changes; keeps probabilities off 0 / 1 in the CSV).
SEVERITY_CLIP: Final[float] = 4.0
_EPS: Final[float] = 1e-4


def logit(p: np.ndarray | float) -> np.ndarray:
    """``log(p / (1 − p))`` with ``p`` clipped to ``[1e-4, 1 − 1e-4]``."""
    q = np.clip(np.asarray(p, np.float64), _EPS, 1 - _EPS)
    return np.log(q) - np.log1p(-q)


#: Film features by name, each from ``(sim_probability, lesion_share)`` of shape ``(..., 6)`` to ``(...)``.
SEVERITY_FEATURES: Final[dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "logit_mean_sim": lambda sim, share: logit(np.mean(sim, axis=-1)),
    "mean_share": lambda sim, share: np.mean(share, axis=-1),
    "max_share": lambda sim, share: np.max(share, axis=-1),
}


def severity_features(sim_probability: np.ndarray, lesion_share: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """The named film features (columns, in ``names`` order) of one film (six zones each: shape ``(d,)``) or of
    films ``(n, 6)`` (shape ``(n, d)``)."""
    sim, share = np.asarray(sim_probability, np.float64), np.asarray(lesion_share, np.float64)
    if sim.shape[-1] != 6 or share.shape != sim.shape:
        raise ValueError(f"need six zones per film, got {sim.shape} and {share.shape}")
    unknown = [n for n in names if n not in SEVERITY_FEATURES]
    if unknown or not names:
        raise ConfigError(f"severity features must be some of {sorted(SEVERITY_FEATURES)}, got {list(names)}")
    return np.stack([SEVERITY_FEATURES[n](sim, share) for n in names], axis=-1)


def shipped_severity_path(name: str = SEVERITY_MODEL) -> Path:
    """Path of a shipped severity model (default ``zone_prior_v2_severity.json``; next to the other shipped lesion
    weights)."""
    return Path(str(resources.files("cxrground.lesions") / "weights" / f"{name}.json"))


@dataclass(frozen=True)
class SeverityModel:
    """A film-level logistic model on raw film features, its operating threshold and the severity clip."""

    features: tuple[str, ...]
    coef: tuple[float, ...]
    intercept: float
    threshold: float
    clip: float = SEVERITY_CLIP
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.features or any(f not in SEVERITY_FEATURES for f in self.features):
            raise ConfigError(f"severity features must be some of {sorted(SEVERITY_FEATURES)}, "
                              f"got {list(self.features)}")
        if len(self.coef) != len(self.features):
            raise ConfigError(f"{len(self.features)} severity features but {len(self.coef)} coefficients")
        if not np.all(np.isfinite([*self.coef, self.intercept])):
            raise ConfigError("severity coefficients must be finite")
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"severity threshold must lie in (0, 1), got {self.threshold}")
        if not self.clip > 0:
            raise ConfigError(f"severity clip must be positive, got {self.clip}")

    def probability(self, sim_probability: np.ndarray, lesion_share: np.ndarray) -> np.ndarray:
        """The model's probability that the film (or each film) is diseased."""
        return 1.0 / (1.0 + np.exp(-self._logit(sim_probability, lesion_share)))

    def severity(self, sim_probability: np.ndarray, lesion_share: np.ndarray) -> np.ndarray:
        """``S = clip(logit − logit(threshold), ±clip)`` of one film (a scalar array) or of films ``(n,)``."""
        s = self._logit(sim_probability, lesion_share) - float(logit(self.threshold))
        return np.clip(s, -self.clip, self.clip)

    def _logit(self, sim_probability: np.ndarray, lesion_share: np.ndarray) -> np.ndarray:
        x = severity_features(sim_probability, lesion_share, self.features)
        return self.intercept + x @ np.asarray(self.coef, np.float64)

    def save(self, path: str | Path) -> Path:
        """Write the model as JSON (provenance under ``meta``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"features": list(self.features), "coef": [float(c) for c in self.coef],
                "intercept": float(self.intercept), "threshold": float(self.threshold), "clip": float(self.clip),
                "meta": self.meta}
        path.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path | None = None) -> SeverityModel:
        """Read a model written by :meth:`save` (None: the shipped ``zone_prior_v2_severity.json``); an
        :class:`~cxrground.errors.InputError` when the file is missing or not a severity model, a
        :class:`~cxrground.errors.ConfigError` when its values are invalid."""
        path = Path(path) if path is not None else shipped_severity_path()
        if not path.is_file():
            raise InputError("severity model file not found", path)
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
            parts = (tuple(str(f) for f in body["features"]), tuple(float(c) for c in body["coef"]),
                     float(body["intercept"]), float(body["threshold"]), float(body.get("clip", SEVERITY_CLIP)))
            meta = dict(body.get("meta", {}))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"not a severity model file ({exc})", path) from exc
        return cls(*parts, meta={**meta, "path": str(path)})


# --- the recipe's choices (training rows only) ------------------------------------------------------------------
def weighted_log_loss(prob: np.ndarray, y: np.ndarray, weight: np.ndarray) -> float:
    """Mean log-loss of ``prob`` for 0/1 labels ``y``, weighted."""
    p = np.clip(np.asarray(prob, np.float64), 1e-12, 1 - 1e-12)
    t, w = np.asarray(y, np.float64), np.asarray(weight, np.float64)
    return float(-(w * (t * np.log(p) + (1 - t) * np.log1p(-p))).sum() / w.sum())


def weighted_youden(prob: np.ndarray, y: np.ndarray, weight: np.ndarray) -> tuple[float, float]:
    """``(threshold, J)``: the threshold (flag when ``prob ≥ threshold``, among the probabilities rounded to 4
    decimals, inside (0, 1)) maximising weighted sensitivity + specificity − 1; the lowest on ties."""
    p, t, w = np.asarray(prob, np.float64), np.asarray(y, bool), np.asarray(weight, np.float64)
    if not t.any() or t.all():
        raise ValueError("need both diseased and normal films")
    cands = np.clip(np.unique(np.round(p, 4)), 1e-4, 1 - 1e-4)
    flagged = p[None, :] >= cands[:, None]
    sens = (flagged[:, t] * w[t]).sum(axis=1) / w[t].sum()
    fpr = (flagged[:, ~t] * w[~t]).sum(axis=1) / w[~t].sum()
    j = sens - fpr
    best = int(np.argmax(j))
    return float(cands[best]), float(j[best])


@dataclass(frozen=True)
class CandidateScore:
    """One candidate (feature set, penalty) and its patient-grouped CV result."""

    features: tuple[str, ...]
    l2: float
    log_loss: float
    oof: np.ndarray = field(repr=False)


def _fit_standardised(x: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    """Logistic fit on ``x`` standardised over its rows; coefficients and intercept on the raw ``x``."""
    mu, sd = x.mean(axis=0), x.std(axis=0)
    sd = np.where(sd > 1e-12, sd, 1.0)
    coef, icpt = fit_logistic((x - mu) / sd, y, l2, w)
    return coef / sd, float(icpt - (coef * mu / sd).sum())


def cross_validate(x: np.ndarray, y: np.ndarray, w: np.ndarray, patients: Sequence[str], l2: float,
                   folds: int = 5, seed: int = 0) -> np.ndarray:
    """Out-of-fold probabilities of the standardised logistic fit, folds grouped by patient."""

    fold = patient_folds(patients, folds, seed)
    oof = np.zeros(len(y))
    for k in range(folds):
        test = fold == k
        coef, icpt = _fit_standardised(x[~test], y[~test], w[~test], l2)
        oof[test] = 1.0 / (1.0 + np.exp(-(icpt + x[test] @ coef)))
    return oof


def select_model(sim: np.ndarray, share: np.ndarray, y: np.ndarray, weight: np.ndarray, patients: Sequence[str],
                 feature_sets: Sequence[Sequence[str]], penalties: Sequence[float], folds: int = 5, seed: int = 0,
                 tolerance: float = 0.002) -> tuple[CandidateScore, list[CandidateScore]]:
    """The chosen candidate and all candidates' CV scores: lowest weighted out-of-fold log-loss; among those within
    ``tolerance`` of it, fewer features first, then the larger penalty."""
    y = np.asarray(y, np.float64)
    w = np.asarray(weight, np.float64)
    scores = []
    for names in feature_sets:
        x = severity_features(sim, share, names)
        for l2 in penalties:
            oof = cross_validate(x, y, w, patients, l2, folds, seed)
            scores.append(CandidateScore(tuple(names), float(l2), weighted_log_loss(oof, y, w), oof))
    best = min(s.log_loss for s in scores)
    near = [s for s in scores if s.log_loss <= best + tolerance]
    chosen = min(near, key=lambda s: (len(s.features), -s.l2, s.log_loss))
    return chosen, scores


def fit_severity(sim: np.ndarray, share: np.ndarray, y: np.ndarray, weight: np.ndarray, features: Sequence[str],
                 l2: float, threshold: float, meta: dict[str, Any] | None = None) -> SeverityModel:
    """The severity model refitted on all rows with the chosen features, penalty and operating threshold."""
    x = severity_features(sim, share, features)
    coef, icpt = _fit_standardised(x, np.asarray(y, np.float64), np.asarray(weight, np.float64), l2)
    return SeverityModel(tuple(features), tuple(float(c) for c in coef), icpt, threshold, SEVERITY_CLIP, meta or {})
