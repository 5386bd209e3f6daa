"""The pre-registered CTR definitions on every NIH film of the pack: A-D of ``bench/records/ctr_preregistration.md``
(and the exploratory E of its addendum), F and G of ``bench/records/ctr_smooth_preregistration.md``, H of
``bench/records/ctr_calibrated_preregistration.md``, J of ``bench/records/ctr_edge_preregistration.md``.

For each definition: AUROC of the NIH Cardiomegaly label against all other NIH films and against the No Finding
films, the No Finding median (IQR), shares of No Finding films in 0.42-0.48 and at or above 0.50, and the share of
Cardiomegaly films at or below 0.45 (the ILS negative rule). Nothing is tuned here.

Run (after ``bench/segment.py --only-real --cache DIR`` has filled the cache of U-Net lungs):
``python bench/ctr_definitions.py --cache DIR [--weights FILE]``. Films missing from the cache are segmented and
added to it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from segment import _auroc, _claim_cache, cached_lungs  # the bench scripts share one AUROC and one lung cache

REFERENCE = "ctr now: p75 row / lungs' extent (reference)"
#: name -> (outline border rule, thoracic diameter), as in the pre-registration.
DEFINITIONS: dict[str, tuple[str, str]] = {
    "A max-width / internal thoracic": ("robust-max", "internal"),
    "B max-width / lungs' extent": ("robust-max", "extent"),
    "C p75 row / internal thoracic": ("percentile", "internal"),
    "D MRD+MLD / internal thoracic": ("mrd+mld", "internal"),
}


EXPLORATORY = "E max-width above the cardiophrenic angles / internal thoracic (exploratory)"
#: ``ctr_smooth_preregistration.md``: the outline's width from quadratic border curves; CTR as ``ctr``.
SMOOTH = "F quadratic-max borders / lungs' extent"
SMOOTH_ABOVE = "G quadratic-max borders above the angles / lungs' extent"
#: ``ctr_calibrated_preregistration.md``: the p75 row's width mapped to the expected maximal width.
CALIBRATED = "H calibrated p75 -> expected maximal width / lungs' extent"
#: Round 4 of the same record (post hoc): the shipped outline redrawn to the calibrated CTR about the midline.
OUTLINE = "I calibrated outline (post hoc) / lungs' extent"
#: ``ctr_edge_preregistration.md``: each row's borders at the silhouette's steepest fall; otherwise as ``ctr``.
STEEPEST = "J steepest-edge p75 row / lungs' extent"


def rows_above_angles(px: np.ndarray, right: np.ndarray, left: np.ndarray) -> np.ndarray:
    """The seen cardiac rows above both cardiophrenic angles (definitions E and G)."""
    from cxrground.anatomy.segment.heart import cardiophrenic_points
    from cxrground.anatomy.segment.heart_image import cardiac_row_widths

    (y_r, _), (y_l, _) = cardiophrenic_points(right, left)
    rows = cardiac_row_widths(px, right, left)
    return rows[rows[:, 0] < min(y_r, y_l)]


def heart_above_angles(px: np.ndarray, right: np.ndarray, left: np.ndarray):
    """Definition E (exploratory addendum): the outline from the robust maximal seen width over the seen rows
    above both cardiophrenic angles (the lungs' medial borders when fewer than ``min_rows`` remain)."""
    return _outline_from_rows(px, right, left, "robust-max")


def _outline_from_rows(px: np.ndarray, right: np.ndarray, left: np.ndarray, rule: str):
    """The outline whose width follows ``rule`` over the seen rows above the cardiophrenic angles (None without)."""
    from cxrground.anatomy.ctr import EmptyAnatomyError
    from cxrground.anatomy.segment.heart import estimate_heart
    from cxrground.anatomy.segment.heart_image import SeenHeartParams, seen_cardiac_borders

    try:
        rows = rows_above_angles(px, right, left)
        borders, _ = seen_cardiac_borders(px, right, left, SeenHeartParams(transverse=rule), rows=rows)
        heart = estimate_heart(right, left, seen_borders=borders)
    except EmptyAnatomyError:
        return None
    return heart if heart.any() else None


def ratio(heart, right: np.ndarray, left: np.ndarray, thorax: str) -> float:
    """Robust maximal transverse diameter of ``heart`` over the internal thoracic diameter or the lungs' extent
    (NaN without a heart)."""
    from cxrground.anatomy.ctr import maximal_transverse_diameter, measure_ctr, row_window

    if heart is None:
        return np.nan
    if thorax == "internal":
        return measure_ctr(heart, right, left, "radiological").ctr
    rows = np.flatnonzero((right | left).any(axis=1))
    width = maximal_transverse_diameter(heart, row_window(rows[-1] - rows[0] + 1))
    return width / measure_ctr(heart, right, left, "extent").thoracic.length


def nih_lungs(cache: str, threads: int, weights: str | None = None):
    """``(record, pixels, right, left)`` of every NIH film on the working grid (U-Net lungs, cached as
    ``bench/segment.py`` caches them)."""
    from pathlib import Path

    from cxrground.anatomy.segment import UNetLungSegmenter
    from cxrground.datasets.pack import Pack

    seg = UNetLungSegmenter(weights=Path(weights) if weights else None, threads=threads)
    folder = Path(cache)
    folder.mkdir(parents=True, exist_ok=True)
    _claim_cache(folder, seg.weights, seg.content_box)
    for rec in Pack().nih():
        d = cached_lungs(seg, folder, "nih", rec)
        yield rec, d["px"], d["R"].astype(bool), d["L"].astype(bool)


def summary(name: str, ctr: np.ndarray, cm: np.ndarray, normal: np.ndarray) -> str:
    """One table row (Markdown) for a definition."""
    ok = np.isfinite(ctr)
    c, cm, normal = ctr[ok], cm[ok], normal[ok]
    q = np.percentile(c[normal], [25, 50, 75])
    return (f"| {name} | {int(ok.sum())} | {_auroc(c[cm], c[~cm]):.3f} | {_auroc(c[cm], c[normal]):.3f} | "
            f"{q[1]:.3f} ({q[0]:.3f}-{q[2]:.3f}) | {100 * np.mean((c[normal] >= 0.42) & (c[normal] <= 0.48)):.0f} % | "
            f"{100 * np.mean(c[normal] >= 0.5):.0f} % | {100 * np.mean(c[cm] <= 0.45):.0f} % |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", required=True, help="folder of cached U-Net lungs (bench/segment.py --cache)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--weights", default=None, help="lung U-Net .safetensors (default: the shipped weights)")
    args = parser.parse_args()

    import torch

    from cxrground.anatomy.ctr import cardiothoracic_ratio
    from cxrground.anatomy.segment.builtin import heart_from_lungs
    from cxrground.anatomy.segment.heart import OUTLINE_CALIBRATION, HeartEstimateParams
    from cxrground.anatomy.segment.heart_image import SeenHeartParams

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    values: dict[str, list[float]] = {name: [] for name in (REFERENCE, *DEFINITIONS, EXPLORATORY, SMOOTH, SMOOTH_ABOVE,
                                                                CALIBRATED, OUTLINE, STEEPEST)}
    cm, normal = [], []
    for rec, px, right, left in nih_lungs(args.cache, args.threads, args.weights):
        cm.append("Cardiomegaly" in rec.labels)
        normal.append(rec.labels == ("No Finding",))
        hearts = {rule: heart_from_lungs(right, left, pixels=px, seen_params=SeenHeartParams(transverse=rule))[0]
                  for rule in ("percentile", "robust-max", "mrd+mld", "quadratic-max", "calibrated")}
        for name, (rule, thorax) in DEFINITIONS.items():
            values[name].append(ratio(hearts[rule], right, left, thorax))
        heart = hearts["percentile"]
        values[REFERENCE].append(np.nan if heart is None else cardiothoracic_ratio(heart, right, left))
        values[EXPLORATORY].append(ratio(heart_above_angles(px, right, left), right, left, "internal"))
        smooth = hearts["quadratic-max"]
        values[SMOOTH].append(np.nan if smooth is None else cardiothoracic_ratio(smooth, right, left))
        above = _outline_from_rows(px, right, left, "quadratic-max")
        values[SMOOTH_ABOVE].append(np.nan if above is None else cardiothoracic_ratio(above, right, left))
        calibrated = hearts["calibrated"]
        values[CALIBRATED].append(np.nan if calibrated is None else cardiothoracic_ratio(calibrated, right, left))
        outline, _ = heart_from_lungs(right, left, HeartEstimateParams(outline_calibration=OUTLINE_CALIBRATION),
                                      pixels=px)
        values[OUTLINE].append(np.nan if outline is None else cardiothoracic_ratio(outline, right, left))
        steep = heart_from_lungs(right, left, pixels=px, seen_params=SeenHeartParams(border="steepest"))[0]
        values[STEEPEST].append(np.nan if steep is None else cardiothoracic_ratio(steep, right, left))
    cm_a, normal_a = np.asarray(cm), np.asarray(normal)
    seen = np.isfinite(np.asarray(values[REFERENCE]))
    print(f"{len(cm)} NIH films, {int(seen.sum())} with a heart outline ({int((cm_a & seen).sum())} Cardiomegaly, "
          f"{int((~cm_a & seen).sum())} other, {int((normal_a & seen).sum())} No Finding), "
          f"{time.perf_counter() - start:.0f} s")
    print("| definition | films | AUROC vs all other NIH | AUROC vs No Finding | No Finding median (IQR) | "
          "No Finding in 0.42-0.48 | No Finding >= 0.50 | Cardiomegaly <= 0.45 |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for name, vals in values.items():
        print(summary(name, np.asarray(vals, dtype=np.float64), cm_a, normal_a))


if __name__ == "__main__":
    main()
