"""The files ``cxrground segment lungs`` writes for one image, and the lines it prints about the heart.

``OUT/right_lung.png``, ``left_lung.png`` (0/255 at native size), ``heart.png`` when there is a heart,
``overlay.png`` (the masks over the image in :data:`~cxrground.io.overlay.ANATOMY_COLOURS`: right lung blue, left
lung green, heart yellow; with a heart, the CTR's two diameters drawn on it: the heart's
width in orange, the thorax's in magenta) and ``masks.json`` (shape, backend, heart source, CTR and where its
diameters lie, areas, ``lung_problems``: why the lungs look implausible, empty when they do not
(:func:`~cxrground.anatomy.segment.plausibility.lung_problems`), ``orientation``: why the film looks stored in a
wrong pose, when that was checked (:func:`~cxrground.anatomy.segment.orientation.orientation_problem`; null when it
looks upright), the backend's extra information and provenance).

Into a folder used before, a run replaces these files: ``masks.json`` is removed first and written last (so a
run cut short leaves no ``masks.json`` describing other masks), and a ``heart.png`` of an earlier film is removed
when this film has no heart. Other files in the folder are left as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cxrground.anatomy.ctr import CtrMeasurement, measure_ctr
from cxrground.anatomy.segment.base import LungHeartMasks, LungHeartSegmenter
from cxrground.anatomy.segment.plausibility import lung_problems, segment_checked
from cxrground.errors import InputError
from cxrground.io.files import atomic_write_text
from cxrground.io.image import DEFAULT_MAX_PIXELS, CXRImage, read_image, write_image
from cxrground.io.masks import read_mask_png, write_mask_png
from cxrground.io.overlay import ANATOMY_COLOURS, draw_rows, overlay_masks
from cxrground.registry import read_provenance
from cxrground.vocab.views import is_frontal

__all__ = ["DIAMETER_COLOURS", "SegmentationOutput", "segment_file", "segment_film", "write_segmentation"]

#: Colours (RGB in [0, 1]) of the cardiac and the thoracic diameter drawn on ``overlay.png``.
DIAMETER_COLOURS: tuple[tuple[float, float, float], tuple[float, float, float]] = ((1.0, 0.55, 0.0), (1.0, 0.3, 1.0))

#: What the printed summary says about each heart source.
_HEART_NOTES = {"estimate": "ESTIMATE: an outline fitted to the lungs, its width the cardiac borders seen in the "
                            "image (else the lungs' medial borders); not segmented from the image",
                "truth": "given"}


@dataclass(frozen=True)
class SegmentationOutput:
    """What :func:`write_segmentation` wrote: the folder, the CTR (None without a heart) and ``masks.json``."""

    out_dir: Path
    ctr: float | None
    record: dict[str, Any]

    def summary_lines(self, masks: LungHeartMasks) -> list[str]:
        """The human-readable summary: files written, CTR, where the heart comes from, plausibility warning."""
        heart = ", heart.png" if self.ctr is not None else ""
        lines = [f"wrote {self.out_dir}/right_lung.png, left_lung.png{heart}, overlay.png"]
        if masks.extra.get("polarity"):
            lines.append(f"note: {masks.extra['polarity']}; overlay.png shows the negative")
        if self.record.get("orientation"):
            lines.append(f"warning: {self.record['orientation']}: the sides of these masks may be wrong")
        if self.record.get("lung_problems"):
            lines.append("warning: implausible lungs (" + "; ".join(self.record["lung_problems"]) + "): check "
                         "overlay.png before using these masks, the CTR or anything measured on them")
        if self.ctr is None:
            return [*lines, "heart: none (no heart mask); CTR undefined"]
        notes = {**_HEART_NOTES, "model": f"segmented by {masks.source}"}
        note = notes.get(masks.heart_source, masks.heart_source)
        lines += [f"CTR = {self.ctr:.3f}", f"heart: {note}"]
        info = masks.extra.get("heart_estimate") or {}
        if info.get("ctr_radiological") is not None:
            lines.append(f"radiological CTR (MRD + MLD over the maximal internal thoracic diameter) = "
                         f"{info['ctr_radiological']:.3f}")
        if masks.heart_source == "estimate" and info.get("floor_warning"):
            lines.append(f"warning: {info['floor_warning']}")
        if masks.heart_source == "estimate" and info.get("ctr_plausible") is False:
            lines.append("warning: the estimated heart is implausibly narrow (CTR < 0.30): the lung masks probably "
                         "overlap the heart shadow; do not use this CTR for cardiomegaly decisions")
        return lines


def write_segmentation(out_dir: Path, image_path: Path, image: CXRImage, masks: LungHeartMasks,
                       provenance: dict[str, Any], problems: list[str] | None = None,
                       orientation: str | bool | None = False) -> SegmentationOutput:
    """Write the mask PNGs, the overlay and ``masks.json`` of one segmented image into ``out_dir``; ``problems``:
    the lungs' :func:`~cxrground.anatomy.segment.plausibility.lung_problems` when already known; ``orientation``:
    the orientation check's finding (None: looks upright; False: not checked, left out of ``masks.json``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "masks.json").unlink(missing_ok=True)  # written last: no record of other masks during the writes
    write_mask_png(out_dir / "right_lung.png", masks.right_lung)
    write_mask_png(out_dir / "left_lung.png", masks.left_lung)
    layers = [masks.right_lung, masks.left_lung]
    colours = [ANATOMY_COLOURS["right_lung"], ANATOMY_COLOURS["left_lung"]]
    measured: CtrMeasurement | None = None
    if masks.heart is not None:
        write_mask_png(out_dir / "heart.png", masks.heart)
        layers.append(masks.heart)
        colours.append(ANATOMY_COLOURS["heart"])
        measured = measure_ctr(masks.heart, masks.right_lung, masks.left_lung)
    else:
        (out_dir / "heart.png").unlink(missing_ok=True)  # an earlier film's heart
    rgb = overlay_masks(image.pixels, layers, colours, alpha=0.35)
    if measured is not None:
        rgb = draw_rows(rgb, [(d.y, d.x0, d.x1) for d in (measured.cardiac, measured.thoracic)], DIAMETER_COLOURS)
    write_image(out_dir / "overlay.png", rgb)
    ctr = None if measured is None else measured.ctr
    record = {
        "image": str(image_path),
        "shape": list(image.shape),
        "backend": masks.source,
        "heart_source": masks.heart_source,
        "ctr": None if ctr is None else round(ctr, 4),
        "ctr_diameters": None if measured is None else {"cardiac": measured.cardiac.to_dict(),
                                                         "thoracic": measured.thoracic.to_dict()},
        "areas": {"right_lung": int(masks.right_lung.sum()), "left_lung": int(masks.left_lung.sum()),
                  "heart": None if masks.heart is None else int(masks.heart.sum())},
        "lung_problems": lung_problems(masks.right_lung, masks.left_lung) if problems is None else problems,
        **({} if orientation is False else {"orientation": orientation}),
        "extra": {k: v for k, v in masks.extra.items() if k != "landmarks_canvas"},
        "provenance": provenance,
    }
    atomic_write_text(out_dir / "masks.json", json.dumps(record, indent=2, default=str) + "\n")
    return SegmentationOutput(out_dir, ctr, record)


