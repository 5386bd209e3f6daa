"""Real-film quality of the built-in chain without reports: zone abnormality vs Brixia, NIH labels and
boxes, and the CTR of the seen heart. No film is scored by a model that saw it.

Run: ``.venv/bin/python bench/real_quality.py [--lungs masks|unet]``.

1. **Brixia** (COVID-19 collection rows with Brixia scores; none trained the normative model, which saw
   NIH normal films only): a zone is abnormal when the senior reader scored it > 0. Compared with it:
   the zone flags at the shipped threshold (chosen on NIH, no Brixia film involved); the same zone scores
   with one threshold chosen leave-one-patient-out on the Brixia films (a site calibration); the junior
   reader (the ceiling); "all zones abnormal"; the zones named by the notes (text only, rule structurer);
   and the trivial baseline of the issue (one threshold per zone on the zone's mean normalised intensity,
   chosen leave-one-patient-out). Cohen's κ per zone and overall, sensitivity, specificity.
2. **NIH** (621 films, U-Net lungs): 5 folds grouped by patient; each fold is scored by a normative model
   fitted on the normal films of the other folds. AUROC of film scores against the labels that map to
   zones (effusion: highest of the lower zones C/F; consolidation or infiltration, atelectasis: highest
   zone; edema: mean of the six zones) and of the seen heart's CTR against Cardiomegaly; the CTR
   distribution of normal films against adult norms (0.40–0.55); pointing game on the NIH boxes (lung
   findings: the z-map's maximum; cardiomegaly: the heart mask's centroid).
3. **Heart parameters, nested**: the seen-heart settings were chosen on these NIH films; the nested
   estimate picks them from a small grid on 4 folds (best AUROC) and scores the 5th, in turn.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from cxrground.anatomy import cardiothoracic_ratio
from cxrground.anatomy.ils_locations import lung_zone_bands
from cxrground.anatomy.normative import BRIXIA_ZONE_LABELS, NormativeModel, fit_normative, normalise_intensity
from cxrground.anatomy.segment import get_segmenter
from cxrground.anatomy.segment.heart_image import SeenHeartParams, cardiac_row_widths
from cxrground.datasets.pack import Pack
from cxrground.models.normative_fit import FOLDS, nih_patient, patient_folds
from cxrground.reports import choose_section, parse_report_text
from cxrground.reports.structure import get_structurer

ZONES = tuple(BRIXIA_ZONE_LABELS)


def kappa(truth: np.ndarray, pred: np.ndarray) -> float:
    """Cohen's kappa of two binary arrays."""
    t, p = np.asarray(truth, bool).ravel(), np.asarray(pred, bool).ravel()
    po = float((t == p).mean())
    pe = float(t.mean() * p.mean() + (1 - t.mean()) * (1 - p.mean()))
    return (po - pe) / (1 - pe) if pe < 1 else 0.0


def auroc(pos: Sequence[float], neg: Sequence[float]) -> float:
    """Area under the ROC curve (ties count half)."""
    p, n = np.asarray(pos, float)[:, None], np.asarray(neg, float)[None, :]
    return float((p > n).mean() + 0.5 * (p == n).mean())


def line(name: str, truth: np.ndarray, pred: np.ndarray) -> str:
    t, p = truth.astype(bool), pred.astype(bool)
    sens = (t & p).sum() / max(1, t.sum())
    spec = (~t & ~p).sum() / max(1, (~t).sum())
    per = " ".join(f"{z} {kappa(t[:, j], p[:, j]):5.2f}" for j, z in enumerate(ZONES))
    return f"  {name:<44} κ {kappa(t, p):5.2f}  sens {100 * sens:5.1f}  spec {100 * spec:5.1f}  | {per}"


def lopo_threshold(x: np.ndarray, truth: np.ndarray, groups: np.ndarray, per_zone: bool) -> np.ndarray:
    """Flags from thresholds chosen (max κ) on the other patients' films."""
    pred = np.zeros_like(truth, dtype=bool)
    for g in np.unique(groups):
        te = groups == g
        cols = [[j] for j in range(x.shape[1])] if per_zone else [list(range(x.shape[1]))]
        for c in cols:
            xs, ts = x[~te][:, c], truth[~te][:, c]
            cands = np.unique(xs[np.isfinite(xs)])
            best = max(cands, key=lambda t: kappa(ts, xs >= t))
            pred[np.ix_(te, c)] = x[np.ix_(te, c)] >= best
    return pred


def zone_means(pixels: np.ndarray, right: np.ndarray, left: np.ndarray) -> list[float]:
    """The trivial baseline's feature: mean normalised intensity per zone."""
    norm = normalise_intensity(pixels, right, left)
    out = []
    for lung in (right, left):
        bands = lung_zone_bands(lung)
        out += [float(norm[bands[b]].mean()) for b in ("upper zone lung", "mid zone lung", "lung base")]
    return out


