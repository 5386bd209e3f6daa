"""Train the lesion segmenter on the pack's NIH films (recipe: :mod:`cxrground.lesions.segmenter_fit`), one CPU
thread.

Run: ``.venv/bin/python bench/lesion_unet_fit.py --out STEM [--overwrite] [--steps N] [--lungs NAME|FILE]``
(rebuilding the shipped weights: ``--out src/cxrground/lesions/weights/lesion_unet_v1 --overwrite``; an existing
``STEM.safetensors`` or ``STEM.json`` stops the run without ``--overwrite``: :mod:`weights_out`) (progress lines on
stdout; the sidecar beside the weights lists the films, the lungs, the recipe and the held-out Dice).
The base films are segmented with the lung U-Net ``--lungs``: by default ``lung_unet_v1``, the lungs the shipped
``lesion_unet_v1`` was fitted through (its sidecar's ``segmenter``), not the shipped lung U-Net ``lung_unet_v2``;
``--lungs lung_unet_v2`` (or a ``.safetensors`` path) fits through other lungs.
With ``--mil-weight W`` the real NIH films with image-level labels add a multiple-instance loss (lung-lesion
label vs No Finding; ``--init`` starts from trained weights), and the held-out film AUROC is printed as well.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys

from fit_lungs import add_lungs_option, lung_segmenter, resolve_lungs
from weights_out import add_out_options, refuse_existing

os.environ.setdefault("OMP_NUM_THREADS", "1")

#: The lung U-Net the shipped ``lesion_unet_v1`` was fitted through (its sidecar's ``segmenter``).
LUNGS = "lung_unet_v1"


def main() -> None:
    """Parse the options, train, write the weights."""
    ap = argparse.ArgumentParser(description=__doc__)
    add_out_options(ap, "the weights (a stem: STEM.safetensors + STEM.json)", required=True)
    ap.add_argument("--steps", type=int, default=None, help="override the recipe's step count")
    ap.add_argument("--lr", type=float, default=None, help="override the recipe's learning rate")
    ap.add_argument("--mil-weight", type=float, default=None, help="weight of the multiple-instance loss")
    ap.add_argument("--init", default=None, help="start from these weights (.safetensors)")
    add_lungs_option(ap, LUNGS, "the shipped lesion_unet_v1")
    args = ap.parse_args()
    lungs = resolve_lungs(ap, args.lungs)
    refuse_existing(ap, [args.out.with_name(args.out.name + ext) for ext in (".safetensors", ".json")],
                    args.overwrite)
    from cxrground.datasets.pack import Pack
    from cxrground.lesions.segmenter_fit import LesionUNetRecipe, fit_from_pack

    overrides = {k: v for k, v in (("steps", args.steps), ("lr", args.lr), ("mil_weight", args.mil_weight),
                                   ("init", args.init)) if v is not None}
    recipe = dataclasses.replace(LesionUNetRecipe(), **overrides)
    rebuild = "python bench/lesion_unet_fit.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    meta = fit_from_pack(Pack(), lung_segmenter(lungs, threads=1), args.out, recipe,
                         log=lambda s: print(s, flush=True), rebuild=rebuild)
    print(f"wrote {args.out}: threshold {meta['threshold']}, held-out Dice {meta['held_out_dice']}"
          + (f", held-out film AUROC {meta['held_out_film_auroc']}" if "held_out_film_auroc" in meta else ""))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
