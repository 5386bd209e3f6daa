"""Zone reading of a folder of films without reports: lungs, heart, CTR, and an abnormality score and flag
for each of the six lung zones (the ILS bands = Brixia zones A–F), with overlays.

Per image: the segmenter (default: the shipped lung U-Net with the heart width seen in the image) gives
the lungs and heart; the normative model (:mod:`cxrground.anatomy.normative`) gives the z-map on the
working grid (longest side at most :data:`~cxrground.anatomy.segment.builtin.ANATOMY_WORK_SIZE`) and each
zone's score (75th percentile of z in the zone) and flag (score above the model's threshold).
``OUT/zones.csv`` has the columns :data:`CSV_COLUMNS`; ``OUT/overlays/<stem>.png`` shows the lungs, heart,
flagged zones and the z-map; ``OUT/failures.jsonl`` lists images that could not be read or segmented.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import numpy as np

from cxrground.anatomy.ctr import cardiothoracic_ratio
from cxrground.anatomy.ils_locations import ils_location_masks
from cxrground.anatomy.normative import BRIXIA_ZONE_LABELS, NormativeModel
from cxrground.anatomy.segment.base import LungHeartMasks, LungHeartSegmenter
from cxrground.anatomy.segment.builtin import work_box
from cxrground.errors import CXRGroundError, Failure, InputError
from cxrground.io.image import IMAGE_SUFFIXES, CXRImage, read_image, write_image
from cxrground.io.overlay import contact_sheet, label_panel, overlay_masks

__all__ = ["CSV_COLUMNS", "ZoneReading", "find_images", "read_zones", "write_zones", "zones_overlay"]

ZONES: Final[tuple[str, ...]] = tuple(BRIXIA_ZONE_LABELS)
CSV_COLUMNS: Final[tuple[str, ...]] = ("image", "ctr", *ZONES, *(f"{z}_score" for z in ZONES))


@dataclass(frozen=True)
class ZoneReading:
    """One film's reading: CTR (None without a heart), zone scores (z units) and 0/1 flags."""

    image: str
    ctr: float | None
    scores: dict[str, float]
    flags: dict[str, bool]
    heart_source: str

    def csv_row(self) -> dict[str, str]:
        """The row of ``zones.csv``."""
        row = {"image": self.image, "ctr": "" if self.ctr is None else f"{self.ctr:.4f}"}
        row.update({z: str(int(self.flags[z])) for z in ZONES})
        row.update({f"{z}_score": "" if not np.isfinite(self.scores[z]) else f"{self.scores[z]:.3f}" for z in ZONES})
        return row


def find_images(folder: Path) -> list[Path]:
    """Image files (PNG, JPEG, DICOM) under ``folder``, sorted; an error naming the folder when none."""
    if not folder.is_dir():
        raise InputError("image folder not found", folder)
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise InputError("no PNG, JPEG or DICOM images in the folder", folder)
    return paths


def read_zones(
    image: CXRImage, segmenter: LungHeartSegmenter, model: NormativeModel, name: str | None = None
) -> tuple[ZoneReading, LungHeartMasks, np.ndarray]:
    """The reading of one film, its masks (native size) and its z-map (on the working grid)."""
    seg = segmenter.segment(image)
    right, left = seg.right_lung, seg.left_lung
    if not right.any() or not left.any():
        raise InputError("the segmenter found only one lung", image.path)
    box = work_box(image.shape)
    if box is None:
        px, r_w, l_w = image.pixels, right, left
    else:
        px, r_w, l_w = box.image_to_canvas(image.pixels), box.mask_to_canvas(right), box.mask_to_canvas(left)
    z = model.z_map(px, r_w, l_w)
    scores = model.zone_scores(z, r_w, l_w)
    ctr = cardiothoracic_ratio(seg.heart, right, left) if seg.heart is not None and seg.heart.any() else None
    label = name or (Path(image.path).name if image.path else "image")
    reading = ZoneReading(label, None if ctr is None else float(ctr), scores, model.zone_flags(scores),
                          seg.heart_source)
    return reading, seg, z