def brixia(pack: Pack, lungs: str, model: NormativeModel) -> None:
    seg = get_segmenter("unet", threads=1)
    structurer = get_structurer("rules")
    rows = [r for r in pack.cohen() if r.brixia is not None]
    truth, junior, scores, means, text, groups = [], [], [], [], [], []
    for i, rec in enumerate(rows):
        im = rec.read()
        if lungs == "masks":
            right, left = rec.lungs(im.shape)
        else:
            s = seg.segment(im)
            right, left = s.right_lung, s.left_lung
        if not right.any() or not left.any():
            continue
        z = model.z_map(im.pixels, right, left)
        sc = model.zone_scores(z, right, left)
        scores.append([sc[k] for k in ZONES])
        means.append(zone_means(im.pixels, right, left))
        truth.append([rec.brixia.senior[k] > 0 for k in ZONES])
        junior.append([rec.brixia.junior[k] > 0 for k in ZONES])
        groups.append(rec.patient_id)
        named: set[str] = set()
        section = choose_section(parse_report_text(rec.notes, report_id=f"b{i}")) if rec.notes else None
        if section is not None:
            for f in structurer.structure(f"b{i}", section).findings:
                if f.lesion and f.lesion != "cardiomegaly" and f.assertion != "absent":
                    named |= set(f.reported_location or ())
        text.append([lab in named or f"{lab.split()[0]} lung" in named for lab in BRIXIA_ZONE_LABELS.values()])
    t, x, g = np.array(truth), np.array(scores), np.array(groups)
    print(f"\n## Brixia: {len(t)} films, {len(set(groups))} patients, lungs = {lungs}; "
          f"{int(t.sum())} of {t.size} zones abnormal (senior > 0)")
    print(line("junior reader (ceiling)", t, np.array(junior)))
    print(line(f"normative flags, shipped threshold z>{model.zone_threshold:.2f}", t, x > model.zone_threshold))
    print(line("normative scores, one threshold LOPO", t, lopo_threshold(x, t, g, per_zone=False)))
    print(line("normative scores, threshold per zone LOPO", t, lopo_threshold(x, t, g, per_zone=True)))
    print(line("all zones abnormal", t, np.ones_like(t)))
    print(line("zones named by the notes (text only)", t, np.array(text)))
    print(line("trivial: zone mean intensity, per zone LOPO", t, lopo_threshold(np.array(means), t, g, True)))


def nih(pack: Pack, params_grid: bool) -> None:
    seg = get_segmenter("unet", threads=1)
    records = pack.nih()
    films, keep = [], []
    start = time.perf_counter()
    for rec in records:
        im = rec.read()
        s = seg.segment(im)
        if s.right_lung.any() and s.left_lung.any():
            films.append((im.pixels, s.right_lung, s.left_lung, s.heart))
            keep.append(rec)
    print(f"\n## NIH: {len(keep)} of {len(records)} films with both lungs (U-Net + seen heart, "
          f"{time.perf_counter() - start:.0f} s)")
    folds = patient_folds([nih_patient(r) for r in keep])
    normal = np.array([r.labels == ("No Finding",) for r in keep])
    zone_scores = np.full((len(keep), 6), np.nan)
    zmaps: dict[int, np.ndarray] = {}
    boxed = {i for i, r in enumerate(keep) if r.boxes}
    for k in range(FOLDS):
        model = fit_normative([films[i][:3] for i in np.flatnonzero(normal & (folds != k))])
        for i in np.flatnonzero(folds == k):
            px, r, lft, _ = films[i]
            z = model.z_map(px, r, lft)
            sc = model.zone_scores(z, r, lft)
            zone_scores[i] = [sc[q] for q in ZONES]
            if i in boxed:
                zmaps[i] = z
    has = lambda *labels: np.array([bool(set(labels) & set(r.labels)) for r in keep])  # noqa: E731
    film = {"max": np.nanmax(zone_scores, axis=1), "lower": np.nanmax(zone_scores[:, [2, 5]], axis=1),
            "mean": np.nanmean(zone_scores, axis=1)}
    print("AUROC of held-out normative scores (label present vs absent):")
    for name, labels, score in (("Effusion", ("Effusion",), "lower"),
                                ("Consolidation or Infiltration", ("Consolidation", "Infiltration"), "max"),
                                ("Atelectasis", ("Atelectasis",), "max"), ("Edema", ("Edema",), "mean")):
        y = has(*labels)
        print(f"  {name:<30} ({score:>5} zone score)  AUROC {auroc(film[score][y], film[score][~y]):.3f}  "
              f"(n+ {int(y.sum())}, n- {int((~y).sum())})")
    y = has("Effusion", "Consolidation", "Infiltration", "Atelectasis", "Edema", "Pneumonia", "Mass")
    print(f"  {'any lung-opacity label vs No Finding':<30} (  max zone score)  AUROC "
          f"{auroc(film['max'][y], film['max'][normal]):.3f}")
    ctr = np.array([cardiothoracic_ratio(h, r, lft) if h is not None and h.any() else np.nan
                    for _, r, lft, h in films])
    cm = has("Cardiomegaly")
    ok = np.isfinite(ctr)
    print(f"CTR (seen heart): AUROC vs Cardiomegaly {auroc(ctr[cm & ok], ctr[~cm & ok]):.3f} "
          f"(n+ {int((cm & ok).sum())}, n- {int((~cm & ok).sum())}); no heart on {int((~ok).sum())} films")
    q = np.percentile(ctr[normal & ok], [25, 50, 75])
    print(f"  No Finding films: median CTR {q[1]:.3f} (IQR {q[0]:.3f}-{q[2]:.3f}), "
          f"{100 * np.mean((ctr[normal & ok] >= 0.40) & (ctr[normal & ok] <= 0.55)):.0f} % in 0.40-0.55, "
          f"{100 * np.mean(ctr[normal & ok] > 0.5):.0f} % above 0.50")
    q = np.percentile(ctr[cm & ok], [25, 50, 75])
    print(f"  Cardiomegaly films: median CTR {q[1]:.3f} (IQR {q[0]:.3f}-{q[2]:.3f}); all films median "
          f"{np.nanmedian(ctr):.3f}")
    hits, n = 0, 0
    for i in sorted(boxed):
        for b in keep[i].boxes:
            n += 1
            if b.label == "Cardiomegaly":
                h = films[i][3]
                if h is None or not h.any():
                    continue
                ys, xs = np.nonzero(h)
                py, px_ = ys.mean(), xs.mean()
            else:
                z = zmaps[i]
                py, px_ = np.unravel_index(int(np.argmax(z)), z.shape)
            hits += int(b.x <= px_ <= b.x + b.w and b.y <= py <= b.y + b.h)
    print(f"Pointing game on the NIH boxes: {hits} of {n} hits")
    if params_grid:
        nested_heart(films, cm & ok, folds, ok)


