"""A small zone classifier: L2-regularised logistic regression on zone features (pure numpy).

Features are standardised with the training set's mean and standard deviation, then the penalised
log-likelihood is maximised by Newton's method (the problem is convex and small: a few hundred zones, a
few dozen features). A zone is flagged when its probability is at least :attr:`ZoneClassifier.threshold`.
:meth:`ZoneClassifier.save` writes an ``.npz`` with a ``.json`` sidecar (meta + sha256), like the
normative model; :meth:`ZoneClassifier.load` checks it. :mod:`cxrground.lesions.zone_fit` trains one on a
site's own per-zone labels (``cxrground anatomy fit-zones``).

Without zone labels, :func:`fit_mil_logistic` (:meth:`ZoneClassifier.fit_films`) fits the same zone model
from **film** labels by multiple-instance learning: a film's probability pools its zones' probabilities
(``noisy-or``: abnormal when any zone is; ``mean``: the share of abnormal zones), and the film-level
log-likelihood is maximised (L-BFGS).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.errors import ConfigError, InputError
from cxrground.io.files import sha256_file
from cxrground.lesions.normative import read_model_arrays, read_model_sidecar

__all__ = ["MIL_POOLS", "SHIPPED_ZONE_READER", "ZONE_CLASSIFIER_METHOD", "ZoneClassifier", "fit_logistic",
           "fit_mil_logistic", "patient_folds", "shipped_zone_reader_path"]

ZONE_CLASSIFIER_METHOD: Final[str] = "zone-logistic/1"
#: The shipped zone reader (trained on simulated lesions in NIH normal films by
#: :mod:`cxrground.lesions.zone_sim_fit`), the default reader of ``anatomy zones``.
SHIPPED_ZONE_READER: Final[str] = "zone_sim_v1"
_MAX_ITER: Final[int] = 100
_TOL: Final[float] = 1e-8
#: How :func:`fit_mil_logistic` pools a film's zone probabilities into the film's probability.
MIL_POOLS: Final[tuple[str, ...]] = ("noisy-or", "mean")
_EPS: Final[float] = 1e-9


def shipped_zone_reader_path() -> Path:
    """Path of the shipped :data:`SHIPPED_ZONE_READER` ``.npz`` (inside the package, next to ``normative_v1``)."""
    return Path(str(resources.files("cxrground.lesions") / "weights" / f"{SHIPPED_ZONE_READER}.npz"))


def _sigmoid(t: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * t))


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0,
                 sample_weight: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Coefficients and intercept maximising the weighted log-likelihood minus ``l2/2 · |coef|²``.

    The intercept is not penalised. Raises :class:`ValueError` on mismatched shapes, a negative ``l2``,
    or labels that are not all 0/1.
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"need x (n, d) and y (n,), got {x.shape} and {y.shape}")
    if l2 < 0:
        raise ValueError(f"l2 must be >= 0, got {l2}")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels must be 0 or 1")
    w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, np.float64)
    a = np.hstack([np.ones((len(y), 1)), x])
    penalty = np.full(a.shape[1], float(l2))
    penalty[0] = 1e-9  # keeps the Hessian invertible when one class is absent; effectively unpenalised
    beta = np.zeros(a.shape[1])
    for _ in range(_MAX_ITER):
        p = _sigmoid(a @ beta)
        grad = a.T @ (w * (y - p)) - penalty * beta
        hess = (a * (w * p * (1 - p))[:, None]).T @ a + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        beta += step
        if float(np.abs(step).max()) < _TOL:
            break
    return beta[1:], float(beta[0])


def _mil_loss(beta: np.ndarray, a: np.ndarray, y: np.ndarray, w: np.ndarray, pool: str,
              penalty: np.ndarray) -> tuple[float, np.ndarray]:
    """Negative penalised film log-likelihood and its gradient; ``a`` is (films, zones, 1 + d)."""
    s = a @ beta  # (films, zones)
    p = _sigmoid(s)
    if pool == "noisy-or":
        soft = np.logaddexp(0.0, s).sum(axis=1)  # -log P(no zone abnormal)
        log_pos = np.log(-np.expm1(-np.maximum(soft, _EPS)))
        ll = w * (y * log_pos - (1 - y) * soft)
        dsoft = w * (y / np.expm1(np.maximum(soft, _EPS)) - (1 - y))  # d ll / d soft
        ds = dsoft[:, None] * p
    else:
        film = np.clip(p.mean(axis=1), _EPS, 1 - _EPS)
        ll = w * (y * np.log(film) + (1 - y) * np.log1p(-film))
        dfilm = w * (y / film - (1 - y) / (1 - film))
        ds = dfilm[:, None] * p * (1 - p) / p.shape[1]
    grad = np.einsum("nz,nzd->d", ds, a) - penalty * beta
    return float(-ll.sum() + 0.5 * float(penalty @ beta**2)), -grad


def fit_mil_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, pool: str = "noisy-or",
                     sample_weight: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Zone coefficients and intercept from film labels: ``x`` is (films, zones, d), ``y`` one 0/1 per film.

    Maximises the weighted film log-likelihood under ``pool`` (:data:`MIL_POOLS`) minus ``l2/2 · |coef|²``.
    Raises :class:`ValueError` on mismatched shapes, a negative ``l2``, an unknown pool or labels not 0/1.
    """
    from scipy.optimize import minimize

    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.ndim != 3 or y.shape != (x.shape[0],):
        raise ValueError(f"need x (films, zones, d) and y (films,), got {x.shape} and {y.shape}")
    if l2 < 0:
        raise ValueError(f"l2 must be >= 0, got {l2}")
    if pool not in MIL_POOLS:
        raise ValueError(f"pool must be one of {MIL_POOLS}, got {pool!r}")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels must be 0 or 1")
    w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, np.float64)
    a = np.concatenate([np.ones((*x.shape[:2], 1)), x], axis=2)
    penalty = np.full(a.shape[2], float(l2))
    penalty[0] = 0.0
    res = minimize(_mil_loss, np.zeros(a.shape[2]), args=(a, y, w, pool, penalty), jac=True, method="L-BFGS-B",
                   options={"maxiter": 1000, "gtol": 1e-7})
    return res.x[1:], float(res.x[0])


