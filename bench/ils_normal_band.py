"""Choice of the normative normal image and the built-in detector's strength on shippable films (issue 14).

Run: ``.venv/bin/python bench/ils_normal_band.py [--opacity-every 3]``. No Brixia-scored film is read.

For each candidate normal image of the normative synthesizer ("band k": x̂ = the film with everything above
``median + k · scale`` removed; "gate": x̂ = the per-location median where the z-map exceeds the model's zone
threshold) and each strength midpoint of the built-in anomaly box detector, Algorithm 1 (Table 7 general τ,
opacity, both lungs as the reported location) runs on the pack's NIH films: ``No Finding`` films (scored by
models fitted without their patient fold, 5 folds) and films with a lung-opacity label (every
``--opacity-every``-th, scored by ``normative_v1``). Prints, per candidate, the share of films that get any
lung-lesion mask in each group and Youden's J (their difference). The lungs come from the shipped U-Net on the
512-px working canvas, as in ``ils build``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import ndimage

from cxrground.anatomy.segment import get_segmenter
from cxrground.datasets.pack import Pack
from cxrground.ils.config import IlsConfig
from cxrground.ils.grounding import algorithm1
from cxrground.ils.spatial.boxes import AnomalyBoxDetector
from cxrground.ils.spatial.pseudo_normal import anomaly_map, anomaly_mask
from cxrground.io.transform import Letterbox
from cxrground.lesions.normative import SMOOTH_FRACTION, NormativeModel, film_cells, fit_cells
from cxrground.lesions.normative_fit import FOLDS, OPACITY_LABELS, nih_patient, patient_folds

CANDIDATES = (("band", 2.0), ("band", 1.0), ("band", 0.0), ("gate", None))
MIDPOINTS = (0.26, 0.18, 0.14, 0.10)


def normal_image(model: NormativeModel, x: np.ndarray, right: np.ndarray, left: np.ndarray, mode: str,
                 k: float | None) -> np.ndarray:
    """x̂ of one candidate (noise floor 3 grey levels, as the synthesizer)."""
    lungs = right | left
    smooth = ndimage.gaussian_filter(x.astype(np.float64), SMOOTH_FRACTION * max(x.shape))
    if mode == "band":
        upper = np.nan_to_num(model.normal_upper(x, right, left, float(k or 0.0)), nan=np.inf)
        excess = np.where(lungs, np.maximum(smooth - upper, 0.0), 0.0)
    else:
        median = np.nan_to_num(model.normal_upper(x, right, left, 0.0), nan=np.inf)
        gate = model.z_map(x, right, left) > model.zone_threshold
        excess = np.where(lungs & gate, np.maximum(smooth - median, 0.0), 0.0)
    excess[excess < 3.0] = 0.0
    return np.clip(np.round(np.where(lungs, x - excess, x)), 0, 255).astype(np.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--opacity-every", type=int, default=3, help="use every N-th opacity-labelled film")
    args = parser.parse_args()
    start = time.perf_counter()
    seg = get_segmenter("unet")
    films = []
    for rec in Pack().nih():
        kind = ("normal" if rec.labels == ("No Finding",) else "opacity" if OPACITY_LABELS & set(rec.labels)
                else None)
        if kind is None:
            continue
        image = rec.read()
        anat = seg.segment(image)
        if not anat.right_lung.any() or not anat.left_lung.any():
            continue
        box = Letterbox.fit(image.pixels.shape, IlsConfig().working_size)
        right, left = box.mask_to_canvas(anat.right_lung), box.mask_to_canvas(anat.left_lung)
        films.append((kind, nih_patient(rec), box.image_to_canvas(image.pixels), right, left & ~right))
    normals = [f for f in films if f[0] == "normal"]
    opacity = [f for f in films if f[0] == "opacity"][:: args.opacity_every]
    folds = patient_folds([f[1] for f in normals])
    cells = [film_cells(f[2], f[3], f[4]) for f in normals]
    shipped = NormativeModel.load()
    fold_models = [fit_cells([c for c, fk in zip(cells, folds, strict=True) if fk != k], shipped.zone_threshold)
                   for k in range(FOLDS)]
    scored = [(f, fold_models[fk]) for f, fk in zip(normals, folds, strict=True)] + [(f, shipped) for f in opacity]
    th = IlsConfig().thresholds_for("opacity")
    hits: dict[tuple[str, float | None, float], dict[str, list[bool]]] = {}
    for (kind, _, x, right, left), model in scored:
        lungs = right | left
        for mode, k in CANDIDATES:
            anomaly = anomaly_map(x, normal_image(model, x, right, left, mode, k), lungs)
            a = anomaly_mask(anomaly, th.tau_ano)
            for mid in MIDPOINTS:
                boxes = AnomalyBoxDetector(strength_mid=mid).detect(x, anomaly)
                grounded = bool(algorithm1(a, lungs, right, left, boxes, th).mask.any())
                hits.setdefault((mode, k, mid), {"normal": [], "opacity": []})[kind].append(grounded)
    print(f"{len(normals)} NIH No Finding films (out-of-fold), {len(opacity)} with a lung-opacity label; "
          f"{time.perf_counter() - start:.0f} s")
    for (mode, k, mid), h in hits.items():
        n, o = float(np.mean(h["normal"])), float(np.mean(h["opacity"]))
        name = f"band {k:g}" if mode == "band" else "gate at the zone threshold"
        print(f"  {name:<27} strength_mid {mid:.2f}: any mask on normal {100 * n:5.1f} %, opacity {100 * o:5.1f} %, "
              f"J {o - n:+.3f}")


if __name__ == "__main__":
    main()