def segment_film(image: Path, out_dir: Path, segmenter: LungHeartSegmenter, orientation_check: bool = False,
                 max_pixels: int | None = DEFAULT_MAX_PIXELS, backend: str | None = None,
                 provenance: dict[str, Any] | None = None) -> tuple[SegmentationOutput, LungHeartMasks]:
    """Read the film ``image``, segment it with ``segmenter`` (the lung checks of
    :func:`~cxrground.anatomy.segment.plausibility.segment_checked`) and write its files into ``out_dir``
    (:func:`write_segmentation`); with ``orientation_check``, also check whether it looks stored in a wrong pose (a
    warning, the masks are written). ``backend``: the segmenter's name for its provenance when it records none;
    ``provenance``: the segmenter's provenance for ``masks.json`` when already read (a batch reads it once), else
    read here.

    Returns what was written and the masks. A film that cannot be read, whose DICOM header names a view other than
    PA or AP, or that is blank or too small to be a film is an :class:`~cxrground.errors.InputError` naming it, and
    nothing is written. :func:`segment_file` (one film) and ``segment lungs --images``
    (:func:`cxrground.anatomy.segment.batch.segment_folder`) both segment through it.
    """
    im = read_image(image, max_pixels=max_pixels)
    if im.view and not is_frontal(im.view):
        raise InputError(f"view {im.view.upper()} is not frontal (PA/AP): the lungs are segmented on frontal films",
                         image)
    im, found, problems = segment_checked(segmenter, im)
    posed: str | bool | None = False
    if orientation_check:
        from cxrground.anatomy.segment.orientation import orientation_problem

        posed = orientation_problem(segmenter, im)
    if provenance is None:
        provenance = read_provenance("segmenter", segmenter) or {"name": getattr(segmenter, "name", backend)}
    return write_segmentation(out_dir, image, im, found, provenance, problems, posed), found


def segment_file(image: Path, out_dir: Path, backend: str, options: dict[str, Any],
                 given: tuple[Path, Path, Path | None] | None = None, orientation_check: bool = False,
                 max_pixels: int | None = DEFAULT_MAX_PIXELS) -> list[str]:
    """Segment the film ``image`` with ``backend`` (``given``: right, left, heart mask PNGs) into ``out_dir``
    (:func:`segment_film`); with ``orientation_check``, also check whether it looks stored in a wrong pose.

    Returns :meth:`SegmentationOutput.summary_lines`.
    """
    from cxrground.anatomy.segment.registry import SEGMENTERS

    if given is not None:
        right, left, heart = given

        def masks(im: CXRImage) -> tuple[Any, ...]:
            return (read_mask_png(right, im.shape), read_mask_png(left, im.shape),
                    read_mask_png(heart, im.shape) if heart else None)

        options = {**options, "masks": masks, "label": "cli"}
    seg = SEGMENTERS.create(backend, **options)
    written, found = segment_film(image, out_dir, seg, orientation_check, max_pixels, backend)
    return written.summary_lines(found)
