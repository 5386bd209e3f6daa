"""A zone reader that localises with a position prior: film severity from the image, placed by anatomy.

Image readers tell sicker films from less sick ones better than they tell which zones of a film are diseased,
while where lung disease sits follows a strong anatomical pattern (more often in the lower and mid zones). The
reader ``zone_prior_v1`` (``anatomy zones --zone-model zone_prior_v1``) combines, per Brixia zone z of a film:

- **film severity** ``S``: the shipped zone reader ``zone_sim_v1``'s probabilities averaged over the six zones,
  on the logit scale and relative to that reader's own flag threshold ``τ``: ``S = logit(mean_z p_z) − logit(τ)``;
- **position** ``P_z = log(6 · q_z)``: the shipped position prior :class:`ZonePrior` (``zone_prior_v1.json``,
  six weights summing to 1; uniform gives 0): the lesion segmenter's mean lesion share per band (upper, mid,
  lower zone; both lungs pooled, so the right and left zone of a band weigh the same) on NIH ChestX-ray14 films
  labelled with a lung lesion (recipe ``bench/zone_prior_fit.py``; image-level labels only). It orders the bands
  lower > mid > upper, the basal predominance reported for lung opacities on chest films;
- **zone evidence** ``E_z``: the mean of two within-film standardised zone scores (each minus the film's mean over
  its six zones, divided by their standard deviation; 0 when the six are equal): ``logit p_z`` of ``zone_sim_v1``
  and the ``lesion-unet`` zone share (share of the zone's pixels, heart and mediastinum removed, at ``p ≥ t``).

``probability_z = sigmoid(S + P_z + w · E_z)`` with ``w`` = :data:`EVIDENCE_WEIGHT`; a zone is flagged when the
probability is at least :data:`FLAG_PROBABILITY`. All numbers are fixed
(``bench/records/zone_prior_preregistration.md``); nothing is fitted on COVID-19 films or Brixia scores.

The reader ``zone_prior_v2`` (``anatomy zones --zone-model zone_prior_v2``) is the same combination with another
film severity: ``S`` from a film-level logistic model on both image readers (``zone_sim_v1``'s mean probability and
the lesion segmenter's zone shares; :class:`~cxrground.lesions.zone_severity.SeverityModel`, shipped
``zone_prior_v2_severity.json``, recipe ``bench/zone_prior_v2_fit.py``, rule
``bench/records/zone_prior_v2_preregistration.md``), its logit minus the logit of its own operating threshold,
clipped to ±4. ``P_z``, ``E_z``, ``w`` and the flag are those of ``zone_prior_v1``.

The reader ``zone_prior_v3`` (``anatomy zones``' default) is ``zone_prior_v2`` with its severity model refitted by
the same recipe on readings through the shipped lungs ``lung_unet_v2`` (``zone_prior_v3_severity.json``; record
``bench/records/zone_prior_v3_preregistration.md``). ``zone_prior_v2`` keeps the file fitted through
``lung_unet_v1``'s lungs, because the ILS zone guide grounds more findings with it.

For the ILS negative check (:meth:`PriorZoneReader.negative_flags`), a zone contradicts a "no lung lesion here" pair
only when it is flagged **and** the lesion segmenter finds a lesion somewhere in the film (some zone with a lesion
share ≥ :data:`~cxrground.lesions.lesion_zones.ZONE_COVER`): two image readers must agree that the film is
diseased before the position prior may overrule a report's negative.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.errors import ConfigError, InputError
from cxrground.lesions.lesion_zones import LesionZoneReader
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS, NormativeModel
from cxrground.lesions.zone_classifier import ZoneClassifier, shipped_zone_reader_path
from cxrground.lesions.zone_features import feature_columns, film_zone_features
from cxrground.lesions.zone_severity import SEVERITY_V3_MODEL, SeverityModel, shipped_severity_path

__all__ = ["EVIDENCE_WEIGHT", "FLAG_PROBABILITY", "PRIOR_LABELS", "PRIOR_READERS", "ZONE_PRIOR_READER",
           "ZONE_PRIOR_V2_READER", "ZONE_PRIOR_V3_READER",
           "PriorReading", "PriorZoneReader", "ZonePrior", "combine", "prior_from_shares", "shipped_prior_path",
           "standardise"]

ZONES: Final[tuple[str, ...]] = tuple(BRIXIA_ZONE_LABELS)
#: Name of the reader (``anatomy zones --zone-model zone_prior_v1``) and of its shipped prior file.
ZONE_PRIOR_READER: Final[str] = "zone_prior_v1"
#: Name of the reader whose film severity also listens to the lesion segmenter (``--zone-model zone_prior_v2``).
ZONE_PRIOR_V2_READER: Final[str] = "zone_prior_v2"
#: ``zone_prior_v2`` with its severity refitted on readings through the shipped lungs (``lung_unet_v2``).
ZONE_PRIOR_V3_READER: Final[str] = "zone_prior_v3"
#: Every shipped position-prior reader.
PRIOR_READERS: Final[tuple[str, ...]] = (ZONE_PRIOR_READER, ZONE_PRIOR_V2_READER, ZONE_PRIOR_V3_READER)
#: NIH ChestX-ray14 labels whose films count as "lung lesion" for the prior.
PRIOR_LABELS: Final[tuple[str, ...]] = ("Pneumonia", "Consolidation", "Infiltration", "Effusion", "Atelectasis",
                                        "Edema")
#: Weight of the within-film zone evidence ``E_z`` (pre-registered).
EVIDENCE_WEIGHT: Final[float] = 0.25
#: A zone is flagged when its probability is at least this.
FLAG_PROBABILITY: Final[float] = 0.5
_EPS: Final[float] = 1e-4


def shipped_prior_path() -> Path:
    """Path of the shipped ``zone_prior_v1.json`` (next to the other shipped lesion weights)."""
    return Path(str(resources.files("cxrground.lesions") / "weights" / f"{ZONE_PRIOR_READER}.json"))


def prior_from_shares(lesion: np.ndarray) -> np.ndarray:
    """Six prior weights (sum 1) from per-film zone lesion shares ``(films, 6)`` of films labelled with a lung
    lesion: each band's (upper, mid, lower) mean share over both lungs, the same for the right and the left zone
    of a band (no side preference), normalised over the six zones."""
    lesion = np.asarray(lesion, np.float64)
    if lesion.ndim != 2 or lesion.shape[1] != 6 or not len(lesion):
        raise ValueError(f"need (films, 6) zone shares of at least one film, got {lesion.shape}")
    band = 0.5 * (lesion[:, :3].mean(axis=0) + lesion[:, 3:].mean(axis=0))
    if not np.all(band > 0):
        raise ValueError(f"every band needs a positive mean lesion share, got {band.round(5).tolist()}")
    q = np.concatenate([band, band])
    return q / q.sum()


def standardise(values: np.ndarray) -> np.ndarray:
    """``values`` minus their mean over the last axis, divided by their standard deviation (0 where it is ~0)."""
    v = np.asarray(values, np.float64)
    centred = v - v.mean(axis=-1, keepdims=True)
    sd = v.std(axis=-1, keepdims=True)
    return np.where(sd > 1e-9, centred / np.where(sd > 1e-9, sd, 1.0), 0.0)


def _logit(p: np.ndarray | float) -> np.ndarray:
    q = np.clip(np.asarray(p, np.float64), _EPS, 1 - _EPS)
    return np.log(q) - np.log1p(-q)


def combine(sim_probability: np.ndarray, lesion_share: np.ndarray, sim_threshold: float, prior: np.ndarray,
            weight: float = EVIDENCE_WEIGHT, severity: np.ndarray | float | None = None) -> np.ndarray:
    """Zone probabilities ``sigmoid(S + log(6·prior) + weight·E)`` (module docstring) of one film (six values each)
    or of films ``(n, 6)``. ``severity``: the film severity ``S`` (one value per film) to use instead of
    ``zone_prior_v1``'s ``logit(mean p) − logit(sim_threshold)``."""
    p, s, q = (np.asarray(a, np.float64) for a in (sim_probability, lesion_share, prior))
    if p.shape[-1] != 6 or s.shape != p.shape or q.shape != (6,):
        raise ValueError(f"need six zones per film, got {p.shape}, {s.shape} and a prior of shape {q.shape}")
    if not np.all(q > 0):
        raise ValueError("prior weights must be positive")
    if severity is None:
        film = _logit(p.mean(axis=-1, keepdims=True)) - _logit(sim_threshold)
    else:
        film = np.asarray(severity, np.float64)[..., None]
        if film.shape[:-1] != p.shape[:-1]:
            raise ValueError(f"need one severity per film, got {np.shape(severity)} for {p.shape[:-1]} films")
    position = np.log(6.0 * q / q.sum())
    evidence = 0.5 * (standardise(_logit(p)) + standardise(s))
    return 1.0 / (1.0 + np.exp(-(film + position + weight * evidence)))


