"""`cxrground anatomy zones` end to end on the pack's 71 Brixia-scored films: the command's own library path
(:func:`cxrground.lesions.zones.write_zones` with the shipped lung U-Net and the reader resolved by name, as the CLI
does), its ``zones.csv`` read back and compared with the senior radiologist (zone abnormal when scored > 0).

Prints, for each reader (``zone_sim_v1``, the position-prior readers ``zone_prior_v3``, ``zone_prior_v1`` and
``zone_prior_v2`` (film severity also from the lesion segmenter; v3: refitted on the shipped lungs), the lesion
segmenter's ``lesion-unet`` and ``normative``), the zones flagged, Cohen's κ overall (with a 95 % interval from a
bootstrap over patients) and per zone, the **within-film zone AUROC** (with its patient-bootstrap interval; on the
films with both normal and abnormal zones: the share of (abnormal zone, normal zone) pairs of the same film that the
reader's zone scores order correctly, ties half, pooled over films) and the wall time; and the junior radiologist's
κ (the ceiling) and the **position-only baseline** AUROC (a zone's score = how often that zone is abnormal in the
other patients' films). The films are symlinked into a temporary folder; nothing is trained.

Run: ``.venv/bin/python bench/zones_command.py [--overlays DIR] [--overlay-reader NAME] [--readers A,B]``
(``--overlays``: keep the overlays of ``--overlay-reader``, default lesion-unet).
"""

from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from cxrground.anatomy.segment import get_segmenter
from cxrground.datasets.pack import Pack
from cxrground.lesions.lesion_zones import LESION_ZONE_READER
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS, NormativeModel
from cxrground.lesions.zone_classifier import SHIPPED_ZONE_READER
from cxrground.lesions.zone_fit import cohen_kappa
from cxrground.lesions.zone_prior import ZONE_PRIOR_READER, ZONE_PRIOR_V2_READER, ZONE_PRIOR_V3_READER, ZonePrior
from cxrground.lesions.zones import NORMATIVE_READER, find_images, resolve_zone_reader, write_zones

ZONES = tuple(BRIXIA_ZONE_LABELS)
READERS = (SHIPPED_ZONE_READER, ZONE_PRIOR_V3_READER, ZONE_PRIOR_READER, ZONE_PRIOR_V2_READER, LESION_ZONE_READER,
           NORMATIVE_READER)
#: Patient-grouped bootstrap resamples for the 95 % intervals.
BOOTSTRAP = 1000


def within_film_auroc(truth: np.ndarray, score: np.ndarray) -> tuple[float, int]:
    """Pooled within-film AUROC over the films (rows) with both normal and abnormal zones, and their number."""
    good, pairs, films = 0.0, 0, 0
    for t, s in zip(truth, score, strict=True):
        pos, neg = s[t], s[~t]
        if not len(pos) or not len(neg):
            continue
        films += 1
        diff = pos[:, None] - neg[None, :]
        good += float((diff > 0).sum() + 0.5 * (diff == 0).sum())
        pairs += diff.size
    return (good / pairs if pairs else float("nan")), films


def position_scores(truth: np.ndarray, patients: list[str]) -> np.ndarray:
    """Each zone's abnormal rate among the films of the other patients (the position-only baseline)."""
    out = np.zeros(truth.shape)
    ids = np.array(patients)
    for i, p in enumerate(patients):
        out[i] = truth[ids != p].mean(axis=0)
    return out


