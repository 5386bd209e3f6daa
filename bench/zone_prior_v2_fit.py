"""Recipe of the shipped severity models of ``zone_prior_v2`` and ``zone_prior_v3``
(``src/cxrground/lesions/weights/zone_prior_v2_severity.json``, ``zone_prior_v3_severity.json``); rule fixed in
``bench/records/zone_prior_v2_preregistration.md``.

Training rows (licence allows shipping; no Brixia-scored film and no patient who has one):

- diseased: the pack's COVID-19 collection films with a shippable licence (CC BY 3.0 / 4.0 / "authorized") and no
  Brixia score, and the NIH ChestX-ray14 films labelled with a lung lesion
  (:data:`cxrground.lesions.zone_prior.PRIOR_LABELS`);
- normal: the NIH "No Finding" films.

Weights: normal 1/2, COVID-19 1/4, NIH lung lesion 1/4 of the total. Each film is read as ``anatomy zones`` reads it
(shipped lung U-Net, anatomy working grid) by ``zone_prior_v1``'s two image readers: ``zone_sim_v1`` zone
probabilities and ``lesion-unet`` zone shares. Nine candidates (three feature sets × three penalties) are scored by
5-fold patient-grouped CV (weighted log-loss); the chosen one's operating threshold is the weighted Youden-J
maximiser of its out-of-fold probabilities; it is refitted on all rows and, with ``--out``, saved with its provenance
(an existing file is replaced only with ``--overwrite``: :mod:`weights_out`).

``--reader zone_prior_v3`` fits ``zone_prior_v3_severity.json`` (the same fit; it says which lungs it read through;
``bench/records/zone_prior_v3_preregistration.md``).

The films are segmented with the lung U-Net ``--lungs``; by default the lungs the shipped file of ``--reader`` was
fitted through (its ``meta.lungs``, :data:`LUNGS`): ``lung_unet_v1`` for ``zone_prior_v2``, ``lung_unet_v2`` for
``zone_prior_v3`` (:mod:`fit_lungs`). A ``--table`` records the lungs' sha256 per row; ``--from-table`` refuses a
table read through other lungs than ``--lungs``.

Run: ``CXRGROUND_PACK=… OMP_NUM_THREADS=1 PYTHONPATH=src python bench/zone_prior_v2_fit.py [--reader R]
[--lungs NAME|FILE] [--out PATH [--overwrite]] [--table CSV] [--from-table CSV]`` (``--table``: also write the
per-film readings; ``--from-table``: refit from such a table without reading the films again: the readings are
stored to 6 decimals, so the coefficients agree with a full run to about 1e-6, and the skipped films are not
listed). About 2 minutes on one core.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")

FEATURE_SETS = (("logit_mean_sim", "mean_share"), ("logit_mean_sim", "max_share"),
                ("logit_mean_sim", "mean_share", "max_share"))
PENALTIES = (0.1, 1.0, 10.0)
#: The readers whose severity file this recipe writes, and the record of each.
READER_RECORDS = {"zone_prior_v2": "bench/records/zone_prior_v2_preregistration.md",
                  "zone_prior_v3": "bench/records/zone_prior_v3_preregistration.md"}
#: The lung U-Net the shipped severity file of each reader was fitted through (its ``meta.lungs``).
LUNGS = {"zone_prior_v2": "lung_unet_v1", "zone_prior_v3": "lung_unet_v2"}
GROUP_WEIGHT = {"no_finding": 0.5, "covid": 0.25, "nih_lesion": 0.25}
ZONES = tuple("ABCDEF")


@dataclass(frozen=True)
class Row:
    """One training film: who it is, its group and its two readers' zone readings."""

    image: str
    patient: str
    group: str
    licence: str
    sim: tuple[float, ...]
    share: tuple[float, ...]

    @property
    def diseased(self) -> bool:
        """True for the COVID-19 and NIH lung-lesion films."""
        return self.group != "no_finding"


