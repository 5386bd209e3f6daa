"""Can a lung that runs below the diaphragm be told from the film? A brightness-step check, measured.

Reads the per-film cache written by ``bench/segment.py --only-real --cache DIR`` (working-grid pixels, the U-Net's
lungs and the pack's lung masks of the 205 annotated COVID-19 collection films). For each lung the check looks for
the diaphragm INSIDE the mask: in each column of the lung's lowest ``1 - LOWER_FROM`` of its height, the mask pixels
from some row down to the column's last lung pixel are all at least ``BRIGHT`` of the way from the lung's aerated
level (30th percentile of its smoothed grey levels) to the soft tissue just below the lung (median of a band 5 % of
the lung's height under its lowest row in each column), and within ``STEP`` of the lung's height above that row a
pixel is at most ``DARK`` of that way: dark aerated lung above, a step, abdomen-bright below. The share of the lung
below such steps is the lung's "dip".

Printed: per threshold on the dip, how many U-Net lungs it flags, how many of the lungs that run more than 5 % of
their annotated area below the pack mask's base (``bench/segment.py``'s ``below_base``) it finds, how many lungs it
flags that lie within 2 % of the annotated base, and how many of the pack's own (human) lung masks it flags; the
correlation of the dip with ``below_base``.

Run: ``python bench/lung_dip_check.py --cache /tmp/anatomy-cache`` (about a minute).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy import ndimage
from segment import below_base

LOWER_FROM, DARK, BRIGHT, STEP = 0.6, 0.4, 0.6, 0.04


def dip(pixels: np.ndarray, mask: np.ndarray) -> float:
    """Share of ``mask`` below a dark-to-bright step inside it (module docstring); 0 when none is found."""
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    height, width = rows[-1] - rows[0], cols[-1] - cols[0]
    g = ndimage.gaussian_filter(pixels.astype(np.float64), max(1.0, 0.01 * width))
    aerated = np.percentile(g[mask], 30)
    lowest = mask.shape[0] - 1 - np.argmax(mask[::-1], axis=0)
    band = np.zeros_like(mask)
    for c in cols:
        band[lowest[c] + 2: lowest[c] + 2 + max(2, int(0.05 * height)), c] = True
    band &= ~mask
    if not band.any() or np.median(g[band]) <= aerated:
        return 0.0
    span = np.median(g[band]) - aerated
    dark, bright = aerated + DARK * span, aerated + BRIGHT * span
    step, start, below = max(1, int(STEP * height)), int(rows[0] + LOWER_FROM * height), 0
    for c in cols:
        ys = np.flatnonzero(mask[:, c])
        ys = ys[ys >= start]
        if ys.size < 3:
            continue
        prof = g[ys, c]
        if prof[-1] < bright:
            continue
        j = ys.size - 1
        while j > 0 and prof[j - 1] >= bright:
            j -= 1
        if j > 0 and prof[max(0, j - step):j].min() <= dark:
            below += ys.size - j
    return below / int(mask.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", required=True, help="folder written by bench/segment.py --only-real --cache")
    args = parser.parse_args()
    rows = []
    for path in sorted(Path(args.cache).glob("cohen_*.npz")):
        d = np.load(path)
        for side, gside in (("R", "GR"), ("L", "GL")):
            pred, gt = d[side].astype(bool), d[gside].astype(bool)
            if pred.any() and gt.any():
                rows.append((below_base(pred, gt), dip(d["px"], pred), dip(d["px"], gt)))
    if not rows:
        raise SystemExit(f"{args.cache}: no annotated films in the cache (run bench/segment.py --only-real first)")
    below, found, human = (np.asarray(v) for v in zip(*rows, strict=True))
    print(f"## Lung below the diaphragm from a brightness step: {len(rows)} lungs of the annotated films")
    for t in (0.01, 0.02, 0.05):
        flag = found > t
        print(f"dip > {t:.0%}: U-Net lungs flagged {int(flag.sum())}; of the {int((below > 0.05).sum())} lungs more "
              f"than 5 % below the annotated base found {int((flag & (below > 0.05)).sum())}; flagged within 2 % of "
              f"the base {int((flag & (below < 0.02)).sum())}; annotated (human) lungs flagged "
              f"{int((human > t).sum())}")
    print(f"Pearson r(dip, lung below the annotated base) {np.corrcoef(below, found)[0, 1]:.2f}")


if __name__ == "__main__":
    main()
