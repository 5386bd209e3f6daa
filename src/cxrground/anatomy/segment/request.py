"""Segmenting one film as a request (:class:`SegmentRequest`) and :func:`segment_request`.

Each field documents itself (:func:`cxrground.fields.option`); ``cxrground segment lungs`` offers one option per
field. The files written are :mod:`cxrground.anatomy.segment.output`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cxrground.anatomy.segment.output import segment_file
from cxrground.anatomy.segment.registry import SEGMENTERS, weights_options
from cxrground.errors import OptionError
from cxrground.fields import key_values, option
from cxrground.io.image import DEFAULT_MAX_PIXELS, MAX_PIXELS_HELP

__all__ = ["SegmentRequest", "segment_request"]


@dataclass(frozen=True, kw_only=True)
class SegmentRequest:
    """Which film to segment with which backend (and its weights, given masks or options), and where to write."""

    image: Path = option(path="file", help="The film (PNG, JPEG or DICOM).")
    out_dir: Path = option(path="out_dir", help="Folder for right_lung.png, left_lung.png (heart.png) and overlay.png.")
    backend: str = option("unet", registry=SEGMENTERS)
    weights: Path | None = option(None, path="path", help="unet: .safetensors (default: the shipped lung_unet_v2); "
                                  "hybridgnet: checkpoint; cxas: folder holding the .pth.")
    right: Path | None = option(None, path="file", help="given: right-lung mask PNG (patient's right = image left).")
    left: Path | None = option(None, path="file", help="given: left-lung mask PNG.")
    heart: Path | None = option(None, path="file",
                                help="given: heart mask PNG (else the heart is estimated from the lungs).")
    allow_pickle: bool = option(False, help="hybridgnet: allow a pickled model file you trust.")
    backend_opt: tuple[str, ...] = option((), help="KEY=VALUE for the backend (e.g. masks: root=DIR).")
    qc_orientation: bool = option(False, help="Also check whether the film looks stored in a wrong pose (turned "
                                  "180°, flipped top-bottom, turned 90°; read by the built-in U-Net; a mirrored film "
                                  "is not detected by it, anatomy pose lists those): a warning and masks.json's "
                                  "`orientation`; the masks are still written.")
    max_pixels: int = option(DEFAULT_MAX_PIXELS, low=1, show_default=True, help=MAX_PIXELS_HELP)


def segment_request(request: SegmentRequest) -> list[str]:
    """Segment the film and write its masks, overlay and ``masks.json``; returns the printed summary. The
    ``given`` backend without ``right`` and ``left`` is an :class:`OptionError`."""
    r = request
    options: dict[str, object] = {**key_values(r.backend_opt), **weights_options(r.backend, r.weights)}
    if r.allow_pickle:
        options["allow_pickle"] = True
    given = None
    if r.backend == "given":
        if r.right is None or r.left is None:
            raise OptionError("--backend given needs --right and --left")
        given = (r.right, r.left, r.heart)
    return segment_file(r.image, r.out_dir, r.backend, options, given, orientation_check=r.qc_orientation,
                        max_pixels=r.max_pixels)
