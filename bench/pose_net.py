"""The pose reader on films it never saw: held-out NIH patients, the COVID-19 collection, the synthetic cohort.

Run: ``CXRGROUND_PACK=.../cxr-pack-v1 .venv/bin/python bench/pose_net.py [--weights W] [--gallery PNG]``.

E1 is the NIH films of the patients the weights' sidecar lists as held out (``data.heldout_images``); E2 is the
COVID-19 collection films of the patients it lists as held out (``data.cohen_heldout_images``; every film of that
collection when none trained). Each film is read as stored
(upright) and stored in each of the seven other poses of
:data:`~cxrground.anatomy.segment.pose_net.POSE_CLASSES`. Printed per set and pose: films, flagged (the most
probable pose is not upright) and flagged with the right correction; then the films of ``make demo``'s synthetic
cohort (64 studies, seed 0), upright. ``--gallery`` draws the upright films that were flagged and the mirrored
films that were missed. The rule these numbers were scored against: ``bench/records/pose_net_preregistration.md``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from cxrground.anatomy.segment.pose_net import (
    DEFAULT_POSE_WEIGHTS,
    PoseReader,
    apply_pose,
    correction_name,
    read_pose_sidecar,
)
from cxrground.datasets.pack import Pack
from cxrground.models.pose_net import STORED_AS, CheckRow, pose_check, pose_check_lines, pose_check_summary

SHIPPED = Path(__file__).resolve().parents[1] / "src/cxrground/anatomy/segment/weights" / \
    f"{DEFAULT_POSE_WEIGHTS}.safetensors"

def score(reader: PoseReader, films: list[tuple[str, np.ndarray]], label: str
          ) -> dict[tuple[int, bool], list[CheckRow]]:
    """Per true pose: (film, read pose, upright probability) of every film (:func:`pose_check`)."""
    return pose_check(reader, films, progress=True, label=label)


def print_table(label: str, results: dict[tuple[int, bool], list[CheckRow]]) -> None:
    """One line per pose: films, flagged, right correction; the upright films flagged by name."""
    print(f"\n{label}")
    print("\n".join(pose_check_lines(pose_check_summary(results))))
    for name, read, p_up in results[(0, False)]:
        if read != (0, False):
            print(f"  upright film flagged: {name} (read as needing '{correction_name(read)}', P(upright) {p_up:.3f})")


def gallery(path: Path, items: list[tuple[str, np.ndarray, str]]) -> None:
    """A grid of films with captions."""
    from PIL import Image, ImageDraw

    if not items:
        print(f"gallery: nothing to draw, {path} not written")
        return
    side, cols = 256, 5
    rows = (len(items) + cols - 1) // cols
    sheet = Image.new("RGB", (cols * side, rows * (side + 28)), "white")
    draw = ImageDraw.Draw(sheet)
    for i, (name, px, caption) in enumerate(items):
        im = Image.fromarray(px).convert("RGB")
        im.thumbnail((side, side))
        x, y = (i % cols) * side, (i // cols) * (side + 28)
        sheet.paste(im, (x + (side - im.width) // 2, y))
        draw.text((x + 4, y + side + 2), name[:40], fill="black")
        draw.text((x + 4, y + side + 14), caption[:40], fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path)
    print(f"gallery: {len(items)} films -> {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default=str(SHIPPED))
    ap.add_argument("--pack", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="At most this many films per set (a quick look).")
    ap.add_argument("--gallery", type=Path, default=None)
    ap.add_argument("--synthetic", type=int, default=64, help="Studies of the synthetic cohort (seed 0).")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    pack = Pack(args.pack)
    data = read_pose_sidecar(args.weights)["data"]
    held = set(data["heldout_images"])
    cohen_held = set(data.get("cohen_heldout_images") or [r.image_path.name for r in pack.cohen()])
    reader = PoseReader(args.weights, threads=args.threads)
    e1 = [(r.image_path.name, r.read().pixels) for r in pack.nih() if r.image_path.name in held][:args.limit]
    e2 = [(r.image_path.name, r.read().pixels) for r in pack.cohen() if r.image_path.name in cohen_held][:args.limit]
    print(f"weights {args.weights}; E1 {len(e1)} held-out NIH films, E2 {len(e2)} COVID-19 collection films "
          f"({'of the held-out patients' if 'cohen_heldout_images' in data else 'all: none trained'})")
    r1 = score(reader, e1, "E1")
    r2 = score(reader, e2, "E2")
    print_table("E1: held-out NIH patients", r1)
    print_table("E2: COVID-19 collection films never trained on", r2)
    up = r1[(0, False)] + r2[(0, False)]
    n_up = sum(1 for _, read, _ in up if read != (0, False))
    print(f"\nupright flagged, E1 and E2 together: {n_up} of {len(up)} ({100 * n_up / max(1, len(up)):.2f} %)")

    from cxrground.datasets.synthetic.study import generate_study

    phantoms = [(f"synthetic {i}", generate_study(0, i).image) for i in range(args.synthetic)]
    readings = reader.read_many([px for _, px in phantoms])
    flagged = [(n, r) for (n, _), r in zip(phantoms, readings, strict=True) if not r.upright]
    print(f"synthetic cohort (seed 0): {len(phantoms)} films upright, flagged {len(flagged)}"
          + "".join(f"\n  {n}: '{r.correction}' ({r.confidence:.3f})" for n, r in flagged))

    if args.gallery:
        films = dict(e1 + e2)
        items = [(n, films[n], f"upright, flagged: {correction_name(read)}")
                 for n, read, _ in up if read != (0, False)]
        for n, read, _ in r1[(0, True)] + r2[(0, True)]:
            if read != (0, True):
                items.append((n, apply_pose(films[n], (0, True)), f"mirrored, read {STORED_AS[read]}"))
        gallery(args.gallery, items[:40])


if __name__ == "__main__":
    main()
