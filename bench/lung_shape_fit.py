"""Recipe of the shipped mean lung shape ``lung_shape_v1.npz`` and the lung plausibility check measured on the pack.

Run: ``.venv/bin/python bench/lung_shape_fit.py [--out FILE [--overwrite]] [--cache DIR] [--list N] [--sheet PNG]``
(the fit is written only with ``--out``; an existing file only with ``--overwrite``: :mod:`weights_out`).

1. Fits :class:`cxrground.anatomy.segment.plausibility.LungShape` on the human lung annotations of the pack's
   COVID-19 collection rows whose licence allows shipping derived artefacts (CC BY 3.0 / 4.0 / "authorized"; the
   CC BY-NC-SA rows are never used) and, with ``--out FILE``, writes it with its provenance (the shipped file is
   ``src/cxrground/anatomy/segment/weights/lung_shape_v1.npz``).
2. Prints the IoU of every annotation with the mean shape (the threshold ``MIN_SHAPE_IOU`` must stay below the
   lowest), and with ``--cache DIR`` (the lungs cache of ``bench/segment.py --real --cache DIR``, built-in U-Net)
   the same IoU of the U-Net's lungs on all 826 pack films, the films :func:`lung_problems` flags and the
   ``--list`` lowest IoUs; ``--sheet PNG`` draws the U-Net's lungs of the flagged NIH films (and of the next
   ``--list`` lowest IoUs above the threshold with ``--sheet-next``) on one contact sheet.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
from weights_out import add_out_options, refuse_existing

from cxrground.anatomy.segment.plausibility import (
    MIN_SHAPE_IOU,
    LungShape,
    lung_problems,
    shipped_shape_path,
)
from cxrground.datasets.pack import Pack


def fit(pack: Pack) -> tuple[LungShape, list[str]]:
    """The mean shape of the shippable annotations, and their image ids."""
    rows = sorted(pack.cohen(shippable_only=True), key=lambda r: r.image_id)
    pairs = [r.lungs() for r in rows]
    ids = [r.image_id for r in rows]
    digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]
    licences = sorted({r.license for r in rows})
    meta = {"name": "lung_shape_v1", "source": "cxr-pack-v1 COVID-19 collection lung annotations (V7 Labs)",
            "licences": licences, "image_ids_sha256_16": digest, "recipe": "bench/lung_shape_fit.py"}
    return LungShape.fit(pairs, meta), ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_out_options(ap, f"the fitted shape (.npz; the shipped one is {shipped_shape_path()})")
    ap.add_argument("--cache", type=Path, help="lungs cache of bench/segment.py --real --cache")
    ap.add_argument("--list", type=int, default=20, help="lowest-IoU films to list")
    ap.add_argument("--sheet", type=Path, help="contact sheet of the flagged NIH films' lungs")
    ap.add_argument("--sheet-next", type=int, default=0, help="also draw the next N lowest IoUs above the threshold")
    args = ap.parse_args()
    refuse_existing(ap, [args.out], args.overwrite)
    pack = Pack()
    shape, ids = fit(pack)
    if args.out is not None:
        shape.save(args.out)
    print(f"mean lung shape of {len(ids)} shippable annotations ({', '.join(shape.meta['licences'])})"
          + (f" -> {args.out}" if args.out is not None else " (not written: no --out)"))
    ref = np.array([shape.iou(*r.lungs()) for r in sorted(pack.cohen(shippable_only=True),
                                                          key=lambda r: r.image_id)])
    print(f"annotations vs mean shape: IoU min {ref.min():.3f}, 5th percentile {np.percentile(ref, 5):.3f}, "
          f"median {np.median(ref):.3f} (threshold MIN_SHAPE_IOU {MIN_SHAPE_IOU:.2f})")
    if args.cache is None:
        return
    scores: dict[str, float] = {}
    flagged: dict[str, list[str]] = {}
    for path in sorted(args.cache.glob("*.npz")):
        with np.load(path) as data:
            right, left = data["R"].astype(bool), data["L"].astype(bool)
        problems = lung_problems(right, left, shape)
        if right.any() and left.any():
            scores[path.stem] = shape.iou(right, left)
        if problems:
            flagged[path.stem] = problems
    values = np.array(list(scores.values()))
    print(f"U-Net lungs on {len(scores) + sum(1 for p in flagged.values() if p == ['one lung not found'])} pack "
          f"films: IoU 1st percentile {np.percentile(values, 1):.3f}, median {np.median(values):.3f}; "
          f"implausible: {len(flagged)}")
    for name, problems in sorted(flagged.items()):
        print(f"  {name}: {'; '.join(problems)}")
    ranked = sorted(scores.items(), key=lambda t: t[1])
    print(f"lowest {args.list} IoUs:")
    for name, s in ranked[: args.list]:
        print(f"  {s:.3f} {name}")
    if args.sheet is not None:
        above = [n for n, s in ranked if s >= MIN_SHAPE_IOU][: args.sheet_next]
        names = [n for n in [*flagged, *above] if n in scores and n.startswith("nih_")]
        write_sheet(args.cache, names, scores, args.sheet)
        print(f"wrote {args.sheet} ({len(names)} films)")


def write_sheet(cache: Path, names: list[str], scores: dict[str, float], path: Path) -> None:
    """The cached film with the U-Net's right (blue) and left (green) lung, IoU in the caption, for each name."""
    from cxrground.io.image import write_image
    from cxrground.io.overlay import contact_sheet, label_panel, overlay_masks

    panels = []
    for name in names:
        with np.load(cache / f"{name}.npz") as data:
            px = np.clip(data["px"], 0, 255).astype(np.uint8)
            rgb = overlay_masks(px, [data["R"].astype(bool), data["L"].astype(bool)],
                                [(0.2, 0.6, 1.0), (0.2, 1.0, 0.6)], alpha=0.35)
        panels.append(label_panel(rgb, name.removeprefix("nih_"), [f"shape IoU {scores[name]:.2f}"], 256))
    write_image(path, contact_sheet(panels, columns=5))


if __name__ == "__main__":
    main()
