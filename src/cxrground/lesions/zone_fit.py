"""Train a zone reader on a site's own labelled films: a :class:`~cxrground.lesions.zone_classifier.ZoneClassifier`
fitted to per-zone labels, with its penalty and flag threshold chosen by patient-grouped cross-validation.

Input: a folder of films (PNG / JPEG / DICOM) and a CSV with an image column (file name relative to the folder)
and one column per Brixia zone A–F (``A..F``, or with a prefix, e.g. ``S-A..S-F`` for the senior reader of the
pack's Brixia scores); values are integers 0–3 (Brixia scores) or 0/1, and a zone is abnormal when its value
is > 0. An optional patient column groups films of one patient into one fold (without it every film is its
own patient).

Per film: lungs from the given segmenter, zone features (:mod:`cxrground.lesions.zone_features`) from the
normative model's z-map on the working grid, read by :func:`cxrground.lesions.zones.film_features` exactly as
``anatomy zones --zone-model`` reads them. A row that cannot be used (image missing or unreadable, a label out
of range, no lungs) is a :class:`~cxrground.errors.Failure` written to ``MODEL.failures.jsonl`` and skipped.

Fit: one logistic classifier for all six zones (the zone's position is a feature). The penalty (from
:data:`L2_GRID`) and the flag threshold (rule ``kappa``: the highest Cohen's κ; ``youden``: the highest
sensitivity + specificity − 1) are chosen on the out-of-fold probabilities of a K-fold CV grouped by patient;
the final classifier is fitted on every usable film with that choice. The reported κ / AUROC come from a
**nested** CV: each outer fold's films are scored by a classifier whose penalty and threshold were chosen by an
inner CV on the other folds' films only; the κ's 95 % interval is a bootstrap over patients. The ``.json``
sidecar records the training images (sha256), the label source, the choice, the CV results per zone and per
fold, the normative model's hash and the code version.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.anatomy.segment.base import LungHeartSegmenter
from cxrground.errors import BatchStopped, ConfigError, CXRGroundError, Failure, InputError, first_failure
from cxrground.fields import option
from cxrground.io.files import sha256_file
from cxrground.io.image import read_image
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS, NORMATIVE_METHOD, NormativeModel
from cxrground.lesions.zone_classifier import ZoneClassifier, patient_folds
from cxrground.lesions.zone_features import FEATURE_NAMES, normative_hash
from cxrground.lesions.zones import film_features

__all__ = [
    "L2_GRID",
    "THRESHOLD_RULES",
    "ZONE_FIT_METHOD",
    "CVResult",
    "FoldResult",
    "LabelledFilm",
    "ReadFilm",
    "Selection",
    "ZoneFitRequest",
    "ZoneFitResult",
    "auroc",
    "choose_threshold",
    "cohen_kappa",
    "fit_segmenter",
    "fit_zone_reader",
    "nested_cv",
    "patient_bootstrap",
    "patient_folds",
    "read_labelled_films",
    "read_zone_labels",
    "select_penalty",
]

ZONE_FIT_METHOD: Final[str] = "zone-fit/1"
ZONES: Final[tuple[str, ...]] = tuple(BRIXIA_ZONE_LABELS)
#: Penalties (``l2``) the cross-validation chooses from.
L2_GRID: Final[tuple[float, ...]] = (1.0, 3.0, 10.0, 30.0, 100.0)
#: How the flag threshold is chosen on out-of-fold probabilities.
THRESHOLD_RULES: Final[tuple[str, ...]] = ("kappa", "youden")
#: Largest label value (Brixia 0–3).
MAX_LABEL: Final[int] = 3
#: Fewest usable films a fit accepts.
MIN_FILMS: Final[int] = 10


@dataclass(frozen=True)
class ZoneFitRequest:
    """What ``cxrground anatomy fit-zones`` needs (each field documents itself, :func:`cxrground.fields.option`)."""

    images: Path = option(path="dir", help="Folder of the labelled films (PNG / JPEG / DICOM).")
    labels: Path = option(path="file", help="CSV: an image column (file name relative to --images) and one "
                          "column per zone A-F, 0-3 (Brixia) or 0/1; a zone is abnormal when > 0.")
    out: Path = option(path="out_file", help="Model .npz to write (+ .json sidecar, + .failures.jsonl).")
    image_col: str = option("image", help="Name of the CSV's image column.")
    label_prefix: str = option("", help="Prefix of the zone columns: '' reads A..F; 'S-' reads S-A..S-F (the "
                               "senior reader of the pack's brixia_scores.csv), 'J-' the junior.")
    patients_col: str | None = option(None, help="CSV column with a patient id: a patient's films stay in one "
                                      "fold (default: every film is its own patient).")
    threshold_rule: str = option("kappa", choices=THRESHOLD_RULES, help="Flag threshold on out-of-fold "
                                 "probabilities: the highest Cohen's kappa, or Youden's J.")
    folds: int = option(5, low=2, help="K of the patient-grouped K-fold CV (inner and outer).")
    leave_one_patient_out: bool = option(False, help="Score the outer CV leave-one-patient-out instead of K-fold "
                                         "(the inner choice stays K-fold).")
    seed: int = option(0, low=0, help="Seed of the fold assignment and of the bootstrap.")
    bootstrap: int = option(1000, low=0, help="Patient bootstrap replicates of the CV kappa's 95 % interval.")
    normative: Path | None = option(None, path="file", help="Normative model .npz whose z-map the features "
                                    "read (default: the shipped normative_v1); `anatomy zones` must use the same.")


@dataclass(frozen=True)
class LabelledFilm:
    """One usable CSV row: the image (as named in the CSV), its file, its zone labels A–F and its patient."""

    image: str
    path: Path
    labels: tuple[int, ...]
    patient: str

    @property
    def abnormal(self) -> np.ndarray:
        """Six booleans A–F: label > 0."""
        return np.array(self.labels) > 0


@dataclass(frozen=True, eq=False)
class ReadFilm:
    """A labelled film read: zone features (6 × features), normative zone scores A–F, the file's sha256."""

    film: LabelledFilm
    features: np.ndarray
    normative_scores: np.ndarray
    sha256: str


