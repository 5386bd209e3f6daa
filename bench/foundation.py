"""Foundation benchmark: throughput of the synthetic cohort, image reading, mask codecs and geometry.

Run: ``.venv/bin/python bench/foundation.py [--studies 40]``. Prints one line per measurement.
Real-data rows need the pack (``CXRGROUND_PACK`` or ``../shared/data/cxr-pack-v1``) and are skipped
with a note when it is missing.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cxrground.anatomy import ils_location_masks, percept_geometry
from cxrground.datasets.pack import Pack, PackMissingError
from cxrground.datasets.synthetic import write_cohort
from cxrground.io.dicom import write_dicom
from cxrground.io.image import read_image
from cxrground.io.masks import decode_rle, encode_rle
from cxrground.io.transform import Letterbox


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Mean seconds per call over ``repeat`` calls (after one warm-up call)."""
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def row(name: str, seconds: float, unit: str = "call") -> None:
    print(f"{name:<58} {seconds * 1000:9.2f} ms/{unit}   {1 / seconds:9.1f} {unit}/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--studies", type=int, default=40)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cxrground-bench-"))

    start = time.perf_counter()
    summary = write_cohort(tmp / "cohort", args.studies, seed=0, progress=False)
    row(f"synthetic cohort, {summary.n_generated} studies (default size)",
        (time.perf_counter() - start) / max(1, summary.n_generated), "study")

    rng = np.random.default_rng(0)
    big = (rng.random((2048, 2048)) * 4095).astype(np.uint16)
    dcm = write_dicom(tmp / "big.dcm", big, photometric="MONOCHROME1", bits_stored=12, window=(2048, 4096))
    row("read DICOM 2048x2048 12-bit MONOCHROME1 (uncompressed)", timed(lambda: read_image(dcm), 5), "image")
    j2k = write_dicom(tmp / "big_j2k.dcm", big[:1024, :1024], bits_stored=12, transfer_syntax="1.2.840.10008.1.2.4.90")
    row("read DICOM 1024x1024 12-bit JPEG 2000 lossless", timed(lambda: read_image(j2k), 3), "image")

    mask = np.zeros((1024, 1024), bool)
    mask[200:700, 150:600] = True
    mask[750:900, 600:1000] = True
    rle = encode_rle(mask)
    row("COCO RLE encode 1024x1024", timed(lambda: encode_rle(mask), 50), "mask")
    row("COCO RLE decode 1024x1024", timed(lambda: decode_rle(rle), 50), "mask")
    box = Letterbox.fit((3000, 2500), 1024)
    native = np.zeros((3000, 2500), bool)
    native[500:2500, 300:1200] = True
    canvas = box.mask_to_canvas(native)
    row("letterbox mask 1024 canvas -> 3000x2500 native", timed(lambda: box.mask_to_native(canvas), 10), "mask")

    try:
        pack = Pack()
    except PackMissingError as exc:
        print(f"real-data rows skipped: {exc}")
        return
    nih = [r.image_path for r in pack.nih()[:50]]
    t = timed(lambda: [read_image(p) for p in nih], 1) / len(nih)
    row("read NIH PNG 512x512 (pack)", t, "image")
    cohen = pack.cohen()[:20]
    t = timed(lambda: [read_image(r.image_path) for r in cohen], 1) / len(cohen)
    row("read Cohen JPEG (pack, longest side <= 1024)", t, "image")
    lungs = [r.lungs() for r in cohen]
    t = timed(lambda: [ils_location_masks(a, b) for a, b in lungs], 1) / len(lungs)
    row("ILS location-label masks (pack lung masks)", t, "image")
    t = timed(lambda: [percept_geometry(a, b) for a, b in lungs], 1) / len(lungs)
    row("CheXpercept geometry, 20 sub-regions (pack lung masks)", t, "image")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
