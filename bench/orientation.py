"""Films stored in a wrong pose: how many pass the lung QC, and what the orientation check flags, on the pack's films.

Run: ``CXRGROUND_PACK=.../cxr-pack-v1 .venv/bin/python bench/orientation.py [--limit N]``; ``--figure PNG
--films NAME ...`` instead draws the named pack films in every pose with their lungs and both checks' verdicts.

Every NIH and COVID-19 collection film of the pack is read as stored (upright) and in each wrong pose of
:data:`~cxrground.anatomy.segment.orientation.POSES` (the film turned, mirrored or flipped so that the pose's
correction puts it right), as ``ils build --qc-orientation`` reads it: the lung checks of
:func:`~cxrground.anatomy.segment.plausibility.segment_checked` (a film stored with inverted grey levels is read as its
negative), then, on the films that pass them,
:func:`~cxrground.anatomy.segment.orientation.orientation_evidence` with every correction. Printed, per pose: how many
films pass the lung checks, how many of those the check flags (the upright ones by name), and how many it flags with
the right correction; then what the check flags with only the corrections the check ships
(:data:`~cxrground.anatomy.segment.orientation.CHECKED_POSES`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from cxrground.anatomy.segment import get_segmenter
from cxrground.anatomy.segment.orientation import (
    CHECKED_POSES,
    POSES,
    OrientationEvidence,
    lung_reading,
    orientation_evidence,
    pose_pixels,
)
from cxrground.anatomy.segment.plausibility import segment_checked
from cxrground.datasets.pack import Pack
from cxrground.io.image import read_image

#: How to store an upright film so that each correction puts it right (the inverse of the correction).
WRONG_POSES = {
    "turned 180°": lambda p: p[::-1, ::-1],
    "mirrored left-right": lambda p: p[:, ::-1],
    "flipped top-bottom": lambda p: p[::-1, :],
    "turned 90° clockwise": lambda p: np.rot90(p, 1),
    "turned 90° counter-clockwise": lambda p: np.rot90(p, -1),
}


#: A small non-square index grid: a pose's effect on it names the pose (two poses that compose to the same
#: permutation of pixels give the same key).
_PROBE = np.arange(6).reshape(2, 3)


def _key(pixels: np.ndarray) -> tuple:
    """The key of a pose, from its effect on :data:`_PROBE`."""
    return pixels.shape, pixels.tobytes()


class _PoseCache:
    """The upright film's readings in every pose (the eight of a square's symmetries at most): a film stored in a
    wrong pose and read after a correction is the upright film in the composed pose, pixel for pixel."""

    def __init__(self, segmenter, image) -> None:
        self.segmenter, self.image, self.readings = segmenter, image, {}

    def reading(self, pose: np.ndarray, transform) -> object:
        """The reading of the upright film after ``transform`` (``pose``: its effect on :data:`_PROBE`)."""
        key = _key(pose)
        if key not in self.readings:
            pixels = np.ascontiguousarray(transform(self.image.pixels))
            self.readings[key] = lung_reading(self.segmenter, pixels, self.image)
        return self.readings[key]

    def evidence(self, wrong: str | None) -> OrientationEvidence:
        """The orientation evidence of the film stored in the pose ``wrong`` (None: upright), every correction."""
        w = (lambda p: p) if wrong is None else WRONG_POSES[wrong]
        stored = self.reading(np.ascontiguousarray(w(_PROBE)), w)
        corrected = {}
        for name in POSES:
            pose = pose_pixels(np.ascontiguousarray(w(_PROBE)), name)
            corrected[name] = self.reading(pose, lambda p, n=name: pose_pixels(np.ascontiguousarray(w(p)), n))
        return OrientationEvidence(stored, corrected)


def _restricted(ev: OrientationEvidence, names: tuple[str, ...]) -> str | None:
    """The correction the check would name with only ``names`` tried."""
    return OrientationEvidence(ev.stored, {n: ev.corrected[n] for n in names}).best_correction


def _shipped(ev: OrientationEvidence) -> bool:
    """Whether the shipped check flags the film: a correction of :data:`CHECKED_POSES` wins on both readings."""
    return _restricted(ev, CHECKED_POSES) is not None


def _figure(pack: Pack, names: list[str], out: str) -> None:
    """The films ``names`` in every pose: lungs, the lung checks' and the orientation check's verdicts."""
    from cxrground.io.image import write_image
    from cxrground.io.overlay import contact_sheet, label_panel, overlay_masks

    segmenter = get_segmenter("unet")
    panels = []
    for name in names:
        path = next(p for sub in ("nih", "cohen") for p in (pack.root / sub / "images").glob(name))
        stored = read_image(path)
        for pose in ("upright", *WRONG_POSES):
            pixels = stored.pixels if pose == "upright" else np.ascontiguousarray(WRONG_POSES[pose](stored.pixels))
            image, masks, problems = segment_checked(segmenter, dataclasses.replace(stored, pixels=pixels))
            lung_check = "lung checks: " + ("fail" if problems else "pass")
            ev = None if problems else orientation_evidence(segmenter, image, CHECKED_POSES)
            named = None if ev is None else ev.best_correction
            verdict = "" if ev is None else ("orientation: ok" if named is None else f"flagged: fix = {named}")
            rgb = overlay_masks(image.pixels, [masks.right_lung, masks.left_lung], colours=[(0.2, 0.5, 1.0),
                                                                                          (1.0, 0.3, 0.3)])
            title = f"{path.stem[:18]}: upright" if pose == "upright" else f"{path.stem[:18]}: fix = {pose}"
            panels.append(label_panel(rgb, title, [lung_check, verdict], width=250))
    write_image(Path(out), contact_sheet(panels, columns=1 + len(WRONG_POSES)))
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="Only the first N films (NIH first).")
    parser.add_argument("--figure", default=None, help="Write a figure of --films in every pose to this PNG.")
    parser.add_argument("--films", nargs="*", default=["00000100_000.png"], help="Pack film names for --figure.")
    parser.add_argument("--save", default=None, help="Also write every film's readings in every pose to this JSON.")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    pack = Pack()
    if args.figure:
        _figure(pack, args.films, args.figure)
        return
    films = sorted((pack.root / "nih" / "images").glob("*.png")) + sorted((pack.root / "cohen" / "images").glob("*"))
    films = films[: args.limit]
    segmenter = get_segmenter("unet")
    poses = ("upright", *WRONG_POSES)
    passing = dict.fromkeys(poses, 0)
    flagged = dict.fromkeys(poses, 0)
    right = dict.fromkeys(poses, 0)
    shipped = dict.fromkeys(poses, 0)
    flagged_names: list[str] = []
    shipped_names: list[str] = []
    saved: list[dict] = []
    for path in tqdm(films, desc="orientation", unit="film"):
        stored = read_image(path)
        cache = _PoseCache(segmenter, stored)
        for pose in poses:
            pixels = stored.pixels if pose == "upright" else np.ascontiguousarray(WRONG_POSES[pose](stored.pixels))
            image, _, problems = segment_checked(segmenter, dataclasses.replace(stored, pixels=pixels))
            if problems:
                continue
            passing[pose] += 1
            if np.array_equal(image.pixels, pixels):  # read as stored: the cached readings are this film's
                ev = cache.evidence(None if pose == "upright" else pose)
            else:  # read as its negative
                ev = orientation_evidence(segmenter, image, tuple(POSES))
            named = ev.best_correction
            if named is not None:
                flagged[pose] += 1
                right[pose] += named == pose
                if pose == "upright":
                    flagged_names.append(f"{path.name} ({named})")
            shipped[pose] += _shipped(ev)
            if pose == "upright" and _shipped(ev):
                shipped_names.append(f"{path.name} ({_restricted(ev, CHECKED_POSES)})")
            saved.append({"film": path.name, "pose": pose, "stored": dataclasses.asdict(ev.stored),
                          "corrected": {k: dataclasses.asdict(v) for k, v in ev.corrected.items()}})
    n = len(films)
    print(f"films: {n} (NIH and COVID-19 collection; as stored = upright), each also in {len(WRONG_POSES)} wrong poses")
    print("| pose | passing the lung checks | flagged, all corrections | named the right correction | "
          "flagged, shipped check | left after both checks |")
    print("|---|---:|---:|---:|---:|---:|")
    for pose in poses:
        p = max(passing[pose], 1)
        left = "" if pose == "upright" else str(passing[pose] - shipped[pose])
        named = "" if pose == "upright" else f"{right[pose]}"
        print(f"| {pose} | {passing[pose]} of {n} ({100 * passing[pose] / n:.1f} %) | {flagged[pose]} "
              f"({100 * flagged[pose] / p:.1f} %) | {named} | {shipped[pose]} ({100 * shipped[pose] / p:.1f} %) | "
              f"{left} |")
    print(f"upright films flagged (all corrections): {', '.join(flagged_names) or 'none'}")
    print(f"upright films flagged (shipped check): {', '.join(shipped_names) or 'none'}")
    print(f"shipped check: the corrections {', '.join(CHECKED_POSES)}")
    if args.save:
        Path(args.save).write_text(json.dumps(saved) + "\n", encoding="utf-8")
        print(f"readings of every film and pose: {args.save}")


if __name__ == "__main__":
    main()