@dataclass(frozen=True)
class Selection:
    """A penalty and flag threshold chosen by CV, with the rule's score on the out-of-fold probabilities."""

    l2: float
    threshold: float
    score: float


@dataclass(frozen=True)
class FoldResult:
    """One outer fold of the nested CV: its films, the inner choice, κ and AUROC (overall and per zone)."""

    fold: int
    films: int
    patients: int
    l2: float
    threshold: float
    kappa: float | None
    auroc: float | None
    zone_kappa: dict[str, float | None]
    zone_auroc: dict[str, float | None]


@dataclass(frozen=True, eq=False)
class CVResult:
    """Nested CV of a zone reader: out-of-fold probabilities and flags (films × 6) and their scores."""

    scheme: str
    prob: np.ndarray
    pred: np.ndarray
    folds: list[FoldResult]
    kappa: float
    kappa_ci: tuple[float, float] | None
    auroc: float
    sensitivity: float
    specificity: float
    zone_kappa: dict[str, float | None]
    zone_auroc: dict[str, float | None]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (no per-film arrays; undefined values are null)."""
        return _clean({"scheme": self.scheme, "kappa": self.kappa, "kappa_ci95": self.kappa_ci,
                       "auroc": self.auroc, "sensitivity": self.sensitivity, "specificity": self.specificity,
                       "zone_kappa": self.zone_kappa, "zone_auroc": self.zone_auroc,
                       "folds": [asdict(f) for f in self.folds]})


@dataclass(frozen=True)
class ZoneFitResult:
    """What :func:`fit_zone_reader` wrote and measured."""

    model_path: Path
    failures_path: Path
    films: int
    patients: int
    failures: int
    abnormal_zones: int
    selection: Selection
    threshold_rule: str
    folds: int
    cv: CVResult
    normative_kappa: float
    normative_threshold: float
    first_failure: str = ""

    def summary_lines(self) -> list[str]:
        """What the command prints."""
        cv = self.cv
        ci = "" if cv.kappa_ci is None else f" (95% CI {cv.kappa_ci[0]:.2f} to {cv.kappa_ci[1]:.2f}, patient bootstrap)"
        zk = " ".join(f"{z} {_fmt(v)}" for z, v in cv.zone_kappa.items())
        za = " ".join(f"{z} {_fmt(v)}" for z, v in cv.zone_auroc.items())
        return [
            f"read {self.films} films ({self.patients} patients), {self.failures} failures -> {self.failures_path}"
            f"{self.first_failure}; {self.abnormal_zones} of {6 * self.films} zones abnormal (label > 0)",
            f"chosen by {self.folds}-fold patient-grouped CV on all films: penalty l2={self.selection.l2:g}, "
            f"flag when p >= {self.selection.threshold:.3f} (rule {self.threshold_rule})",
            f"nested CV κ {cv.kappa:.3f}{ci}; AUROC {cv.auroc:.3f}; sens {100 * cv.sensitivity:.1f} "
            f"spec {100 * cv.specificity:.1f} [{cv.scheme}]",
            f"  per zone κ: {zk}",
            f"  per zone AUROC: {za}",
            f"  per fold κ: {' '.join(_fmt(f.kappa) for f in cv.folds)}" if len(cv.folds) <= 10 else
            f"  per fold κ: {len(cv.folds)} outer folds, listed in the sidecar",
            f"normative flags on the same films (z > {self.normative_threshold:.2f}): κ {self.normative_kappa:.3f}",
            f"wrote {self.model_path} (+ {self.model_path.with_suffix('.json').name})",
        ]


# --- metrics ---------------------------------------------------------------------------------------
def _fmt(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.2f}"


def _clean(value: Any) -> Any:
    """NaN → None, tuples → lists, numpy scalars → floats (for JSON)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float | np.floating):
        return None if not math.isfinite(float(value)) else round(float(value), 6)
    if isinstance(value, np.integer):
        return int(value)
    return value