def training_films(pack: Any) -> list[tuple[str, str, str, str, Any]]:
    """(image, patient, group, licence, record) of every training film, per the pre-registration."""
    from cxrground.lesions.zone_prior import PRIOR_LABELS

    cohen = pack.cohen()
    brixia_patients = {r.patient_id for r in cohen if r.brixia is not None}
    out = [(r.image_path.name, f"cohen:{r.patient_id}", "covid", r.license, r) for r in cohen
           if r.shippable and r.brixia is None and r.patient_id not in brixia_patients]
    for r in pack.nih():
        group = "nih_lesion" if set(r.labels) & set(PRIOR_LABELS) else \
            "no_finding" if r.labels == ("No Finding",) else None
        if group:
            out.append((r.image_path.name, f"nih:{r.image_id[:8]}", group,
                        "NIH ChestX-ray14: no restriction on use, attribution required", r))
    return sorted(out, key=lambda t: (t[2], t[0]))


def read_rows(films: list, segmenter: Any) -> tuple[list[Row], list[str]]:
    """Each film's ``zone_sim_v1`` probabilities and ``lesion-unet`` shares (lungs from ``segmenter``); the films
    that failed."""
    from cxrground.errors import CXRGroundError
    from cxrground.lesions.zone_prior import PriorZoneReader
    from cxrground.lesions.zones import work_grid_inputs

    reader = PriorZoneReader.shipped()
    rows, failed, t0 = [], [], time.perf_counter()
    for i, (image, patient, group, licence, rec) in enumerate(films):
        try:
            _, px, right, left, heart = work_grid_inputs(rec.read(), segmenter)
            reading = reader.read_film(px, right, left, heart)
        except CXRGroundError as exc:
            failed.append(image)
            print(f"skip {image}: {exc}", file=sys.stderr)
            continue
        rows.append(Row(image, patient, group, licence, tuple(float(v) for v in reading.sim_probability),
                        tuple(float(v) for v in reading.lesion_share)))
        if (i + 1) % 50 == 0:
            print(f"{i + 1}/{len(films)} films, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return rows, failed


def write_table(path: Path, rows: list[Row], lungs: str) -> None:
    """The per-film readings as CSV (image, patient, group, licence, sim_A…F, share_A…F, lungs: the sha256 of the
    lung U-Net they were read through)."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "patient", "group", "licence", *(f"sim_{z}" for z in ZONES),
                    *(f"share_{z}" for z in ZONES), "lungs"])
        for r in rows:
            w.writerow([r.image, r.patient, r.group, r.licence, *(f"{v:.6f}" for v in (*r.sim, *r.share)), lungs])


def table_lungs(path: Path) -> set[str]:
    """The lung U-Nets' sha256 a table of :func:`write_table` was read through (empty: a table without them)."""
    with path.open(newline="", encoding="utf-8") as fh:
        return {d["lungs"] for d in csv.DictReader(fh) if d.get("lungs")}


def read_table(path: Path) -> list[Row]:
    """Rows written by :func:`write_table`."""
    with path.open(newline="", encoding="utf-8") as fh:
        return [Row(d["image"], d["patient"], d["group"], d["licence"], tuple(float(d[f"sim_{z}"]) for z in ZONES),
                    tuple(float(d[f"share_{z}"]) for z in ZONES)) for d in csv.DictReader(fh)]


def check_table(parser: argparse.ArgumentParser, path: Path, lungs: str, sha256: str) -> None:
    """Usage error (exit 2) unless ``path`` is a table read through the lungs ``lungs`` (weights ``sha256``)."""
    if not path.is_file():
        parser.error(f"--from-table {path}: no such file")
    other = table_lungs(path) - {sha256}
    if other:
        parser.error(f"--from-table {path}: read through other lungs (sha256 {', '.join(sorted(other))}) than "
                     f"--lungs {lungs} ({sha256})")


def weights(rows: list[Row]) -> np.ndarray:
    """Per-row sample weight: each group's share of the total (:data:`GROUP_WEIGHT`), rescaled to mean 1."""
    counts = {g: sum(r.group == g for r in rows) for g in GROUP_WEIGHT}
    w = np.array([GROUP_WEIGHT[r.group] / counts[r.group] for r in rows])
    return w * len(w) / w.sum()


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from fit_lungs import add_lungs_option, lung_segmenter, resolve_lungs
    from weights_out import add_out_options, refuse_existing

    from cxrground.datasets.pack import Pack
    from cxrground.lesions.zone_fit import auroc
    from cxrground.lesions.zone_severity import (
        SEVERITY_MODEL,
        SEVERITY_V3_MODEL,
        fit_severity,
        select_model,
        shipped_severity_path,
        weighted_youden,
    )

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reader", choices=READER_RECORDS, default="zone_prior_v2",
                        help="which reader's severity file this fit is (name and record)")
    add_out_options(parser, "the fitted severity model (.json; the shipped one of --reader is "
                            f"{shipped_severity_path(SEVERITY_MODEL).parent}/<name>.json)")
    parser.add_argument("--table", type=Path, default=None, help="also write the per-film readings here")
    parser.add_argument("--from-table", type=Path, default=None, help="refit from a table written by --table")
    add_lungs_option(parser, None, "the lungs the shipped file of --reader was fitted through: "
                                   + ", ".join(f"{v} for {k}" for k, v in LUNGS.items()))
    args = parser.parse_args()
    default_lungs = LUNGS[args.reader]
    args.lungs = args.lungs or default_lungs
    segmenter = lung_segmenter(resolve_lungs(parser, args.lungs))
    lungs = segmenter.identity()
    refuse_existing(parser, [args.out], args.overwrite)
    if args.from_table:
        check_table(parser, args.from_table, args.lungs, lungs["sha256"])
    name = SEVERITY_MODEL if args.reader == "zone_prior_v2" else SEVERITY_V3_MODEL
    if args.from_table:
        rows, failed = read_table(args.from_table), []
    else:
        rows, failed = read_rows(training_films(Pack()), segmenter)
        if args.table:
            write_table(args.table, rows, lungs["sha256"])
    sim, share = np.array([r.sim for r in rows]), np.array([r.share for r in rows])
    y, w, patients = np.array([r.diseased for r in rows], float), weights(rows), [r.patient for r in rows]
    chosen, scores = select_model(sim, share, y, w, patients, FEATURE_SETS, PENALTIES)
    threshold, youden = weighted_youden(chosen.oof, y, w)
    groups = {g: sum(r.group == g for r in rows) for g in GROUP_WEIGHT}
    meta = {
        "name": name,
        "reader": args.reader,
        "method": "film-level logistic regression (features standardised for the fit, coefficients stored on the "
                  "raw features), penalty and features by 5-fold patient-grouped CV (weighted log-loss), operating "
                  "threshold = weighted Youden-J maximiser of the out-of-fold probabilities; "
                  "S = clip(logit - logit(threshold), -clip, clip)",
        "data": "cxr-pack-v1: COVID-19 image data collection films with a shippable licence and no Brixia score "
                "(diseased), NIH ChestX-ray14 films labelled with a lung lesion (diseased) and No Finding (normal)",
        "licences": sorted({r.licence for r in rows}),
        "films": groups, "patients": len(set(patients)), "failures": failed,
        "group_weight": GROUP_WEIGHT,
        "cv": [{"features": list(s.features), "l2": s.l2, "log_loss": round(s.log_loss, 5),
                "auroc": round(auroc(s.oof, y.astype(bool)), 4)} for s in scores],
        "chosen": {"features": list(chosen.features), "l2": chosen.l2, "log_loss": round(chosen.log_loss, 5),
                   "oof_auroc": round(auroc(chosen.oof, y.astype(bool)), 4), "youden_j": round(youden, 4)},
        "brixia_used": False,
        "preregistration": READER_RECORDS[args.reader],
        "recipe": "PYTHONPATH=src python bench/zone_prior_v2_fit.py"
                  + ("" if args.reader == "zone_prior_v2" else f" --reader {args.reader}")
                  + ("" if args.lungs == default_lungs else f" --lungs {args.lungs}"),
        "lungs": lungs,
    }
    model = fit_severity(sim, share, y, w, chosen.features, chosen.l2, threshold, meta)
    if args.out is not None:
        model.save(args.out)
        print(f"wrote {args.out}")
    s = model.severity(sim, share)
    for g in GROUP_WEIGHT:
        pick = np.array([r.group == g for r in rows])
        print(f"{g:11s} {pick.sum():3d} films: S median {np.median(s[pick]):+.2f}, "
              f"share with S >= 0 {np.mean(s[pick] >= 0):.2f}")
    print(json.dumps({"features": model.features, "coef": model.coef, "intercept": model.intercept,
                      "threshold": model.threshold, **meta}, indent=1))


if __name__ == "__main__":
    main()