@dataclass(frozen=True)
class ZonePrior:
    """Six position weights (Brixia zones A–F, sum 1) and their provenance."""

    weights: dict[str, float]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.weights) != set(ZONES):
            raise ConfigError(f"zone prior needs weights for zones {', '.join(ZONES)}, got {sorted(self.weights)}")
        w = np.array([self.weights[z] for z in ZONES], np.float64)
        if not np.all(np.isfinite(w)) or not np.all(w > 0) or abs(w.sum() - 1.0) > 1e-3:
            raise ConfigError(f"zone prior weights must be positive and sum to 1, got {w.round(4).tolist()}")

    @property
    def vector(self) -> np.ndarray:
        """The weights in zone order A–F."""
        return np.array([self.weights[z] for z in ZONES], np.float64)

    def save(self, path: str | Path) -> Path:
        """Write the prior as JSON (weights rounded to 6 decimals, provenance under ``meta``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"weights": {z: round(float(self.weights[z]), 6) for z in ZONES}, "meta": self.meta}
        path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path | None = None) -> ZonePrior:
        """Read a prior written by :meth:`save` (None: the shipped ``zone_prior_v1``)."""
        path = Path(path) if path is not None else shipped_prior_path()
        if not path.is_file():
            raise InputError("zone prior file not found", path)
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
            weights = {str(k): float(v) for k, v in body["weights"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"not a zone prior file ({exc})", path) from exc
        return cls(weights, {**body.get("meta", {}), "path": str(path)})


@dataclass(frozen=True)
class PriorReading:
    """One film read by :class:`PriorZoneReader`: the combined probability and its parts, zones A–F."""

    probability: np.ndarray
    sim_probability: np.ndarray
    lesion_share: np.ndarray
    lesion_map: np.ndarray
    lesion_found: bool
    """The lesion segmenter flags some zone of the film (share ≥ ZONE_COVER)."""
    severity: float = float("nan")
    """The film severity ``S`` the zones' probabilities were placed from."""

    def flags(self, threshold: float = FLAG_PROBABILITY) -> dict[str, bool]:
        """Zone → probability ≥ ``threshold``."""
        return {z: bool(p >= threshold) for z, p in zip(ZONES, self.probability, strict=True)}

    def negative_flags(self, threshold: float = FLAG_PROBABILITY) -> dict[str, bool]:
        """Zones that contradict a "no lung lesion here" pair: flagged, in a film where the lesion segmenter finds
        a lesion (module docstring); all False otherwise."""
        return {z: bool(self.lesion_found and f) for z, f in self.flags(threshold).items()}