def _opt(v: float) -> float | None:
    return None if not math.isfinite(v) else v


def cohen_kappa(truth: np.ndarray, pred: np.ndarray) -> float:
    """Cohen's κ of two binary arrays (0 when the expected agreement is 1)."""
    t, p = np.asarray(truth, bool).ravel(), np.asarray(pred, bool).ravel()
    if t.size == 0:
        return float("nan")
    po = float((t == p).mean())
    pe = float(t.mean() * p.mean() + (1 - t.mean()) * (1 - p.mean()))
    return (po - pe) / (1 - pe) if pe < 1 else 0.0


def auroc(score: np.ndarray, truth: np.ndarray) -> float:
    """Area under the ROC curve of ``score`` for ``truth`` (ties count half); NaN when a class is absent."""
    s, t = np.asarray(score, float).ravel(), np.asarray(truth, bool).ravel()
    pos, neg = s[t], s[~t]
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    ranks = _average_ranks(np.concatenate([pos, neg]))
    return float((ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2) / (pos.size * neg.size))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    ranks = np.empty(x.size)
    start = 0
    for end in np.append(np.flatnonzero(np.diff(xs)) + 1, x.size):
        ranks[order[start:end]] = (start + end + 1) / 2
        start = end
    return ranks


def choose_threshold(prob: np.ndarray, truth: np.ndarray, rule: str) -> tuple[float, float]:
    """``(threshold, score)``: the flag threshold (flag when ``prob >= threshold``) among the rounded probabilities
    maximising the rule (:data:`THRESHOLD_RULES`) and that maximum; the lowest such threshold on ties."""
    if rule not in THRESHOLD_RULES:
        raise ConfigError(f"threshold rule must be one of {THRESHOLD_RULES}, got {rule!r}")
    p, t = np.asarray(prob, float).ravel(), np.asarray(truth, bool).ravel()
    cands = np.unique(np.round(p, 4))
    pos, neg = np.sort(p[t]), np.sort(p[~t])
    tp = pos.size - np.searchsorted(pos, cands, side="left")
    fp = neg.size - np.searchsorted(neg, cands, side="left")
    fn, tn = pos.size - tp, neg.size - fp
    if rule == "youden":
        score = tp / max(pos.size, 1) - fp / max(neg.size, 1)
    else:
        n = float(p.size)
        po = (tp + tn) / n
        pe = ((tp + fp) * (tp + fn) + (fn + tn) * (fp + tn)) / n**2
        score = np.where(pe < 1, (po - pe) / np.where(pe < 1, 1 - pe, 1.0), 0.0)
    best = int(np.argmax(score))
    return float(cands[best]), float(score[best])


