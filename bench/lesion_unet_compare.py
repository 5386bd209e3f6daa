"""Lesion segmenter weights side by side on real films: held-out NIH films with image-level labels and the
pack's 71 Brixia-scored COVID-19 films.

For each ``--weights`` file (default: the shipped ``lesion_unet_v1``) prints

- the **film AUROC** on held-out NIH films (a lung-lesion label: Infiltration, Consolidation, Pneumonia, Edema,
  Atelectasis or Effusion, against films labelled only No Finding; film score = mean of the top 2 % lesion
  probabilities over the lungs minus heart and mediastinum). The held-out films are those listed as
  ``mil_held_out_films`` in the sidecar of the first weights that has them, else patient fold 0;
- the zone reader built on the weights (``anatomy zones --zone-model lesion-unet`` with these weights): zones
  flagged, Cohen's κ against the senior radiologist (zone abnormal when scored > 0) and the within-film zone
  AUROC on the films with both normal and abnormal zones.

Nothing is trained. Run:
``.venv/bin/python bench/lesion_unet_compare.py --weights A.safetensors --weights B.safetensors``
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from zones_command import ZONES, within_film_auroc

from cxrground.anatomy.segment import get_segmenter
from cxrground.anatomy.segment.unet import read_sidecar
from cxrground.datasets.pack import Pack
from cxrground.lesions.lesion_zones import LesionZoneReader
from cxrground.lesions.normative import NormativeModel
from cxrground.lesions.segmenter import LesionSegmenter, shipped_lesion_unet_path
from cxrground.lesions.segmenter_fit import LesionUNetRecipe, labelled_films, split_labelled
from cxrground.lesions.zone_fit import auroc, cohen_kappa
from cxrground.lesions.zones import find_images, write_zones


def held_out_nih(weights: list[Path], segmenter, recipe: LesionUNetRecipe):
    """The held-out labelled NIH films (see the module docstring) on the recipe's canvas."""
    films = labelled_films(Pack().nih(), segmenter, recipe.size)
    for w in weights:
        listed = read_sidecar(w).get("mil_held_out_films")
        if listed:
            keep = set(listed)
            return [f for f in films if f.film.film_id in keep]
    return split_labelled(films, [], recipe.val_fold)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--weights", action="append", type=Path, default=[], help="lesion U-Net .safetensors (repeat)")
    args = ap.parse_args()
    weights = args.weights or [shipped_lesion_unet_path()]
    import torch

    from cxrground.lesions.segmenter_fit import film_scores

    torch.set_num_threads(1)
    lungs, recipe = get_segmenter("unet", threads=1), LesionUNetRecipe()
    held = held_out_nih(weights, lungs, recipe)
    labels = np.array([f.label for f in held], bool)
    records = [r for r in Pack().cohen() if r.brixia is not None]
    senior = {r.image_path.name: [r.brixia.senior[z] > 0 for z in ZONES] for r in records}
    names = sorted(senior)
    print(f"held-out NIH films: {labels.sum()} lung-lesion, {(~labels).sum()} No Finding; "
          f"Brixia films: {len(names)}")
    with tempfile.TemporaryDirectory() as tmp:
        films = Path(tmp) / "films"
        films.mkdir()
        for r in records:
            (films / r.image_path.name).symlink_to(r.image_path.resolve())
        for i, w in enumerate(weights):
            seg = LesionSegmenter(w, threads=1)
            film_auc = auroc(film_scores(seg.model, held, recipe), labels)
            out = Path(tmp) / f"w{i}"
            _, failures = write_zones(find_images(films), out, lungs, NormativeModel.load(), root=films,
                                      zone_model=LesionZoneReader(seg))
            table = {row["image"]: row for row in csv.DictReader((out / "zones.csv").open())}
            read = [n for n in names if n in table]
            truth = np.array([senior[n] for n in read])
            pred = np.array([[table[n][z] == "1" for z in ZONES] for n in read])
            score = np.array([[float(table[n][f"{z}_score"] or "nan") for z in ZONES] for n in read])
            within, mixed = within_film_auroc(truth, score)
            print(f"{w.name}: threshold {seg.threshold}, held-out simulated Dice "
                  f"{read_sidecar(w).get('held_out_dice', {}).get(str(seg.threshold))}; NIH film AUROC {film_auc:.3f}; "
                  f"Brixia {len(read)} films ({len(failures)} failures), {int(pred.sum())} zones flagged, "
                  f"κ {cohen_kappa(truth, pred):.3f}, within-film AUROC {within:.3f} ({mixed} mixed films)")


if __name__ == "__main__":
    main()
