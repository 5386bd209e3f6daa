"""A shippable zone reader trained on simulated lesions in real normal films (issue 14), scored once on Brixia.

Run: ``.venv/bin/python bench/zone_sim.py [--cache DIR] [--copies 8] [--save FILE [--overwrite]] [--lungs NAME|FILE]``
(caches lungs and features in a folder of DIR per lung U-Net; ``--save`` writes the picked reader, over an existing
file only with ``--overwrite``). The films are segmented with the lung U-Net ``--lungs``: by default
``lung_unet_v1``, the lungs the shipped ``zone_sim_v1`` was fitted through (its ``segmenter``; :mod:`fit_lungs`).

**Training rows (all shippable).** The pack's NIH ChestX-ray14 films labelled ``No Finding`` (U-Net lungs, 512 px
= the working grid), each copied :data:`COPIES` times with simulated lesions
(:func:`cxrground.lesions.lesion_sim.simulate_lesions`; zone labels read off the inserted field, some copies
negative). Features: :data:`cxrground.lesions.zone_features.FEATURE_NAMES` under a normative model that never saw
the film (NIH films in 5 patient-grouped folds; a fold's films are read by the model fitted on the other folds'
No Finding films). No COVID-19 film and no Brixia score enters any training or choice below.

**Candidates** (fixed before running): lesion variant × feature set × penalty.

- lesion variants: ``default`` (:class:`~cxrground.lesions.lesion_sim.LesionSimParams` defaults), ``subtle`` (all
  attenuation ranges halved: fainter disease), ``no-gamma`` (no global gamma augmentation);
- feature sets: ``all`` (27), ``no-grey`` (without the lungs' grey level, a possible source marker), ``local``
  (the zone's own statistics, its asymmetry and position; no whole-film feature);
- L2 penalty 1 / 10 / 100.

**Numbers per candidate** (5-fold CV grouped by NIH patient; the classifier of fold k is trained on the simulated
copies of the other folds' films and scores fold k's simulated copies and fold k's real NIH films):
``sim`` = zone AUROC on the held-out simulated copies; ``loc`` = the fixed localisation sanity check: NIH films
whose only opacity-type label is Effusion, AUROC of the lower zones' (C, F) probabilities against the upper
zones' (A, D); ``opac`` = film AUROC (mean zone probability) of the NIH films with a lung-opacity label
(:data:`~cxrground.lesions.normative_fit.OPACITY_LABELS`) against the No Finding films.

**Pre-registered choice rule (written before any Brixia score of these readers was computed).** Keep the
candidates with ``loc ≥ 0.60`` and ``sim ≥ 0.70``; among them take the highest ``opac`` (real, shippable transfer);
within 0.005 of it, the larger penalty, then the ``default`` lesions, then the feature set in the order all,
no-grey, local. Its flag threshold: Youden's J on its out-of-fold probabilities of the simulated zones. The final
reader is trained on all simulated copies (:func:`cxrground.lesions.zone_sim_fit.fit_zone_sim`). It is scored ONCE
on the 71 Brixia films (senior reader > 0 = abnormal; NC-SA: evaluation only) with the pack's lung masks, the
comparison of the README table: Cohen's κ overall and per zone, with a 95 % bootstrap CI over patients (2000
resamples); the U-Net lungs row of the same reader is printed as well. **Ship rule**: ship only if that κ
(pack masks) exceeds the shipped normative flags' κ on the same films by more than the CI's half-width.
Everything printed after the line "POST-HOC" (other candidates' Brixia κ) is not a choice.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
from fit_lungs import add_lungs_option, lung_segmenter, resolve_lungs
from real_quality import ZONES, auroc, kappa, work_features
from weights_out import add_out_options, refuse_existing

from cxrground.datasets.pack import Pack
from cxrground.lesions.lesion_sim import LesionSimParams
from cxrground.lesions.normative import NormativeModel
from cxrground.lesions.normative_fit import FOLDS, OPACITY_LABELS, nih_patient
from cxrground.lesions.zone_classifier import ZoneClassifier
from cxrground.lesions.zone_features import FEATURE_NAMES, feature_columns
from cxrground.lesions.zone_sim_fit import (
    ZoneSimRecipe,
    default_zone_sim_path,
    fit_zone_sim,
    fold_models,
    oof_probability,
    simulated_zone_rows,
)

#: The lung U-Net the shipped ``zone_sim_v1`` was fitted through (its sidecar's ``segmenter``).
LUNGS = "lung_unet_v1"
COPIES = 8
SEED = 0
_BASE = LesionSimParams()
VARIANTS: dict[str, LesionSimParams] = {
    "default": _BASE,
    "subtle": replace(_BASE, **{k: tuple(0.5 * v for v in getattr(_BASE, k)) for k in
                                ("ground_glass_attenuation", "airspace_attenuation", "effusion_attenuation")}),
    "no-gamma": replace(_BASE, gamma=(1.0, 1.0)),
}
_FILM_LEVEL = {n for n in FEATURE_NAMES if n.startswith("film_")}
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "all": FEATURE_NAMES,
    "no-grey": tuple(n for n in FEATURE_NAMES if n != "film_lung_grey"),
    "local": tuple(n for n in FEATURE_NAMES if n not in _FILM_LEVEL),
}
L2_GRID = (1.0, 10.0, 100.0)
SHIPPED_KAPPA_README = 0.12


def nih_films(pack: Pack, cache: Path, lungs: Path) -> dict[str, np.ndarray]:
    """NIH films with both U-Net lungs (pixels, masks, labels, patients, ids; lung U-Net ``lungs``), cached in
    ``cache``."""
    path = cache / "nih.npz"
    if not path.is_file():
        seg = lung_segmenter(lungs, threads=1)
        px, rr, ll, labs, pats, ids = [], [], [], [], [], []
        for rec in pack.nih():
            im = rec.read()
            s = seg.segment(im)
            if s.right_lung.any() and s.left_lung.any():
                px.append(im.pixels), rr.append(s.right_lung), ll.append(s.left_lung)
                labs.append("|".join(rec.labels)), pats.append(nih_patient(rec)), ids.append(rec.image_id)
        cache.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, pixels=np.stack(px), right=np.stack(rr), left=np.stack(ll), labels=np.array(labs),
                            patients=np.array(pats), ids=np.array(ids))
    with np.load(path) as d:
        return {k: d[k] for k in d.files}


def brixia_rows(pack: Pack, model: NormativeModel, cache: Path, lungs: Path) -> dict[str, np.ndarray]:
    """Zone features of the Brixia films (pack masks and the lungs of U-Net ``lungs``), senior labels and patients
    (cached)."""
    path = cache / "brixia.npz"
    if not path.is_file():
        seg = lung_segmenter(lungs, threads=1)
        out: dict[str, list] = {"masks": [], "unet": [], "truth": [], "patients": []}
        for rec in (r for r in pack.cohen() if r.brixia is not None):
            im = rec.read()
            right, left = rec.lungs(im.shape)
            s = seg.segment(im)
            if not (right.any() and left.any() and s.right_lung.any() and s.left_lung.any()):
                continue
            out["masks"].append(work_features(model, im.pixels, right, left))
            out["unet"].append(work_features(model, im.pixels, s.right_lung, s.left_lung))
            out["truth"].append([rec.brixia.senior[k] > 0 for k in ZONES])
            out["patients"].append(rec.patient_id)
        np.savez(path, **{k: np.array(v) for k, v in out.items()})
    with np.load(path) as d:
        return {k: d[k] for k in d.files}


def fold_features(nih: dict[str, np.ndarray]) -> tuple[list[NormativeModel], np.ndarray, np.ndarray]:
    """Per NIH film: the normative model of its fold (fitted without the fold), its fold, its real zone features."""
    films = list(zip(nih["pixels"], nih["right"], nih["left"], strict=True))
    models, folds = fold_models(films, list(nih["patients"]), list(nih["labels"] == "No Finding"))
    feats = np.array([work_features(m, *f) for m, f in zip(models, films, strict=True)])
    return models, folds, feats


def sim_rows(name: str, nih: dict[str, np.ndarray], models: list[NormativeModel], copies: int,
             cache: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Simulated copies of the No Finding films under lesion variant ``name``: features, zone labels, source film."""
    params = VARIANTS[name]
    key = hashlib.sha256(json.dumps([asdict(params), copies, SEED], sort_keys=True).encode()).hexdigest()[:12]
    path = cache / f"sim-{name}-{key}.npz"
    if not path.is_file():
        idx = np.flatnonzero(nih["labels"] == "No Finding")
        films = [(nih["pixels"][i], nih["right"][i], nih["left"][i]) for i in idx]
        t = time.perf_counter()
        x, y, src = simulated_zone_rows(films, [str(nih["ids"][i]) for i in idx], [models[i] for i in idx], params,
                                        copies, SEED)
        np.savez(path, x=x, y=y, src=idx[src])
        print(f"  simulated {len(x)} copies ({name}) in {time.perf_counter() - t:.0f} s")
    with np.load(path) as d:
        return d["x"], d["y"], d["src"]


