"""Upside-down films: how many pass the lung QC, and what the orientation check flags, on the pack's real films.

Run: ``CXRGROUND_PACK=.../cxr-pack-v1 .venv/bin/python bench/orientation.py [--limit N]``.

Every NIH and COVID-19 collection film of the pack is read as stored (upright) and turned 180°, as ``ils build
--qc-orientation`` reads it: the lung checks of :func:`~cxrground.anatomy.segment.plausibility.segment_checked`
(a film stored with inverted grey levels is read as its negative), then, on the films that pass them,
:func:`~cxrground.anatomy.segment.orientation.orientation_evidence`. Printed: how many upright and turned films
pass the lung checks, how many of those the orientation check calls upside down (the upright ones by name), and how
many turned films are left.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import numpy as np
import torch
from tqdm import tqdm

from cxrground.anatomy.segment import get_segmenter
from cxrground.anatomy.segment.orientation import orientation_evidence
from cxrground.anatomy.segment.plausibility import segment_checked
from cxrground.datasets.pack import Pack
from cxrground.io.image import read_image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="Only the first N films (NIH first).")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    pack = Pack()
    films = sorted((pack.root / "nih" / "images").glob("*.png")) + sorted((pack.root / "cohen" / "images").glob("*"))
    films = films[: args.limit]
    segmenter = get_segmenter("unet")
    counts = {"upright passing the lung checks": 0, "upright flagged": 0, "turned passing the lung checks": 0,
              "turned flagged": 0}
    flagged_names = []
    for path in tqdm(films, desc="orientation", unit="film"):
        stored = read_image(path)
        turned = dataclasses.replace(stored, pixels=np.ascontiguousarray(stored.pixels[::-1, ::-1]))
        for name, film in (("upright", stored), ("turned", turned)):
            image, _, problems = segment_checked(segmenter, film)  # as ils build: the QC, then the check
            if problems:
                continue
            counts[f"{name} passing the lung checks"] += 1
            if orientation_evidence(segmenter, image).upside_down:
                counts[f"{name} flagged"] += 1
                if name == "upright":
                    flagged_names.append(path.name)
    n = len(films)
    up, turned_ok = counts["upright passing the lung checks"], counts["turned passing the lung checks"]
    print(f"films: {n} (NIH and COVID-19 collection; as stored = upright), each also turned 180 degrees")
    print(f"upright films passing the lung checks: {up}; called upside down by the orientation check: "
          f"{counts['upright flagged']} ({100 * counts['upright flagged'] / max(up, 1):.1f} %): "
          f"{', '.join(flagged_names) or 'none'}")
    caught = counts["turned flagged"]
    print(f"turned films passing the lung checks: {turned_ok} of {n} ({100 * turned_ok / n:.1f} %); called upside "
          f"down by the orientation check: {caught} ({100 * caught / max(turned_ok, 1):.1f} %)")
    print(f"turned films left after both checks: {turned_ok - counts['turned flagged']} of {n}")


if __name__ == "__main__":
    main()
