"""`cxrground anatomy zones` end to end on the pack's 71 Brixia-scored films: the command's own library path
(:func:`cxrground.lesions.zones.write_zones` with the shipped lung U-Net and the reader resolved by name, as the CLI
does), its ``zones.csv`` read back and compared with the senior radiologist (zone abnormal when scored > 0).

Prints, for each reader (the default ``zone_sim_v1`` and ``normative``), the zones flagged, Cohen's κ overall and
per zone, and the wall time; and the junior radiologist's κ (the ceiling). The films are symlinked into a
temporary folder; nothing is trained.

Run: ``.venv/bin/python bench/zones_command.py``.
"""

from __future__ import annotations

import csv
import tempfile
import time
from pathlib import Path

import numpy as np

from cxrground.anatomy.segment import get_segmenter
from cxrground.datasets.pack import Pack
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS, NormativeModel
from cxrground.lesions.zone_classifier import SHIPPED_ZONE_READER
from cxrground.lesions.zone_fit import cohen_kappa
from cxrground.lesions.zones import NORMATIVE_READER, find_images, resolve_zone_reader, write_zones

ZONES = tuple(BRIXIA_ZONE_LABELS)


def main() -> None:
    records = [r for r in Pack().cohen() if r.brixia is not None]
    senior = {r.image_path.name: [r.brixia.senior[z] > 0 for z in ZONES] for r in records}
    junior = {r.image_path.name: [r.brixia.junior[z] > 0 for z in ZONES] for r in records}
    names = sorted(senior)
    print(f"## anatomy zones on {len(names)} Brixia films (senior > 0 = abnormal: "
          f"{int(np.sum([senior[n] for n in names]))} of {6 * len(names)} zones)")
    ceiling = cohen_kappa(np.array([senior[n] for n in names]), np.array([junior[n] for n in names]))
    print(f"junior radiologist: κ {ceiling:.3f}")
    segmenter, model = get_segmenter("unet"), NormativeModel.load()
    with tempfile.TemporaryDirectory() as tmp:
        films = Path(tmp) / "films"
        films.mkdir()
        for r in records:
            (films / r.image_path.name).symlink_to(r.image_path.resolve())
        for reader in (SHIPPED_ZONE_READER, NORMATIVE_READER):
            out = Path(tmp) / reader
            t0 = time.perf_counter()
            _, failures = write_zones(find_images(films), out, segmenter, model, overlays=False, root=films,
                                      zone_model=resolve_zone_reader(reader))
            seconds = time.perf_counter() - t0
            rows = {row["image"]: [row[z] == "1" for z in ZONES] for row in csv.DictReader((out / "zones.csv").open())}
            read = [n for n in names if n in rows]
            truth, pred = np.array([senior[n] for n in read]), np.array([rows[n] for n in read])
            per_zone = " ".join(f"{z} {cohen_kappa(truth[:, i], pred[:, i]):.2f}" for i, z in enumerate(ZONES))
            print(f"{reader:12s} {len(read)} films, {len(failures)} failures, {int(pred.sum())} zones flagged, "
                  f"κ {cohen_kappa(truth, pred):.3f} ({per_zone}); {seconds:.1f} s")


if __name__ == "__main__":
    main()