# --- folds and fits --------------------------------------------------------------------------------
def _fit(x: np.ndarray, t: np.ndarray, l2: float, threshold: float = 0.5,
         meta: dict[str, Any] | None = None) -> ZoneClassifier:
    """The classifier on the zones of ``x`` (films × 6 × features) with labels ``t`` (films × 6)."""
    return ZoneClassifier.fit(x.reshape(-1, x.shape[2]), t.ravel().astype(float), FEATURE_NAMES, l2, threshold, meta)


def _prob(clf: ZoneClassifier, x: np.ndarray) -> np.ndarray:
    return clf.probability(x.reshape(-1, x.shape[2])).reshape(-1, 6)


def select_penalty(x: np.ndarray, t: np.ndarray, patients: Sequence[str], folds: int, rule: str,
                   seed: int | Sequence[int]) -> Selection:
    """Penalty and threshold with the best rule score on the out-of-fold probabilities of a ``folds``-fold CV
    grouped by patient (fewer folds when there are fewer patients); the larger penalty on ties."""
    k = min(folds, len(set(patients)))
    fold = patient_folds(patients, k, seed)
    best: Selection | None = None
    for l2 in sorted(L2_GRID, reverse=True):
        prob = np.zeros(t.shape)
        for f in range(k):
            train = fold != f
            prob[~train] = _prob(_fit(x[train], t[train], l2), x[~train])
        threshold, score = choose_threshold(prob, t, rule)
        if best is None or score > best.score:
            best = Selection(l2, threshold, score)
    assert best is not None
    return best


def _zone_scores(prob: np.ndarray, pred: np.ndarray, t: np.ndarray) -> tuple[dict[str, float | None],
                                                                              dict[str, float | None]]:
    kap = {z: _opt(cohen_kappa(t[:, j], pred[:, j])) for j, z in enumerate(ZONES)}
    auc = {z: _opt(auroc(prob[:, j], t[:, j])) for j, z in enumerate(ZONES)}
    return kap, auc


def patient_bootstrap(t: np.ndarray, pred: np.ndarray, patients: Sequence[str], n: int,
                      seed: int | Sequence[int]) -> tuple[float, float] | None:
    """95 % percentile interval of κ over ``n`` resamples of the patients (with replacement); None when n = 0."""
    if n <= 0:
        return None
    names = sorted(set(patients))
    rows = {p: np.flatnonzero(np.asarray(patients) == p) for p in names}
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n):
        idx = np.concatenate([rows[names[i]] for i in rng.integers(0, len(names), len(names))])
        values.append(cohen_kappa(t[idx], pred[idx]))
    lo, hi = np.nanpercentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def nested_cv(x: np.ndarray, t: np.ndarray, patients: Sequence[str], folds: int, rule: str, seed: int,
              leave_one_patient_out: bool = False, bootstrap: int = 1000) -> CVResult:
    """Out-of-fold flags of every film: each outer fold (K-fold grouped by patient, or one patient) is scored by a
    classifier whose penalty and threshold :func:`select_penalty` chose on the other films only."""
    if leave_one_patient_out:
        names = sorted(set(patients))
        outer = np.array([names.index(p) for p in patients], dtype=np.int64)
        scheme = f"nested leave-one-patient-out, inner {folds}-fold grouped by patient"
    else:
        outer = patient_folds(patients, folds, seed)
        scheme = f"nested {folds}-fold grouped by patient, inner {folds}-fold"
    prob, pred = np.zeros(t.shape), np.zeros(t.shape, dtype=bool)
    results = []
    pts = np.asarray(patients)
    for f in range(int(outer.max()) + 1):
        test = outer == f
        train_patients = list(pts[~test])
        sel = select_penalty(x[~test], t[~test], train_patients, folds, rule, [seed, f + 1])
        prob[test] = _prob(_fit(x[~test], t[~test], sel.l2), x[test])
        pred[test] = prob[test] >= sel.threshold
        zk, za = _zone_scores(prob[test], pred[test], t[test])
        results.append(FoldResult(f, int(test.sum()), len(set(pts[test])), sel.l2, sel.threshold,
                                  _opt(cohen_kappa(t[test], pred[test])), _opt(auroc(prob[test], t[test])), zk, za))
    zk, za = _zone_scores(prob, pred, t)
    return CVResult(scheme, prob, pred, results, cohen_kappa(t, pred),
                    patient_bootstrap(t, pred, patients, bootstrap, [seed, 0]), auroc(prob, t),
                    float(pred[t].mean()), float((~pred[~t]).mean()), zk, za)