def nested_heart(films: list, cm: np.ndarray, folds: np.ndarray, ok: np.ndarray) -> None:
    """CTR AUROC with the seen-heart settings chosen on the other folds (grid of 18 settings)."""
    base = SeenHeartParams()
    grid = [replace(base, alpha=a, row_range=rr, width_percentile=pc) for a in (0.3, 0.4, 0.5)
            for rr in ((0.45, 0.8), (0.5, 0.8), (0.5, 0.85)) for pc in (50.0, 75.0)]
    ctrs = np.full((len(grid), len(films)), np.nan)
    for j, (px, r, lft, _) in enumerate(films):
        thorax = np.flatnonzero((r | lft).any(axis=0))
        width = thorax[-1] - thorax[0] + 1
        for a in (0.3, 0.4, 0.5):
            p = replace(base, alpha=a, row_range=(0.45, 0.85))
            rows = cardiac_row_widths(px, r, lft, p)
            height = np.flatnonzero((r | lft).any(axis=1))
            rel = (rows[:, 0] - height[0]) / max(height[-1] - height[0], 1)
            for gi, g in enumerate(grid):
                if g.alpha != a:
                    continue
                sel = (rel >= g.row_range[0]) & (rel < g.row_range[1])
                if sel.sum() >= g.min_rows:
                    ctrs[gi, j] = np.percentile(rows[sel, 2] - rows[sel, 1], g.width_percentile) / width
    held = np.full(len(films), np.nan)
    chosen = []
    for k in range(FOLDS):
        tr, te = folds != k, folds == k
        aucs = [auroc(c[tr & cm & np.isfinite(c)], c[tr & ~cm & np.isfinite(c)]) for c in ctrs]
        best = int(np.argmax(aucs))
        chosen.append(grid[best])
        held[te] = ctrs[best, te]
    fin = np.isfinite(held)
    print(f"Nested (settings chosen on 4 folds, scored on the 5th): CTR AUROC "
          f"{auroc(held[fin & cm], held[fin & ~cm]):.3f}; chosen: "
          f"{[(g.alpha, g.row_range, g.width_percentile) for g in chosen]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lungs", choices=["masks", "unet", "both"], default="both",
                        help="Brixia films: the pack's lung masks, the U-Net's lungs, or both")
    parser.add_argument("--skip-nih", action="store_true")
    parser.add_argument("--no-nested", action="store_true")
    args = parser.parse_args()
    pack = Pack()
    model = NormativeModel.load()
    for lungs in (("masks", "unet") if args.lungs == "both" else (args.lungs,)):
        brixia(pack, lungs, model)
    if not args.skip_nih:
        nih(pack, not args.no_nested)


if __name__ == "__main__":
    main()
