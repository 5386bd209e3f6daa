"""Train the lesion segmenter ``lesion_unet_v1`` on the pack's NIH films (recipe:
:mod:`cxrground.lesions.segmenter_fit`), one CPU thread.

Run: ``.venv/bin/python bench/lesion_unet_fit.py --out src/cxrground/lesions/weights/lesion_unet_v1 [--steps N]``
(progress lines on stdout; the sidecar beside the weights lists the films, the recipe and the held-out Dice).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    """Parse the options, train, write the weights."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="output stem (.safetensors + .json)")
    ap.add_argument("--steps", type=int, default=None, help="override the recipe's step count")
    args = ap.parse_args()
    from cxrground.anatomy.segment import get_segmenter
    from cxrground.datasets.pack import Pack
    from cxrground.lesions.segmenter_fit import LesionUNetRecipe, fit_from_pack

    recipe = LesionUNetRecipe()
    if args.steps:
        recipe = dataclasses.replace(recipe, steps=args.steps)
    meta = fit_from_pack(Pack(), get_segmenter("unet", threads=1), args.out, recipe,
                         log=lambda s: print(s, flush=True))
    print(f"wrote {args.out}: threshold {meta['threshold']}, held-out Dice {meta['held_out_dice']}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