@dataclass(frozen=True, eq=False)
class ZoneClassifier:
    """Standardisation, logistic coefficients and the flag threshold of a zone classifier."""

    feature_names: tuple[str, ...]
    mean: np.ndarray
    std: np.ndarray
    coef: np.ndarray
    intercept: float
    threshold: float = 0.5
    """A zone is flagged when its probability is at least this."""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        d = len(self.feature_names)
        arrays = {"mean": self.mean, "std": self.std, "coef": self.coef}
        for name, arr in arrays.items():
            arr = np.asarray(arr, np.float64)
            if arr.shape != (d,) or not np.isfinite(arr).all():
                raise ConfigError(f"zone classifier {name} must be {d} finite numbers, got shape {arr.shape}")
            object.__setattr__(self, name, arr)
        if not (self.std > 0).all():
            raise ConfigError("zone classifier std must be positive")
        object.__setattr__(self, "feature_names", tuple(self.feature_names))

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, feature_names: Sequence[str], l2: float = 1.0,
            threshold: float = 0.5, meta: dict[str, Any] | None = None) -> ZoneClassifier:
        """Standardise ``x`` (a constant column gets std 1) and fit :func:`fit_logistic` on it."""
        x = np.asarray(x, np.float64)
        if x.ndim != 2 or x.shape[1] != len(feature_names):
            raise ValueError(f"x has shape {x.shape}, expected {len(feature_names)} columns")
        mean, std = x.mean(axis=0), x.std(axis=0)
        std = np.where(std > 1e-12, std, 1.0)
        coef, intercept = fit_logistic((x - mean) / std, y, l2)
        return cls(tuple(feature_names), mean, std, coef, intercept, threshold,
                   {**(meta or {}), "l2": l2, "zones": len(y), "positives": int(np.sum(y))})

    @classmethod
    def fit_films(cls, x: np.ndarray, y: np.ndarray, feature_names: Sequence[str], l2: float = 1.0,
                  pool: str = "noisy-or", threshold: float = 0.5, sample_weight: np.ndarray | None = None,
                  meta: dict[str, Any] | None = None) -> ZoneClassifier:
        """Standardise the zones of ``x`` (films, zones, d) and fit :func:`fit_mil_logistic` on film labels."""
        x = np.asarray(x, np.float64)
        if x.ndim != 3 or x.shape[2] != len(feature_names):
            raise ValueError(f"x has shape {x.shape}, expected (films, zones, {len(feature_names)})")
        flat = x.reshape(-1, x.shape[2])
        mean, std = flat.mean(axis=0), flat.std(axis=0)
        std = np.where(std > 1e-12, std, 1.0)
        coef, intercept = fit_mil_logistic((x - mean) / std, y, l2, pool, sample_weight)
        return cls(tuple(feature_names), mean, std, coef, intercept, threshold,
                   {**(meta or {}), "l2": l2, "pool": pool, "films": len(y), "positive_films": int(np.sum(y))})

    def probability(self, x: np.ndarray) -> np.ndarray:
        """Probability that each row (a zone's features, columns :attr:`feature_names`) is abnormal."""
        x = np.asarray(x, np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.feature_names):
            raise InputError(f"zone features have shape {x.shape}, the classifier needs "
                             f"{len(self.feature_names)} columns")
        return _sigmoid(((x - self.mean) / self.std) @ self.coef + self.intercept)

    def flags(self, x: np.ndarray) -> np.ndarray:
        """Boolean flag per row: probability at least :attr:`threshold`."""
        return self.probability(x) >= self.threshold

    # --- files -----------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write ``path`` (``.npz``) and its ``.json`` sidecar (feature names, threshold, meta, sha256)."""
        path = Path(path).with_suffix(".npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, mean=self.mean, std=self.std, coef=self.coef, intercept=np.float64(self.intercept),
                 threshold=np.float64(self.threshold))
        meta = {**self.meta, "method": ZONE_CLASSIFIER_METHOD, "feature_names": list(self.feature_names),
                "threshold": round(float(self.threshold), 6), "sha256": sha256_file(path)}
        path.with_suffix(".json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> ZoneClassifier:
        """Read a classifier written by :meth:`save`; the sidecar (feature names, sha256) is required."""
        path = Path(path)
        sidecar = path.with_suffix(".json")
        if not path.is_file():
            raise InputError("zone classifier file not found", path)
        if not sidecar.is_file():
            raise InputError("zone classifier has no .json sidecar with its feature names", path)
        meta = read_model_sidecar(path, "zone classifier")
        if meta.get("sha256") != sha256_file(path):
            raise InputError("zone classifier does not match the sha256 in its sidecar", path)
        arrays = read_model_arrays(path, ("mean", "std", "coef", "intercept", "threshold"), "a zone classifier")
        try:
            return cls(tuple(str(n) for n in meta.get("feature_names", ())), arrays["mean"], arrays["std"],
                       arrays["coef"], float(arrays["intercept"]), float(arrays["threshold"]),
                       {**meta, "path": str(path)})
        except (ConfigError, TypeError, ValueError) as exc:
            raise InputError(f"not a zone classifier file ({exc})", path) from exc


def patient_folds(patients: Sequence[str], folds: int, seed: int | Sequence[int]) -> np.ndarray:
    """Fold index per film: the patients, shuffled by ``seed``, dealt round-robin into ``folds`` folds."""
    unique = sorted(set(patients))
    order = np.random.default_rng(seed).permutation(len(unique))
    fold_of = {unique[j]: i % folds for i, j in enumerate(order)}
    return np.array([fold_of[p] for p in patients], dtype=np.int64)
