"""`cxrground anatomy fit-zones` on the pack's 71 Brixia-scored films, as a user with zone labels would run it (the
command's library call, :func:`cxrground.lesions.zone_fit.fit_zone_reader`, with the command's segmenter).

The Brixia scores are CC BY-NC-SA: this measures the feature, it ships nothing (the model files go to a
temporary folder unless ``--out`` is given). The films are the pack's originals (symlinked into one folder);
the CLI segments them with the default segmenter (the shipped lung U-Net, as ``anatomy zones`` does), not with
the pack's lung masks. Labels: the senior reader (``--label-prefix S-``; ``--reader J-`` for the junior),
patients from ``metadata.csv``'s ``patientid``.

Run: ``.venv/bin/python bench/zone_fit_brixia.py [--lopo] [--threshold-rule kappa|youden] [--folds 5]``.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

from cxrground.datasets.pack import Pack
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS
from cxrground.lesions.zone_fit import ZoneFitRequest, fit_segmenter, fit_zone_reader

ZONES = tuple(BRIXIA_ZONE_LABELS)


def brixia_folder(pack: Pack, out: Path, reader: str) -> tuple[Path, Path]:
    """Symlink the Brixia films into ``out/films`` and write ``out/labels.csv`` (image, patientid, <reader>A..F)."""
    base = pack.root / "cohen"
    with (base / "metadata.csv").open(encoding="utf-8") as fh:
        meta = list(csv.DictReader(fh))
    by_name = {r["source_filename"]: r for r in meta} | {r["image"]: r for r in meta}
    films = out / "films"
    films.mkdir(parents=True, exist_ok=True)
    rows = []
    with (base / "brixia_scores.csv").open(encoding="utf-8") as fh:
        for b in csv.DictReader(fh):
            m = by_name[b["filename"]]
            link = films / m["image"]
            if not link.exists():
                link.symlink_to(base / "images" / m["image"])
            rows.append({"image": m["image"], "patientid": m["patientid"],
                         **{f"{reader}{z}": b[f"{reader}{z}"] for z in ZONES}})
    labels = out / "labels.csv"
    with labels.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["image", "patientid", *(f"{reader}{z}" for z in ZONES)])
        w.writeheader()
        w.writerows(rows)
    return films, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reader", choices=["S-", "J-"], default="S-")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threshold-rule", choices=["kappa", "youden"], default="kappa")
    parser.add_argument("--lopo", action="store_true", help="outer CV leave-one-patient-out")
    parser.add_argument("--out", type=Path, default=None, help="folder for the films, labels and model")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="zonefit_brixia_"))
    films, labels = brixia_folder(Pack(), out, args.reader)
    request = ZoneFitRequest(images=films, labels=labels, out=out / "brixia_zone_model.npz", label_prefix=args.reader,
                             patients_col="patientid", folds=args.folds, seed=args.seed,
                             threshold_rule=args.threshold_rule, leave_one_patient_out=args.lopo)
    print(f"cxrground anatomy fit-zones --images {films} --labels {labels} --out {request.out} --label-prefix "
          f"{args.reader} --patients-col patientid --folds {args.folds} --seed {args.seed} --threshold-rule "
          f"{args.threshold_rule}{' --leave-one-patient-out' if args.lopo else ''}", flush=True)
    print("\n".join(fit_zone_reader(request, fit_segmenter(), progress=True).summary_lines()))


if __name__ == "__main__":
    main()