@dataclass
class PriorZoneReader:
    """``zone_prior_v1``: ``zone_sim_v1`` severity + position prior + both readers' within-film zone evidence;
    ``zone_prior_v2`` when ``severity`` is given: the film severity from that model instead; ``zone_prior_v3`` the
    same with the severity refitted on the shipped lungs."""

    prior: ZonePrior
    lesion: LesionZoneReader
    normative: NormativeModel
    classifier: ZoneClassifier
    weight: float = EVIDENCE_WEIGHT
    flag: float = FLAG_PROBABILITY
    severity: SeverityModel | None = None
    label: str | None = None
    """The reader's name; None: :data:`ZONE_PRIOR_READER` without a severity model, else
    :data:`ZONE_PRIOR_V2_READER`."""

    @classmethod
    def shipped(cls, threads: int | None = 1, severity: SeverityModel | None = None,
                label: str | None = None) -> PriorZoneReader:
        """``zone_prior_v1`` on the shipped prior, ``zone_sim_v1``, ``normative_v1`` and ``lesion_unet_v1``; with a
        ``severity`` model, the reader that takes its film severity from it."""
        return cls(ZonePrior.load(), LesionZoneReader.shipped(threads), NormativeModel.load(),
                   ZoneClassifier.load(shipped_zone_reader_path()), severity=severity, label=label)

    @classmethod
    def shipped_v2(cls, threads: int | None = 1) -> PriorZoneReader:
        """``zone_prior_v2``: :meth:`shipped` with the shipped severity model ``zone_prior_v2_severity.json``."""
        return cls.shipped(threads, SeverityModel.load())

    @classmethod
    def shipped_v3(cls, threads: int | None = 1) -> PriorZoneReader:
        """``zone_prior_v3``: :meth:`shipped` with the severity model refitted on the shipped lungs
        (``zone_prior_v3_severity.json``)."""
        return cls.shipped(threads, SeverityModel.load(shipped_severity_path(SEVERITY_V3_MODEL)), ZONE_PRIOR_V3_READER)

    @classmethod
    def named(cls, name: str, threads: int | None = 1) -> PriorZoneReader:
        """The shipped position-prior reader called ``name`` (one of :data:`PRIOR_READERS`)."""
        loaders = {ZONE_PRIOR_READER: cls.shipped, ZONE_PRIOR_V2_READER: cls.shipped_v2,
                   ZONE_PRIOR_V3_READER: cls.shipped_v3}
        if name not in loaders:
            raise ConfigError(f"unknown position-prior zone reader {name!r}; expected one of "
                              f"{', '.join(PRIOR_READERS)}")
        return loaders[name](threads)

    @property
    def reader_id(self) -> str:
        """``label`` when set, else :data:`ZONE_PRIOR_V2_READER` with a severity model and
        :data:`ZONE_PRIOR_READER` without."""
        if self.label:
            return self.label
        return ZONE_PRIOR_READER if self.severity is None else ZONE_PRIOR_V2_READER

    @property
    def threshold(self) -> float:
        """The zone flag threshold (a probability)."""
        return self.flag

    def read_film(self, pixels: np.ndarray, right: np.ndarray, left: np.ndarray,
                  heart: np.ndarray | None) -> PriorReading:
        """The combined reading of one film (all arrays on the same grid)."""
        feats, _ = film_zone_features(self.normative, pixels, right, left)
        sim = self.classifier.probability(feats[:, feature_columns(self.classifier.feature_names)])
        scores, flags, p = self.lesion.read(pixels, right, left, heart)
        share = np.array([scores[z] for z in ZONES])
        if self.severity is None:
            film = float(_logit(np.mean(sim)) - _logit(self.classifier.threshold))
        else:
            film = float(self.severity.severity(sim, share))
        prob = combine(sim, share, self.classifier.threshold, self.prior.vector, self.weight, film)
        return PriorReading(prob, sim, share, p, any(flags.values()), film)

    def read(self, pixels: np.ndarray, right: np.ndarray, left: np.ndarray,
             heart: np.ndarray | None) -> tuple[dict[str, float], dict[str, bool], np.ndarray]:
        """Zone probabilities, flags and the lesion probability map of one film."""
        r = self.read_film(pixels, right, left, heart)
        return dict(zip(ZONES, (float(v) for v in r.probability), strict=True)), r.flags(self.flag), r.lesion_map

    def negative_flags(self, pixels: np.ndarray, right: np.ndarray, left: np.ndarray,
                       heart: np.ndarray | None) -> dict[str, bool]:
        """Zones that contradict a "no lung lesion here" pair: flagged, in a film where the lesion segmenter finds
        a lesion (module docstring); all False otherwise."""
        return self.read_film(pixels, right, left, heart).negative_flags(self.flag)

    def name(self) -> str:
        """Who flags the zones, for the CSV provenance and the overlays."""
        return f"{self.reader_id} (severity + position prior + zone evidence, p >= {self.flag:.2f})"

    def provenance(self) -> dict[str, Any]:
        """The prior, the two image readers and the combination rule."""
        severity: dict[str, Any] = {
            "from": "zone_sim_v1", "rule": "logit(mean zone_sim p) - logit(tau)"} if self.severity is None else {
            "from": "zone_sim_v1 and lesion-unet", "features": list(self.severity.features),
            "coef": list(self.severity.coef), "intercept": self.severity.intercept,
            "threshold": self.severity.threshold, "clip": self.severity.clip,
            "rule": "clip(b0 + b.x - logit(threshold), -clip, clip)",
            "path": self.severity.meta.get("path"), "data": self.severity.meta.get("data"),
            "lungs": self.severity.meta.get("lungs")}
        return {"name": self.reader_id, "severity": severity, "prior": {**self.prior.weights, "meta": self.prior.meta},
                "evidence_weight": self.weight, "flag": self.flag,
                "zone_sim": {k: self.classifier.meta.get(k) for k in ("path", "sha256", "threshold")},
                "lesion": self.lesion.provenance(),
                "score": "sigmoid(S + log(6 prior_z) + w * E_z)"}


@functools.cache
def shipped_reader(name: str = ZONE_PRIOR_READER) -> PriorZoneReader:
    """A shipped position-prior reader (:data:`PRIOR_READERS`), loaded once per process."""
    return PriorZoneReader.named(name)
