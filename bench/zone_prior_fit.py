"""Recipe of the shipped position prior ``zone_prior_v1`` (``src/cxrground/lesions/weights/zone_prior_v1.json``).

Data: the pack's NIH ChestX-ray14 films (no restriction on use, attribution required) labelled with a lung lesion
(:data:`cxrground.lesions.zone_prior.PRIOR_LABELS`: Pneumonia, Consolidation, Infiltration, Effusion, Atelectasis,
Edema) and those labelled No Finding. Each film is read by the shipped ``lesion-unet`` zone reader (the lung U-Net's
lungs on the anatomy working grid, heart and mediastinum removed): per Brixia zone A–F, the share of the zone's
pixels at ``p ≥ t``. The prior of a zone is its band's (upper / mid / lower) mean lesion share over the lesion films,
both lungs pooled, normalised over the six zones (:func:`cxrground.lesions.zone_prior.prior_from_shares`); the No
Finding films' shares are recorded beside it (the segmenter's false-positive level per zone). Image-level NIH
labels are the only supervision; no COVID-19 film and no Brixia score is read.

The films are segmented with the lung U-Net ``--lungs``: by default ``lung_unet_v1``, the lungs the shipped
``zone_prior_v1`` was fitted through (its ``meta.lungs``), not the package's default lung U-Net ``lung_unet_v2``
(:mod:`fit_lungs`).

Run: ``PYTHONPATH=src python bench/zone_prior_fit.py [--out PATH [--overwrite]] [--table CSV] [--lungs NAME|FILE]``
(a few minutes on one core; the prior is written only with ``--out``, over an existing file only with
``--overwrite``: :mod:`weights_out`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")

#: The lung U-Net the shipped ``zone_prior_v1`` was fitted through (its ``meta.lungs``).
LUNGS = "lung_unet_v1"


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from fit_lungs import add_lungs_option, lung_segmenter, resolve_lungs
    from weights_out import add_out_options, refuse_existing

    from cxrground.datasets.pack import Pack
    from cxrground.errors import CXRGroundError
    from cxrground.lesions.lesion_zones import LesionZoneReader
    from cxrground.lesions.normative import BRIXIA_ZONE_LABELS, NormativeModel
    from cxrground.lesions.zone_prior import PRIOR_LABELS, ZonePrior, prior_from_shares, shipped_prior_path
    from cxrground.lesions.zones import read_zones

    parser = argparse.ArgumentParser(description=__doc__)
    add_out_options(parser, f"the fitted prior (.json; the shipped one is {shipped_prior_path()})")
    parser.add_argument("--table", type=Path, default=None, help="also write the per-film zone shares here")
    add_lungs_option(parser, LUNGS, "the shipped zone_prior_v1")
    args = parser.parse_args()
    lungs = resolve_lungs(parser, args.lungs)
    refuse_existing(parser, [args.out], args.overwrite)
    zones = tuple(BRIXIA_ZONE_LABELS)
    records = [r for r in Pack().nih() if set(r.labels) & set(PRIOR_LABELS) or r.labels == ("No Finding",)]
    segmenter, model, reader = lung_segmenter(lungs), NormativeModel.load(), LesionZoneReader.shipped()
    rows, failures, t0 = [], 0, time.perf_counter()
    for i, rec in enumerate(sorted(records, key=lambda r: r.image_id)):
        try:
            reading, _, _ = read_zones(rec.read(), segmenter, model, rec.image_id, reader)
        except CXRGroundError as exc:
            failures += 1
            print(f"skip {rec.image_id}: {exc}", file=sys.stderr)
            continue
        lesion = bool(set(rec.labels) & set(PRIOR_LABELS))
        rows.append({"image": rec.image_id, "lesion": int(lesion), **{z: reading.scores[z] for z in zones}})
        if (i + 1) % 50 == 0:
            print(f"{i + 1}/{len(records)} films, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    shares = np.array([[r[z] for z in zones] for r in rows])
    lesion = np.array([r["lesion"] for r in rows], bool)
    q = prior_from_shares(shares[lesion])
    meta = {
        "name": "zone_prior_v1",
        "method": "lesion-unet mean zone share per band (upper/mid/lower, both lungs pooled) on NIH films labelled "
                  "with a lung lesion, normalised over the six zones",
        "data": "cxr-pack-v1 nih/: NIH ChestX-ray14 films (Wang et al., ChestX-ray8, CVPR 2017; "
                "https://nihcc.app.box.com/v/ChestXray-NIHCC), image-level labels only",
        "licence": "NIH ChestX-ray14: no restriction on use, attribution required",
        "labels": list(PRIOR_LABELS),
        "films_lesion": int(lesion.sum()), "films_no_finding": int((~lesion).sum()), "failures": failures,
        "mean_share_lesion": {z: round(float(v), 5) for z, v in zip(zones, shares[lesion].mean(0), strict=True)},
        "mean_share_no_finding": {z: round(float(v), 5) for z, v in zip(zones, shares[~lesion].mean(0),
                                                                       strict=True)},
        "recipe": "PYTHONPATH=src python bench/zone_prior_fit.py" + ("" if args.lungs == LUNGS else
                                                                     f" --lungs {args.lungs}"),
        "brixia_used": False,
        "lungs": segmenter.identity(),
    }
    prior = ZonePrior(dict(zip(zones, (float(v) for v in q), strict=True)), meta)
    if args.out is not None:
        prior.save(args.out)
        print(f"wrote {args.out}")
    print(json.dumps({"prior": prior.weights, **meta}, indent=1))
    if args.table:
        with args.table.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["image", "lesion", *zones])
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
