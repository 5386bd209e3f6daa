"""Phase 2 of the CheXpercept build: a sampled case's images and its ``chexpercept.json`` entry.

Images go to ``cases/{case_id}/`` under neutral names (§10.3: ``stage1.png``, ``stage2.png``,
``stage3_points.png``, ``stage3_option_{k}.png``; the Stage-3 images for RR cases only, as §10.2 lays them out: an
RF case's revision QAs are carried unasked and name no image); positive cases are drawn from their plan unit
(:mod:`cxrground.percept.plans`). The entry is written atomically to ``BENCH/.work/cases/{case_id}.json``; a case
whose image cannot be read gets ``{"failure": {"path", "reason", "stage"}}`` there instead (and no folder).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from cxrground.errors import InputError
from cxrground.io.files import atomic_write_text
from cxrground.io.image import read_image
from cxrground.io.masks import decode_rle
from cxrground.percept.cases import Candidate
from cxrground.percept.layout import CASES_DIR, WORK_DIR, stable_json
from cxrground.percept.qa import CaseImages, lesion_free_case, positive_case
from cxrground.percept.render import draw_points, gray_rgb, mask_overlay, write_png
from cxrground.vocab.percept_templates import PATH_LESION_FREE, PATH_REVISION_REQUIRED

__all__ = ["CaseTask", "case_failure", "render_case"]


@dataclass(frozen=True)
class CaseTask:
    """One sampled case to render: its candidate, neutral id, path and image file."""

    cand: Candidate
    case_id: str
    path: str
    image: str


def case_failure(entry: dict) -> dict | None:
    """The failure record of a rendered case's ``.work`` entry, or None for a real entry."""
    failure = entry.get("failure")
    return failure if isinstance(failure, dict) and "reason" in failure else None


def render_case(task: CaseTask, out: str) -> tuple[str, str]:
    """Write the case's PNGs under ``{out}/cases/{case_id}/`` and its JSON entry under ``.work``; returns (id, path).

    An unreadable image is recorded as the case's failure (see the module docstring) instead of raising.
    """
    root = Path(out)
    folder = root / CASES_DIR / task.case_id
    try:
        image = read_image(task.image).pixels
    except InputError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        failure = {"failure": {"path": task.image, "reason": exc.reason, "stage": "images"}}
        atomic_write_text(root / WORK_DIR / "cases" / f"{task.case_id}.json", stable_json(failure, indent=None))
        return task.case_id, task.path
    rel = f"{CASES_DIR}/{task.case_id}"
    shape = (int(image.shape[0]), int(image.shape[1]))
    write_png(folder / "stage1.png", gray_rgb(image))
    c = task.cand
    if task.path == PATH_LESION_FREE:
        entry = lesion_free_case(c.lesion, c.pair_id, c.dicom_id, task.case_id, shape,
                                 CaseImages(stage1=f"{rel}/stage1.png"))
    else:
        unit = json.loads((root / WORK_DIR / "plans" / f"{task.case_id}.json").read_text(encoding="utf-8"))
        rr = task.path == PATH_REVISION_REQUIRED
        shown = decode_rle(unit["shown"], shape)
        write_png(folder / "stage2.png", mask_overlay(image, shown if rr else decode_rle(unit["optimal"], shape)))
        images = CaseImages(stage1=f"{rel}/stage1.png", stage2=f"{rel}/stage2.png")
        if rr:  # §10.2: Stage-3 images for RR only (an RF folder's options would show its Stage-2 image again)
            points = [(p, col) for p, col in unit["point_options"] if p is not None]
            write_png(folder / "stage3_points.png", draw_points(mask_overlay(image, shown), points))
            options = []
            for k, opt in enumerate(unit["mask_options"], start=1):
                write_png(folder / f"stage3_option_{k}.png", mask_overlay(image, decode_rle(opt["mask"], shape)))
                options.append(f"{rel}/stage3_option_{k}.png")
            images = CaseImages(stage1=images.stage1, stage2=images.stage2,
                                stage3_points=f"{rel}/stage3_points.png", options=tuple(options))
        entry = positive_case(c.lesion, c.pair_id, c.dicom_id, task.case_id, task.path, shape, unit,
                              unit.get("attributes"), images)
    atomic_write_text(root / WORK_DIR / "cases" / f"{task.case_id}.json", stable_json(entry, indent=None))
    return task.case_id, task.path