def bootstrap_kappa(truth: np.ndarray, pred: np.ndarray, patients: np.ndarray, n: int = 2000,
                    seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of κ over patients resampled with replacement."""
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(patients == p) for p in np.unique(patients)]
    vals = []
    for _ in range(n):
        pick = np.concatenate([groups[i] for i in rng.integers(0, len(groups), len(groups))])
        vals.append(kappa(truth[pick], pred[pick]))
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return float(lo), float(hi)


def row(name: str, truth: np.ndarray, pred: np.ndarray, prob: np.ndarray | None = None) -> str:
    """κ overall and per zone, sensitivity, specificity (and zone AUROC when ``prob`` is given)."""
    t, p = truth.astype(bool), pred.astype(bool)
    sens, spec = (t & p).sum() / max(1, t.sum()), (~t & ~p).sum() / max(1, (~t).sum())
    per = " ".join(f"{z} {kappa(t[:, j], p[:, j]):5.2f}" for j, z in enumerate(ZONES))
    auc = f"  AUROC {auroc(prob[t], prob[~t]):.3f}" if prob is not None else ""
    return f"  {name:<46} κ {kappa(t, p):5.2f}  sens {100 * sens:5.1f}  spec {100 * spec:5.1f}  | {per}{auc}"


def evaluate(x: np.ndarray, y: np.ndarray, src: np.ndarray, folds: np.ndarray, nih_feats: np.ndarray,
             labels: np.ndarray, fs: str, l2: float) -> dict[str, float]:
    """CV numbers of one candidate (see the module docstring)."""
    feats = FEATURE_SETS[fs]
    cols = feature_columns(feats)
    sim_prob = oof_probability(x, y, folds[src], feats, l2)
    real = np.zeros((len(nih_feats), 6))
    for k in range(FOLDS):
        tr = folds[src] != k
        clf = ZoneClassifier.fit(x[tr][:, :, cols].reshape(-1, len(cols)), y[tr].ravel().astype(float), feats, l2)
        real[folds == k] = clf.probability(nih_feats[folds == k][:, :, cols].reshape(-1, len(cols))).reshape(-1, 6)
    labs = [set(s.split("|")) for s in labels]
    normal = np.array([lab == {"No Finding"} for lab in labs])
    opac = np.array([bool(lab & OPACITY_LABELS) for lab in labs])
    eff = np.array([lab & OPACITY_LABELS == {"Effusion"} for lab in labs])
    film = real.mean(axis=1)
    return {"sim": auroc(sim_prob[y], sim_prob[~y]), "loc": auroc(real[eff][:, [2, 5]].ravel(),
                                                                     real[eff][:, [0, 3]].ravel()),
            "opac": auroc(film[opac], film[normal]), "n_eff": int(eff.sum()), "n_opac": int(opac.sum()),
            "n_normal": int(normal.sum())}


def choose(cands: list[dict]) -> dict:
    """The pre-registered rule of the module docstring."""
    ok = [c for c in cands if c["loc"] >= 0.60 and c["sim"] >= 0.70]
    if not ok:
        raise SystemExit("no candidate passes the fixed sanity checks; nothing is scored on Brixia")
    top = max(c["opac"] for c in ok)
    near = [c for c in ok if c["opac"] >= top - 0.005]
    order = {"default": 0, "subtle": 1, "no-gamma": 2}
    fs_order = {"all": 0, "no-grey": 1, "local": 2}
    return min(near, key=lambda c: (-c["l2"], order[c["variant"]], fs_order[c["fs"]]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/zonesynth-bench"))
    parser.add_argument("--copies", type=int, default=COPIES)
    add_out_options(parser, "the pre-registered reader (.npz + .json)", flag="--save")
    parser.add_argument("--no-brixia", action="store_true", help="stop before any Brixia score")
    add_lungs_option(parser, LUNGS, "the shipped zone_sim_v1")
    args = parser.parse_args()
    lungs = resolve_lungs(parser, args.lungs)
    identity = lung_segmenter(lungs).identity()
    if args.save is not None:
        refuse_existing(parser, [args.save.with_suffix(".npz"), args.save.with_suffix(".json")], args.overwrite,
                        "--save")
    cache = args.cache / f"lungs-{identity['sha256'][:16]}"  # lungs and features of other lungs are never reused
    cache.mkdir(parents=True, exist_ok=True)
    pack = Pack()
    t0 = time.perf_counter()
    nih = nih_films(pack, cache, lungs)
    models, folds, nih_feats = fold_features(nih)
    n_norm = int((nih["labels"] == "No Finding").sum())
    print(f"## Zone reader from simulated lesions: {len(nih['ids'])} NIH films with both lungs, {n_norm} No Finding "
          f"films x {args.copies} simulated copies ({time.perf_counter() - t0:.0f} s so far)")
    data = {}
    for name in VARIANTS:
        x, y, src = sim_rows(name, nih, models, args.copies, cache)
        data[name] = (x, y, src)
        print(f"  {name:<9} {len(x)} copies, {int(y.sum())} of {y.size} zones abnormal, films with all six "
              f"{int(y.all(axis=1).sum())}, negative films {int((~y).all(axis=1).sum())}; abnormal share per zone "
              + " ".join(f"{z} {m:.2f}" for z, m in zip(ZONES, y.mean(axis=0), strict=True)))
    cands = []
    print("Candidates, 5-fold CV grouped by NIH patient (sim = simulated zone AUROC; loc = NIH effusion-only films, "
          "lower vs upper zones; opac = NIH opacity vs No Finding film AUROC):")
    for name, (x, y, src) in data.items():
        for fs in FEATURE_SETS:
            for l2 in L2_GRID:
                c = {"variant": name, "fs": fs, "l2": l2,
                     **evaluate(x, y, src, folds, nih_feats, nih["labels"], fs, l2)}
                cands.append(c)
                print(f"  {name:<9} {fs:<8} l2 {l2:<4g} sim {c['sim']:.3f}  loc {c['loc']:.3f}  opac {c['opac']:.3f}")
    print(f"  (loc on {cands[0]['n_eff']} effusion-only films; opac {cands[0]['n_opac']} vs {cands[0]['n_normal']})")
    best = choose(cands)
    x, y, src = data[best["variant"]]
    recipe = ZoneSimRecipe(VARIANTS[best["variant"]], args.copies, FEATURE_SETS[best["fs"]], best["l2"], SEED)
    clf = fit_zone_sim(x, y, folds[src], recipe, {"segmenter": identity["name"], "lungs": identity})
    top = sorted(zip(clf.coef, clf.feature_names, strict=True), key=lambda t: -abs(t[0]))[:6]
    print(f"Pre-registered pick: lesions {best['variant']}, features {best['fs']}, l2 {best['l2']:g} (sim "
          f"{best['sim']:.3f}, loc {best['loc']:.3f}, opac {best['opac']:.3f}); threshold {clf.threshold:.4f} "
          f"(Youden on out-of-fold simulated zones); largest coefficients: "
          + ", ".join(f"{n} {c:+.2f}" for c, n in top))
    if args.save is not None:
        print(f"  saved {clf.save(args.save)}")
    if default_zone_sim_path().is_file():
        shipped_reader = ZoneClassifier.load(default_zone_sim_path())
        same = shipped_reader.feature_names == clf.feature_names and np.allclose(shipped_reader.coef, clf.coef) \
            and np.isclose(shipped_reader.threshold, clf.threshold)
        print(f"  the shipped {default_zone_sim_path().name} is this reader: {'yes' if same else 'NO'}")
    if args.no_brixia:
        return
    shipped = NormativeModel.load()
    brix = brixia_rows(pack, shipped, cache, lungs)
    t, pats = brix["truth"], brix["patients"]
    cols = feature_columns(recipe.features)
    zcol = FEATURE_NAMES.index("z_p75")
    print(f"\n## Brixia, ONE pre-registered score: {len(t)} films, {len(set(pats))} patients, {int(t.sum())} of "
          f"{t.size} zones abnormal (senior > 0)")
    for lungs in ("masks", "unet"):
        f = brix[lungs]
        prob = clf.probability(f[:, :, cols].reshape(-1, len(cols))).reshape(-1, 6)
        flags = f[:, :, zcol] > shipped.zone_threshold
        lo, hi = bootstrap_kappa(t, prob >= clf.threshold, pats)
        slo, shi = bootstrap_kappa(t, flags, pats)
        print(row(f"sim-trained reader, lungs = {lungs}", t, prob >= clf.threshold, prob)
              + f"  95% CI [{lo:.2f}, {hi:.2f}]")
        print(row(f"shipped normative flags z>{shipped.zone_threshold:.2f}, lungs = {lungs}", t, flags)
              + f"  95% CI [{slo:.2f}, {shi:.2f}]")
        if lungs == "masks":
            k_new, k_old = kappa(t, prob >= clf.threshold), kappa(t, flags)
            half = (hi - lo) / 2
            verdict = "SHIP" if k_new - k_old > half else "do not ship"
            print(f"  ship rule: κ {k_new:.2f} − shipped {k_old:.2f} = {k_new - k_old:+.2f} vs CI half-width "
                  f"{half:.2f} -> {verdict}")
    print("\nPOST-HOC (after the pre-registered score; not a choice):")
    for lungs in ("masks", "unet"):
        f = brix[lungs]
        prob = clf.probability(f[:, :, cols].reshape(-1, len(cols))).reshape(-1, 6)
        z = f[:, :, zcol]
        best_t = max(np.unique(np.round(prob, 3)), key=lambda c: kappa(t, prob >= c))
        print(f"  lungs = {lungs}: the pick's best threshold on these films {best_t:.3f} -> κ "
              f"{kappa(t, prob >= best_t):.2f} (optimistic: chosen on the scored films); zone AUROC of the shipped "
              f"z score {auroc(z[t], z[~t]):.3f}, of the pick {auroc(prob[t], prob[~t]):.3f}")
    print("Every candidate's Brixia κ at its own (simulated Youden) threshold:")
    for c in cands:
        x, y, src = data[c["variant"]]
        rec = ZoneSimRecipe(VARIANTS[c["variant"]], args.copies, FEATURE_SETS[c["fs"]], c["l2"], SEED)
        m = fit_zone_sim(x, y, folds[src], rec)
        cc = feature_columns(rec.features)
        res = []
        for lungs in ("masks", "unet"):
            p = m.probability(brix[lungs][:, :, cc].reshape(-1, len(cc))).reshape(-1, 6)
            res.append(f"{lungs} κ {kappa(t, p >= m.threshold):5.2f} AUROC {auroc(p[t], p[~t]):.3f}")
        print(f"  {c['variant']:<9} {c['fs']:<8} l2 {c['l2']:<4g} loc {c['loc']:.3f} opac {c['opac']:.3f} "
              f"th {m.threshold:.3f} -> " + "  ".join(res))
    print(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
