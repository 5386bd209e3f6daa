"""Recipe of the heart outline's width calibration (``SeenHeartParams(transverse="calibrated")``), rule fixed in
``bench/records/ctr_calibrated_preregistration.md``.

On every NIH film of the pack (U-Net lungs on the working grid, cached as ``bench/segment.py`` caches them), with
``D`` the lungs' x-extent: ``r75`` = the 75th-percentile seen row's cardiac width over ``D`` (the shipped rule) and
``rF`` = the ``quadratic-max`` width (the widest gap between the smooth border curves) over ``D``. Prints the
least-squares line ``rF = a + b · r75`` over the films where both exist, the through-origin ratio for reference,
and the same line fitted on each half of the patients and applied to the other half. No label is read, except
for the held-out halves' No Finding medians, which are printed and decide nothing.

With ``--outline`` (round 4, ``HeartEstimateParams(outline_calibration=...)``) the same is done with the drawn
outlines' CTRs instead of the border widths: ``c75`` = ``ctr`` of the shipped outline, ``cF`` = ``ctr`` of the
``quadratic-max`` outline.

Run: ``python bench/ctr_calibration_fit.py --cache DIR [--weights FILE] [--outline]`` (about 2 minutes on one
thread).
"""

from __future__ import annotations

import argparse

import numpy as np
from ctr_definitions import nih_lungs


def widths(px: np.ndarray, right: np.ndarray, left: np.ndarray) -> tuple[float, float]:
    """``(r75, rF)`` of one film (NaN where a rule sees too few rows)."""
    from cxrground.anatomy.ctr import x_extent
    from cxrground.anatomy.segment.heart_image import SeenHeartParams, cardiac_row_widths, seen_cardiac_borders

    rows = cardiac_row_widths(px, right, left)
    extent = float(x_extent(right | left))
    out = []
    for rule in ("percentile", "quadratic-max"):
        borders, _ = seen_cardiac_borders(px, right, left, SeenHeartParams(transverse=rule), rows=rows)
        out.append(np.nan if borders is None else (borders[1] - borders[0]) / extent)
    return out[0], out[1]


def outline_ctrs(px: np.ndarray, right: np.ndarray, left: np.ndarray) -> tuple[float, float]:
    """``(c75, cF)``: ``ctr`` of the shipped outline and of the ``quadratic-max`` outline (NaN without one)."""
    from cxrground.anatomy.ctr import cardiothoracic_ratio
    from cxrground.anatomy.segment.builtin import heart_from_lungs
    from cxrground.anatomy.segment.heart_image import SeenHeartParams

    out = []
    for rule in ("percentile", "quadratic-max"):
        heart, _ = heart_from_lungs(right, left, pixels=px, seen_params=SeenHeartParams(transverse=rule))
        out.append(np.nan if heart is None else cardiothoracic_ratio(heart, right, left))
    return out[0], out[1]


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``y = a + b x``."""
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", required=True, help="folder of cached U-Net lungs (bench/segment.py --cache)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--weights", default=None, help="lung U-Net .safetensors (default: the shipped weights)")
    parser.add_argument("--outline", action="store_true", help="calibrate the drawn outlines' CTRs (round 4)")
    args = parser.parse_args()
    measure, names = (outline_ctrs, ("c75", "cF")) if args.outline else (widths, ("r75", "rF"))

    import torch

    torch.set_num_threads(args.threads)
    ids, r75, rf, normal = [], [], [], []
    for rec, px, right, left in nih_lungs(args.cache, args.threads, args.weights):
        if not right.any() or not left.any():
            continue
        a, b = measure(px, right, left)
        ids.append(rec.image_id)
        r75.append(a)
        rf.append(b)
        normal.append(rec.labels == ("No Finding",))
    x, y, nf = np.asarray(r75), np.asarray(rf), np.asarray(normal)
    ok = np.isfinite(x) & np.isfinite(y)
    a, b = fit_line(x[ok], y[ok])
    lo, hi = names
    print(f"{int(ok.sum())} of {len(ids)} NIH films with both; {lo} median {np.median(x[ok]):.4f}, "
          f"{hi} median {np.median(y[ok]):.4f}, Pearson r {np.corrcoef(x[ok], y[ok])[0, 1]:.3f}")
    print(f"least squares {hi} = a + b * {lo}: a = {a:.4f}, b = {b:.4f}  (calibration=({a:.4f}, {b:.4f}))")
    print(f"through the origin: {hi} / {lo} = {float(np.sum(x[ok] * y[ok]) / np.sum(x[ok] ** 2)):.4f} (reference)")
    half = np.asarray([int(i[:8]) % 2 for i in ids])
    for h in (0, 1):
        fit, test = ok & (half == h), ok & (half != h) & nf
        ha, hb = fit_line(x[fit], y[fit])
        print(f"fitted on patient half {h} ({int(fit.sum())} films): a = {ha:.4f}, b = {hb:.4f}; other half's "
              f"No Finding median calibrated value {np.median(ha + hb * x[test]):.4f} ({int(test.sum())} films)")


if __name__ == "__main__":
    main()
