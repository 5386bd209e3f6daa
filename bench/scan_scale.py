"""Cost of finding the studies of a MIMIC-CXR-JPG-size folder: the view table, the folder scan and the choice of one
image per study (``build_tasks``), on a fake tree of 1-byte images and one-line reports (no image is decoded).

Run: ``.venv/bin/python bench/scan_scale.py [--studies 227835] [--keep DIR]``.

The tree has MIMIC-CXR-JPG's shape: ``files/pXX/pXXXXXXXX/sXXXXXXXX/<dicom_id>.jpg``, about 1.66 images per study
(MIMIC-CXR-JPG: 377,110 images, 227,835 studies): every study a frontal image (PA or AP), two in three a lateral
one as well, and one in twenty a third image; ``mimic-cxr-2.0.0-metadata.csv.gz`` beside ``files/``. Lateral
images get dicom ids that sort first half of the time, so a choice without the table takes a lateral film there.

Prints: files written, then the seconds and peak RSS of reading the view table and of ``build_tasks`` with and
without it, and how many chosen images are lateral in each case.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import random
import resource
import shutil
import tempfile
import time
from pathlib import Path

from cxrground.datasets.views import read_view_table
from cxrground.ils.tasks import build_tasks


def _dicom_id(rng: random.Random, first: bool) -> str:
    """A MIMIC-like dicom id; ``first`` puts it before any id drawn without it (a leading 0)."""
    digits = "".join(rng.choice("0123456789abcdef") for _ in range(39))
    return ("0" if first else rng.choice("123456789abcdef")) + digits


def write_tree(root: Path, studies: int, seed: int = 0) -> tuple[int, int]:
    """The fake MIMIC-CXR-JPG tree under ``root``; returns (images, lateral images)."""
    rng = random.Random(seed)
    rows = io.StringIO()
    table = csv.writer(rows, lineterminator="\n")
    table.writerow(["dicom_id", "subject_id", "study_id", "ViewPosition"])
    images = laterals = 0
    for n in range(studies):
        subject, study = 10_000_000 + n // 3, 50_000_000 + n
        folder = root / "files" / f"p{str(subject)[:2]}" / f"p{subject}" / f"s{study}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder.parent / f"s{study}.txt").write_text("FINDINGS: Clear lungs.\n")
        lateral_first = rng.random() < 0.5
        views = [("PA" if rng.random() < 0.4 else "AP", _dicom_id(rng, False))]
        if rng.random() < 2 / 3:
            views.append(("LATERAL", _dicom_id(rng, lateral_first)))
        if rng.random() < 0.05:
            views.append(("LL", _dicom_id(rng, False)))
        for view, dicom in views:
            (folder / f"{dicom}.jpg").write_bytes(b"\xff")
            table.writerow([dicom, subject, study, view])
            images += 1
            laterals += view != "PA" and view != "AP"
    (root / "mimic-cxr-2.0.0-metadata.csv.gz").write_bytes(gzip.compress(rows.getvalue().encode(), mtime=0))
    return images, laterals


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=227_835)
    parser.add_argument("--keep", type=Path, default=None, help="Write the tree here and keep it.")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="cxrground-scan-"))
    try:
        t = time.perf_counter()
        images, laterals = write_tree(root, args.studies)
        print(f"tree: {args.studies:,} studies, {images:,} images ({laterals:,} not frontal) "
              f"written in {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        views = read_view_table(root / "mimic-cxr-2.0.0-metadata.csv.gz")
        print(f"view table: {len(views):,} rows in {time.perf_counter() - t:.1f} s, peak RSS {_peak_mb():.0f} MB")
        for label, table in (("without the view table", None), ("with the view table", views)):
            t = time.perf_counter()
            tasks, failures = build_tasks(root / "files", views=table)
            lateral = sum(1 for task in tasks if task.view not in (None, "PA", "AP"))
            blind = sum(1 for task in tasks if task.view is None and task.images_in_study > 1)
            chosen_laterals = sum(1 for task in tasks if task.dicom_id.startswith("0"))
            print(f"build_tasks {label}: {len(tasks):,} studies, {len(failures)} failures in "
                  f"{time.perf_counter() - t:.1f} s, peak RSS {_peak_mb():.0f} MB; chosen image lateral: "
                  f"{chosen_laterals:,} (known as such: {lateral:,}); chosen blind among several: {blind:,}")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