def patient_bootstrap(truth: np.ndarray, pred: np.ndarray, score: np.ndarray, patients: list[str],
                      seed: int = 0) -> tuple[tuple[float, float], tuple[float, float]]:
    """95 % intervals of κ and of the within-film AUROC, films of one patient resampled together."""
    rng = np.random.default_rng(seed)
    ids = sorted(set(patients))
    rows = {p: [i for i, q in enumerate(patients) if q == p] for p in ids}
    kappas, aucs = [], []
    for _ in range(BOOTSTRAP):
        pick = [i for p in rng.choice(ids, len(ids)) for i in rows[p]]
        kappas.append(cohen_kappa(truth[pick], pred[pick]))
        aucs.append(within_film_auroc(truth[pick], score[pick])[0])
    lo_hi = (2.5, 97.5)
    return tuple(np.nanpercentile(kappas, lo_hi)), tuple(np.nanpercentile(aucs, lo_hi))  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--overlays", type=Path, default=None, help="copy the overlays of --overlay-reader here")
    parser.add_argument("--overlay-reader", default=LESION_ZONE_READER, choices=READERS)
    parser.add_argument("--readers", default=",".join(READERS), help="comma-separated readers to run")
    args = parser.parse_args()
    records = [r for r in Pack().cohen() if r.brixia is not None]
    patient = {r.image_path.name: r.patient_id for r in records}
    senior = {r.image_path.name: [r.brixia.senior[z] > 0 for z in ZONES] for r in records}
    junior = {r.image_path.name: [r.brixia.junior[z] > 0 for z in ZONES] for r in records}
    names = sorted(senior)
    print(f"## anatomy zones on {len(names)} Brixia films (senior > 0 = abnormal: "
          f"{int(np.sum([senior[n] for n in names]))} of {6 * len(names)} zones)")
    ceiling = cohen_kappa(np.array([senior[n] for n in names]), np.array([junior[n] for n in names]))
    print(f"junior radiologist: κ {ceiling:.3f}")
    truth_all = np.array([senior[n] for n in names])
    auc, mixed = within_film_auroc(truth_all, position_scores(truth_all, [patient[n] for n in names]))
    print(f"position-only baseline: within-film zone AUROC {auc:.3f} on {mixed} mixed films")
    grade = {r.image_path.name: [float(r.brixia.junior[z]) for z in ZONES] for r in records}
    junior_auc = within_film_auroc(truth_all, np.array([grade[n] for n in names]))[0]
    junior_normal = ~np.array([junior[n] for n in names])
    print(f"junior radiologist's 0-3 grades: within-film zone AUROC {junior_auc:.3f}; of the "
          f"{int(junior_normal.sum())} zones the junior graded 0, the senior scored "
          f"{truth_all[junior_normal].mean():.1%} abnormal")
    prior = np.tile(ZonePrior.load().vector, (len(names), 1))
    print(f"NIH position prior alone (zone_prior_v1 without the image): within-film zone AUROC "
          f"{within_film_auroc(truth_all, prior)[0]:.3f}")
    segmenter, model = get_segmenter("unet"), NormativeModel.load()
    with tempfile.TemporaryDirectory() as tmp:
        films = Path(tmp) / "films"
        films.mkdir()
        for r in records:
            (films / r.image_path.name).symlink_to(r.image_path.resolve())
        for reader in args.readers.split(","):
            out = Path(tmp) / reader
            t0 = time.perf_counter()
            overlays = reader == args.overlay_reader and args.overlays is not None
            _, failures = write_zones(find_images(films), out, segmenter, model, overlays=overlays, root=films,
                                      zone_model=resolve_zone_reader(reader))
            if overlays:
                shutil.copytree(out / "overlays", args.overlays, dirs_exist_ok=True)
            seconds = time.perf_counter() - t0
            table = list(csv.DictReader((out / "zones.csv").open()))
            rows = {row["image"]: [row[z] == "1" for z in ZONES] for row in table}
            score = {row["image"]: [float(row[f"{z}_score"] or "nan") for z in ZONES] for row in table}
            read = [n for n in names if n in rows]
            truth, pred = np.array([senior[n] for n in read]), np.array([rows[n] for n in read])
            scores = np.array([score[n] for n in read])
            auc, mixed = within_film_auroc(truth, scores)
            (k_lo, k_hi), (a_lo, a_hi) = patient_bootstrap(truth, pred, scores, [patient[n] for n in read])
            per_zone = " ".join(f"{z} {cohen_kappa(truth[:, i], pred[:, i]):.2f}" for i, z in enumerate(ZONES))
            print(f"{reader:13s} {len(read)} films, {len(failures)} failures, {int(pred.sum())} zones flagged, "
                  f"κ {cohen_kappa(truth, pred):.3f} (95 % CI {k_lo:.3f}–{k_hi:.3f}; {per_zone}); within-film AUROC "
                  f"{auc:.3f} ({a_lo:.3f}–{a_hi:.3f}; {mixed} mixed films); {seconds:.1f} s")


if __name__ == "__main__":
    main()
