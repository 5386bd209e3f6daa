"""Segmenting one film or a folder of films as a request (:class:`SegmentRequest`): :func:`segment_request` (one
film) and :func:`segment_folder_request` (``images``: every film under a folder).

Each field documents itself (:func:`cxrground.fields.option`); ``cxrground segment lungs`` offers one option per
field. The files written are :mod:`cxrground.anatomy.segment.output`'s, one folder of them per film for a folder
(:mod:`cxrground.anatomy.segment.batch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cxrground.anatomy.segment.batch import SegmentBatch, segment_folder
from cxrground.anatomy.segment.output import segment_file
from cxrground.anatomy.segment.registry import SEGMENTERS, WEIGHTS_OPTION, weights_options
from cxrground.errors import OptionError
from cxrground.fields import key_values, option
from cxrground.io.image import DEFAULT_MAX_PIXELS, MAX_PIXELS_HELP, find_images

__all__ = ["SegmentRequest", "segment_folder_request", "segment_request"]


@dataclass(frozen=True, kw_only=True)
class SegmentRequest:
    """Which film (or folder of films) to segment with which backend (and its weights, given masks or options), and
    where to write."""

    image: Path | None = option(None, path="file", help="The film (PNG, JPEG or DICOM).")
    images: Path | None = option(None, path="dir", help="Instead of --image: a folder of PNG / JPEG / DICOM films "
                                 "(searched recursively), each segmented into OUT_DIR/<its path under the folder>/; "
                                 "OUT_DIR/segment.csv sums them up.")
    out_dir: Path = option(path="out_dir", help="Folder for right_lung.png, left_lung.png (heart.png), overlay.png and "
                           "masks.json; with --images: the run's folder (outside the image folder), a rerun of the "
                           "same run resumes it (films done are skipped), one holding another run's results is "
                           "refused.")
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
    overwrite: bool = option(False, help="With --images: delete the results of another run in OUT_DIR (segment.csv, "
                             "failures.jsonl, segment.json, the run files and the films' files it wrote; other files "
                             "stay) and start afresh.")
    retry_failed: bool = option(False, help="With --images: on a resumed run, segment again the films an earlier "
                                "session recorded as failures (a rerun keeps them by default; a failed film whose "
                                "file changed is read again anyway).")
    quiet: bool = option(False, help="With --images: no progress bar.")

    def check(self) -> None:
        """An :class:`OptionError` for options that do not go together: one of ``image`` and ``images``; the
        ``given`` masks and their backend for one film only; the batch options only with ``images``."""
        if (self.image is None) == (self.images is None):
            raise OptionError("give --image FILE (one film) or --images DIR (a folder of films)")
        if self.images is None:
            batch = [flag for flag, on in (("--overwrite", self.overwrite), ("--retry-failed", self.retry_failed),
                                           ("--quiet", self.quiet)) if on]
            if batch:
                raise OptionError(f"{', '.join(batch)}: only with --images (a folder of films)")
            return
        given = [flag for flag, path in (("--right", self.right), ("--left", self.left), ("--heart", self.heart))
                 if path is not None]
        if given or self.backend == "given":
            raise OptionError(f"{', '.join(given) or '--backend given'}: masks of one film, not with --images; "
                              "for a folder's own masks use --backend masks --backend-opt root=DIR")


def _options(r: SegmentRequest) -> dict[str, object]:
    options: dict[str, object] = {**key_values(r.backend_opt), **weights_options(r.backend, r.weights)}
    if r.allow_pickle:
        options["allow_pickle"] = True
    return options


def segment_request(request: SegmentRequest) -> list[str]:
    """Segment the film ``image`` and write its masks, overlay and ``masks.json``; returns the printed summary. The
    ``given`` backend without ``right`` and ``left``, or options that do not go together
    (:meth:`SegmentRequest.check`), are an :class:`OptionError`; a request for a folder
    (``images``) goes to :func:`segment_folder_request`."""
    r = request
    r.check()
    if r.images is not None:
        raise OptionError("a folder of films (--images): use segment_folder_request")
    assert r.image is not None  # check() makes sure
    options = _options(r)
    given = None
    if r.backend == "given":
        if r.right is None or r.left is None:
            raise OptionError("--backend given needs --right and --left")
        given = (r.right, r.left, r.heart)
    return segment_file(r.image, r.out_dir, r.backend, options, given, orientation_check=r.qc_orientation,
                        max_pixels=r.max_pixels)


def segment_folder_request(request: SegmentRequest) -> SegmentBatch:
    """Segment every film under ``images`` into ``out_dir`` (:func:`~cxrground.anatomy.segment.batch.segment_folder`:
    a folder per film, ``segment.csv``, ``failures.jsonl``; resumable). Options that do not go together
    (:meth:`SegmentRequest.check`) are an :class:`OptionError`; a folder without films an
    :class:`~cxrground.errors.InputError` naming it."""
    r = request
    r.check()
    if r.images is None:
        raise OptionError("one film (--image): use segment_request")
    options = _options(r)
    paths = find_images(r.images)
    segmenter = SEGMENTERS.create(r.backend, **options)
    weights = WEIGHTS_OPTION.get(r.backend)
    recorded = {k: v for k, v in options.items() if k != weights}  # the settings hold the weights' sha256
    return segment_folder(paths, r.out_dir, segmenter, r.images, r.backend, recorded,
                          orientation_check=r.qc_orientation, max_pixels=r.max_pixels, overwrite=r.overwrite,
                          retry_failed=r.retry_failed, progress=not r.quiet)