def zones_overlay(image: CXRImage, seg: LungHeartMasks, z: np.ndarray, reading: ZoneReading,
                  width: int = 384) -> np.ndarray:
    """Two panels: lungs + heart with the flagged zones, and the z-map (red = brighter than normal)."""
    box = work_box(image.shape)
    if box is None:
        px, r, lft = image.pixels, seg.right_lung, seg.left_lung
        heart = seg.heart
    else:
        px, r, lft = box.image_to_canvas(image.pixels), box.mask_to_canvas(seg.right_lung), \
            box.mask_to_canvas(seg.left_lung)
        heart = box.mask_to_canvas(seg.heart) if seg.heart is not None else None
    locations = ils_location_masks(r, lft)
    flagged = [locations[BRIXIA_ZONE_LABELS[k]] for k in ZONES if reading.flags[k]]
    masks = [r, lft] + ([heart] if heart is not None else [])
    colours = [(0.2, 0.6, 1.0), (0.2, 1.0, 0.6), (1.0, 0.8, 0.1)][: len(masks)]
    anat = overlay_masks(px, masks, colours, alpha=0.2)
    if flagged:
        anat = overlay_masks(anat, flagged, [(1.0, 0.1, 0.1)] * len(flagged), alpha=0.35, outline=False)
    ctr = "n/a" if reading.ctr is None else f"{reading.ctr:.2f}"
    flags = " ".join(f"{k}{'+' if reading.flags[k] else '-'}" for k in ZONES)
    heat = np.clip(z / 4.0, 0.0, 1.0)
    grey = np.repeat((px.astype(np.float64) / 255.0)[:, :, None], 3, axis=2)
    red = np.stack([np.ones_like(heat), np.zeros_like(heat), np.zeros_like(heat)], axis=2)
    zimg = np.clip(255 * (grey * (1 - 0.7 * heat[:, :, None]) + red * 0.7 * heat[:, :, None]), 0, 255)
    panels = [label_panel(anat, f"{reading.image}", [f"CTR {ctr} (heart: {reading.heart_source})", flags], width),
              label_panel(zimg.astype(np.uint8), "deviation from normal (z, 0-4)",
                          [" ".join(f"{k} {reading.scores[k]:.1f}" for k in ZONES)], width)]
    return contact_sheet(panels, columns=2)


def write_zones(
    images: Iterable[Path], out: Path, segmenter: LungHeartSegmenter, model: NormativeModel,
    overlays: bool = True, root: Path | None = None,
) -> tuple[list[ZoneReading], list[Failure]]:
    """Read every image, write ``out/zones.csv`` (+ overlays, failures); returns readings and failures.

    ``root``: names in the CSV are paths relative to it (default: the file name).
    """
    out.mkdir(parents=True, exist_ok=True)
    readings: list[ZoneReading] = []
    failures: list[Failure] = []
    for path in images:
        name = str(path.relative_to(root)) if root is not None else path.name
        try:
            im = read_image(path)
            reading, seg, z = read_zones(im, segmenter, model, name)
        except (InputError, CXRGroundError) as exc:
            failures.append(Failure.from_exception(path, "zones", exc))
            continue
        readings.append(reading)
        if overlays:
            stem = name.replace("/", "__").rsplit(".", 1)[0]
            write_image(out / "overlays" / f"{stem}.png", zones_overlay(im, seg, z, reading))
    _write_csv(out / "zones.csv", readings)
    (out / "failures.jsonl").write_text("".join(json.dumps(asdict(f)) + "\n" for f in failures), encoding="utf-8")
    return readings, failures


def _write_csv(path: Path, readings: Sequence[ZoneReading]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        for r in readings:
            writer.writerow(r.csv_row())