# --- reading -----------------------------------------------------------------------------------------
def _label_value(raw: str | None, column: str) -> int:
    """A zone label 0..MAX_LABEL from its CSV text; :class:`InputError` naming the column otherwise."""
    text = (raw or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"label {column} = {text!r} is not a number 0-{MAX_LABEL}") from None
    if not value.is_integer() or not 0 <= value <= MAX_LABEL:
        raise InputError(f"label {column} = {text!r} is out of range (integers 0-{MAX_LABEL})")
    return int(value)


def read_zone_labels(labels: Path, images: Path, image_col: str = "image", label_prefix: str = "",
                     patients_col: str | None = None) -> tuple[list[LabelledFilm], list[Failure]]:
    """The usable rows of the label CSV and a :class:`Failure` per unusable row (image missing, duplicate, label
    out of range or missing, no patient id). A missing file or column is an :class:`InputError` naming it."""
    if not labels.is_file():
        raise InputError("label CSV not found", labels)
    columns = [f"{label_prefix}{z}" for z in ZONES]
    with labels.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        needed = [image_col, *columns, *([patients_col] if patients_col else [])]
        missing = [c for c in needed if c not in header]
        if missing:
            raise InputError(f"label CSV lacks the column(s) {missing} (it has {header}; zone columns are "
                             f"--label-prefix + A..F)", labels)
        rows = list(reader)
    films: list[LabelledFilm] = []
    failures: list[Failure] = []
    seen: set[str] = set()
    for line, row in enumerate(rows, start=2):
        name = (row.get(image_col) or "").strip()
        where = f"{labels}:{line}"
        try:
            if not name:
                raise InputError(f"row {line} has no {image_col}")
            where = str(images / name)
            if name in seen:
                raise InputError(f"row {line}: {name} is listed twice")
            if not (images / name).is_file():
                raise InputError(f"row {line}: image not found under {images}")
            values = tuple(_label_value(row.get(c), c) for c in columns)
            patient = (row.get(patients_col) or "").strip() if patients_col else name
            if not patient:
                raise InputError(f"row {line} has no {patients_col}")
        except InputError as exc:
            failures.append(Failure(where, "labels", str(exc), type(exc).__name__))
            continue
        seen.add(name)
        films.append(LabelledFilm(name, images / name, values, patient))
    return films, failures


def read_labelled_films(films: Sequence[LabelledFilm], segmenter: LungHeartSegmenter, model: NormativeModel,
                        progress: bool = False) -> tuple[list[ReadFilm], list[Failure]]:
    """Zone features of every film (a :class:`Failure` per unreadable film or film without both lungs), with a
    progress bar when ``progress``."""
    from cxrground.io.progress import progress_bar

    out: list[ReadFilm] = []
    failures: list[Failure] = []
    for film in progress_bar(films, desc="reading films", unit="film", progress=progress):
        try:
            feats, scores = film_features(read_image(film.path), segmenter, model)
        except BatchStopped:  # a library of an extra missing: every film would fail alike
            raise
        except CXRGroundError as exc:
            failures.append(Failure.from_exception(film.path, "zones", exc))
            continue
        out.append(ReadFilm(film, feats, np.array([scores[z] for z in ZONES]), sha256_file(film.path)))
    return out, failures


def _check_usable(read: Sequence[ReadFilm], folds: int, leave_one_patient_out: bool, labels: Path,
                  failures_path: Path) -> None:
    """Clear errors for too few films or patients for the CV, or a zone whose labels are all one class."""
    where = f"(failures listed in {failures_path})"
    if len(read) < MIN_FILMS:
        raise InputError(f"only {len(read)} usable films {where}; fit-zones needs at least {MIN_FILMS}", labels)
    patients = len({r.film.patient for r in read})
    need = folds + 1 if leave_one_patient_out else 2 * folds
    if patients < need:
        raise InputError(f"{patients} patients among the usable films are too few for a nested {folds}-fold CV "
                         f"(needs {need}); lower --folds", labels)
    t = np.array([r.film.abnormal for r in read])
    one_class = [f"{z} ({'all abnormal' if t[:, j].all() else 'all normal'})"
                 for j, z in enumerate(ZONES) if t[:, j].all() or not t[:, j].any()]
    if one_class:
        raise InputError(f"zone(s) {', '.join(one_class)} have one class only among the usable films; a zone "
                         "reader needs normal and abnormal examples of every zone", labels)


def fit_segmenter() -> LungHeartSegmenter:
    """The segmenter ``anatomy fit-zones`` reads films with: the lungs of ``anatomy zones``' default (the shipped lung
    U-Net), on the process's torch threads (``--threads``); the heart is not a zone feature."""
    from cxrground.anatomy.segment import get_segmenter

    return get_segmenter("unet", estimate_heart=False)


def fit_zone_reader(request: ZoneFitRequest, segmenter: LungHeartSegmenter, progress: bool = False) -> ZoneFitResult:
    """Read the labelled films, cross-validate, fit and save the zone reader (see the module docstring)."""
    from cxrground import __version__

    r = request
    if r.threshold_rule not in THRESHOLD_RULES:
        raise ConfigError(f"threshold rule must be one of {THRESHOLD_RULES}, got {r.threshold_rule!r}")
    if r.folds < 2:
        raise ConfigError(f"folds must be at least 2, got {r.folds}")
    model = NormativeModel.load(r.normative)
    out = Path(r.out).with_suffix(".npz")
    failures_path = out.with_suffix(".failures.jsonl")
    films, failures = read_zone_labels(r.labels, r.images, r.image_col, r.label_prefix, r.patients_col)
    read, bad = read_labelled_films(films, segmenter, model, progress)
    failures += bad
    failures_path.parent.mkdir(parents=True, exist_ok=True)
    failures_path.write_text("".join(json.dumps(f.to_dict()) + "\n" for f in failures), encoding="utf-8")
    _check_usable(read, r.folds, r.leave_one_patient_out, r.labels, failures_path)

    x = np.stack([f.features for f in read])
    t = np.stack([f.film.abnormal for f in read])
    patients = [f.film.patient for f in read]
    cv = nested_cv(x, t, patients, r.folds, r.threshold_rule, r.seed, r.leave_one_patient_out, r.bootstrap)
    sel = select_penalty(x, t, patients, r.folds, r.threshold_rule, [r.seed, 0])
    normative_scores = np.stack([f.normative_scores for f in read])
    normative_kappa = cohen_kappa(t, np.isfinite(normative_scores) & (normative_scores > model.zone_threshold))
    meta = {
        "reader": ZONE_FIT_METHOD,
        "threshold_rule": r.threshold_rule,
        "label_source": {"csv": str(r.labels), "sha256": sha256_file(r.labels), "image_column": r.image_col,
                         "zone_columns": [f"{r.label_prefix}{z}" for z in ZONES], "patients_column": r.patients_col,
                         "abnormal": "label > 0"},
        "training_images": [{"image": f.film.image, "sha256": f.sha256, "patient": f.film.patient} for f in read],
        "training": {"films": len(read), "patients": len(set(patients)), "abnormal_zones": int(t.sum()),
                     "failures": len(failures), "seed": r.seed, "folds": r.folds, "l2_grid": list(L2_GRID),
                     "selection_score": round(sel.score, 6)},
        "cv": cv.to_dict(),
        "normative_flags_kappa": _clean(normative_kappa),
        "normative": {"path": model.meta.get("path"), "sha256": normative_hash(model), "method": NORMATIVE_METHOD,
                      "zone_threshold": round(float(model.zone_threshold), 6)},
        "segmenter": getattr(segmenter, "name", type(segmenter).__name__),
        "code_version": __version__,
    }
    path = _fit(x, t, sel.l2, sel.threshold, meta).save(out)
    return ZoneFitResult(path, failures_path, len(read), len(set(patients)), len(failures), int(t.sum()), sel,
                         r.threshold_rule, r.folds, cv, normative_kappa, float(model.zone_threshold),
                         first_failure(failures))
