"""Zone reading of a folder of films without reports: lungs, heart, CTR, and an abnormality score and flag
for each of the six lung zones (the ILS bands = Brixia zones A–F), with overlays.

Per image: the segmenter (default: the shipped lung U-Net with the heart width seen in the image) gives
the lungs and heart, which must pass the lung plausibility check
(:func:`~cxrground.anatomy.segment.plausibility.segment_checked`); a zone reader gives each zone's score and flag
on the working grid (longest side at most :data:`~cxrground.anatomy.segment.builtin.ANATOMY_WORK_SIZE`).
``OUT/zones.csv`` has the columns :data:`CSV_COLUMNS` (the reading, then the film's :data:`QUALITY_COLUMNS`);
``OUT/overlays/<relative path>.png`` (:func:`overlay_names`, :func:`zones_overlay`) shows the lungs, heart, the six
zones lettered A–F with the flagged ones tinted, and the reader's map; ``OUT/failures.jsonl`` lists images that could
not be read or segmented or whose lungs are implausible, with the reason (and, for rejected lungs, ``overlay``: the
picture of them under ``overlays/_failed/``, :func:`failed_overlay`); ``OUT/zones.json`` says which reader produced
the flags; with ``save_masks``, ``OUT/masks/`` holds each film's lung and heart masks (:func:`mask_names`).

The default of ``anatomy zones`` is the position-prior reader ``zone_prior_v3``
(:class:`~cxrground.lesions.zone_prior.PriorZoneReader`): a film severity from both image readers
(:mod:`cxrground.lesions.zone_severity`, fitted on readings through the shipped lungs) placed over the zones by a
position prior and both image readers' within-film zone evidence; each ``*_score`` is its probability.
``zone_prior_v2`` is the same reader with the severity model fitted through ``lung_unet_v1``'s lungs;
``zone_prior_v1`` takes the film severity from ``zone_sim_v1`` alone.

With a zone classifier (``zone_model``: the shipped
:data:`~cxrground.lesions.zone_classifier.SHIPPED_ZONE_READER`, trained on
simulated lesions in NIH normal films; or one trained by :mod:`cxrground.lesions.zone_fit` on a site's own
labelled films; see :func:`resolve_zone_reader`), each zone's ``*_score`` is the classifier's probability that
the zone is abnormal (features of :mod:`cxrground.lesions.zone_features` on the same working grid) and its flag
is probability ≥ the classifier's threshold; the classifier must have been trained with the same normative
model. With ``--zone-model normative`` (``zone_model=None`` in :func:`read_zones`) the normative model
(:mod:`cxrground.lesions.normative`) flags a zone whose score (75th percentile of its z-map in the zone) is above
the model's threshold.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.anatomy.ctr import cardiothoracic_ratio
from cxrground.anatomy.ils_locations import ils_location_masks
from cxrground.anatomy.segment.base import LungHeartMasks, LungHeartSegmenter
from cxrground.anatomy.segment.builtin import ctr_plausible, work_box
from cxrground.anatomy.segment.plausibility import segment_checked
from cxrground.anatomy.segment.registry import segmenter_settings
from cxrground.datasets.views import is_frontal
from cxrground.errors import BatchStopped, ConfigError, CXRGroundError, Failure, InputError
from cxrground.io.files import atomic_write_text, read_progress, sha256_json
from cxrground.io.film_ledger import resume_record
from cxrground.io.image import (
    DEFAULT_MAX_PIXELS,
    CXRImage,
    as_cxr_image,
    check_out_folder,
    find_images,
    read_image,
    write_image,
)
from cxrground.io.masks import write_mask_png
from cxrground.io.output_lock import locks_output
from cxrground.io.overlay import (
    ANATOMY_COLOUR_NAMES,
    ANATOMY_COLOURS,
    caption_font,
    contact_sheet,
    draw_edges,
    label_panel,
    overlay_masks,
)
from cxrground.io.progress import progress_bar
from cxrground.io.run_folder import check_run_folder
from cxrground.lesions.lesion_zones import LESION_ZONE_READER, LesionZoneReader
from cxrground.lesions.normative import BRIXIA_ZONE_LABELS, NormativeModel, normalise_intensity
from cxrground.lesions.zone_classifier import SHIPPED_ZONE_READER, ZoneClassifier, shipped_zone_reader_path
from cxrground.lesions.zone_features import check_same_normative, feature_columns, normative_hash, zone_feature_matrix
from cxrground.lesions.zone_prior import PRIOR_READERS, ZONE_PRIOR_V3_READER, PriorZoneReader

__all__ = [
    "CSV_COLUMNS",
    "DEFAULT_ZONE_READER",
    "FAILED_OVERLAY_DIR",
    "MASK_DIR",
    "NORMATIVE_READER",
    "OVERLAY_WIDTH",
    "PROGRESS_FILE",
    "QUALITY_COLUMNS",
    "RUN_FILE",
    "ZONE_READER_NAMES",
    "ImplausibleLungsError",
    "ZoneReading",
    "check_out_folder",
    "failed_overlay",
    "failed_overlay_names",
    "film_features",
    "find_images",
    "mask_names",
    "overlay_names",
    "overlay_width",
    "read_zones",
    "reader_name",
    "resolve_zone_reader",
    "segmenter_settings",
    "work_grid_inputs",
    "write_zones",
    "zones_overlay",
    "zones_provenance",
]

ZONES: Final[tuple[str, ...]] = tuple(BRIXIA_ZONE_LABELS)
#: The per-film quality columns of ``zones.csv``, after the reading's: where the heart comes from, whether its CTR is
#: plausible (1/0; blank without a heart), whether the film was read as stored or as its grey-level negative, and the
#: pose reader's warning when the film looks stored mirrored, turned or flipped (blank: upright, or not checked).
QUALITY_COLUMNS: Final[tuple[str, ...]] = ("heart_source", "ctr_plausible", "read_as", "pose_warning")
CSV_COLUMNS: Final[tuple[str, ...]] = ("image", "ctr", *ZONES, *(f"{z}_score" for z in ZONES), "overlay",
                                       *QUALITY_COLUMNS)
#: The reader of the flags without a zone classifier: the normative model's zone score above its threshold.
NORMATIVE_READER: Final[str] = "normative"
#: The zone reader of ``anatomy zones`` and of :func:`read_zones` when none is named.
DEFAULT_ZONE_READER: Final[str] = ZONE_PRIOR_V3_READER
#: The shipped readers' names (:func:`resolve_zone_reader` also takes a ``.npz`` file of ``anatomy fit-zones``).
ZONE_READER_NAMES: Final[tuple[str, ...]] = (*PRIOR_READERS, SHIPPED_ZONE_READER, LESION_ZONE_READER,
                                             NORMATIVE_READER)


@dataclass(frozen=True)
class ZoneReading:
    """One film's reading: CTR (None without a heart), zone scores (z units, or the zone classifier's probability
    when ``reader`` is not :data:`NORMATIVE_READER`) and 0/1 flags."""

    image: str
    ctr: float | None
    scores: dict[str, float]
    flags: dict[str, bool]
    heart_source: str
    reader: str = NORMATIVE_READER
    #: Whether the CTR is plausible (the segmenter's judgement of an estimated heart, else CTR at least
    #: :data:`~cxrground.anatomy.segment.builtin.PLAUSIBLE_CTR_MIN`); None without a heart.
    ctr_plausible: bool | None = None
    #: ``stored``, or ``negative`` when the lung checks read the film's grey-level negative.
    read_as: str = "stored"
    #: The pose reader's warning (``mirrored left-right (p 0.91)``: what would put the film right, and the reader's
    #: probability) when the film as read looks stored in another pose; empty when it reads upright or was not
    #: checked. A warning for a person to look at, not a verdict.
    pose_warning: str = ""

    def csv_row(self) -> dict[str, str]:
        """The row of ``zones.csv`` (without ``overlay``, which the output folder decides)."""
        row = {"image": self.image, "ctr": "" if self.ctr is None else f"{self.ctr:.4f}"}
        row.update({z: str(int(self.flags[z])) for z in ZONES})
        row.update({f"{z}_score": "" if not np.isfinite(self.scores[z]) else f"{self.scores[z]:.3f}" for z in ZONES})
        row.update({"heart_source": self.heart_source,
                    "ctr_plausible": "" if self.ctr_plausible is None else str(int(self.ctr_plausible)),
                    "read_as": self.read_as, "pose_warning": self.pose_warning})
        return row


class ImplausibleLungsError(InputError):
    """The lungs segmented on a film failed the lung checks; carries the film as read and the rejected masks, so that
    a batch can draw them (:func:`failed_overlay`)."""

    def __init__(self, reason: str, path: str | Path | None, image: CXRImage, masks: LungHeartMasks) -> None:
        super().__init__(reason, path)
        self.image = image
        self.masks = masks


ZoneReader = ZoneClassifier | LesionZoneReader | PriorZoneReader
#: Readers whose map is the lesion segmenter's probability (0-1) rather than the normative z-map.
_LESION_MAP_READERS: Final[tuple[type, ...]] = (LesionZoneReader, PriorZoneReader)


def resolve_zone_reader(reader: str | Path | None) -> ZoneReader | None:
    """The zone reader named by ``reader`` (None: :data:`DEFAULT_ZONE_READER`, the reader of ``anatomy zones``):
    :data:`NORMATIVE_READER` → None (the normative threshold flags), ``lesion-unet`` → the lesion segmenter's zone
    reader (:class:`~cxrground.lesions.lesion_zones.LesionZoneReader`), ``zone_prior_v1`` → severity + position
    prior (:class:`~cxrground.lesions.zone_prior.PriorZoneReader`), ``zone_prior_v2`` → the same with the film
    severity of both image readers, ``zone_prior_v3`` → ``zone_prior_v2`` with that severity refitted on the
    shipped lungs, :data:`~cxrground.lesions.zone_classifier.SHIPPED_ZONE_READER` → the simulated-lesion
    classifier, else a ``.npz`` file written by ``anatomy fit-zones`` (or :meth:`ZoneClassifier.save`). Another
    name is a :class:`~cxrground.errors.ConfigError` listing :data:`ZONE_READER_NAMES`."""
    name = DEFAULT_ZONE_READER if reader is None else str(reader)
    if name == NORMATIVE_READER:
        return None
    if name == LESION_ZONE_READER:
        return LesionZoneReader.shipped()
    if name in PRIOR_READERS:
        return PriorZoneReader.named(name)
    if name == SHIPPED_ZONE_READER:
        return ZoneClassifier.load(shipped_zone_reader_path())
    path = Path(name)
    if path.suffix.lower() != ".npz" and not path.exists():
        raise ConfigError(f"unknown zone reader {name!r}; choose one of {', '.join(ZONE_READER_NAMES)}, or give a "
                          ".npz file written by anatomy fit-zones")
    return ZoneClassifier.load(path)


def reader_name(zone_model: ZoneReader | None) -> str:
    """Who flags the zones: :data:`NORMATIVE_READER`, the lesion reader, or ``zone-model <file> (p >= threshold)``."""
    if zone_model is None:
        return NORMATIVE_READER
    if isinstance(zone_model, _LESION_MAP_READERS):
        return zone_model.name()
    name = Path(str(zone_model.meta.get("path", "in-memory"))).name
    return f"zone-model {name} (p >= {zone_model.threshold:.2f})"


def _segment_on_work_grid(image: CXRImage, segmenter: LungHeartSegmenter
                          ) -> tuple[LungHeartMasks, np.ndarray, np.ndarray, np.ndarray]:
    """The film's masks (native size) and its pixels and lungs on the working grid; implausible lungs (one lung
    only, too small, on the wrong sides or shaped unlike any annotated lung:
    :func:`~cxrground.anatomy.segment.plausibility.lung_problems`) are an :class:`ImplausibleLungsError` naming the
    reasons; a blank film (one grey level) is an :class:`~cxrground.errors.InputError` before any segmentation; a
    film whose negative has plausible lungs is read as its negative
    (:func:`~cxrground.anatomy.segment.plausibility.segment_checked`)."""
    image, seg, problems = segment_checked(segmenter, image)
    right, left = seg.right_lung, seg.left_lung
    if problems:
        raise ImplausibleLungsError(f"implausible lungs from the {seg.source} segmenter: {'; '.join(problems)}",
                                    image.path, image, seg)
    box = work_box(image.shape)
    if box is None:
        return seg, image.pixels, right, left
    return seg, box.image_to_canvas(image.pixels), box.mask_to_canvas(right), box.mask_to_canvas(left)


def work_grid_inputs(image: CXRImage, segmenter: LungHeartSegmenter
                     ) -> tuple[LungHeartMasks, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The film's masks (native size) and what a lesion-map reader reads on the working grid: pixels, right lung,
    left lung and heart (None without one), exactly as :func:`read_zones` passes them."""
    seg, px, r_w, l_w = _segment_on_work_grid(image, segmenter)
    box = work_box(image.shape)
    heart = seg.heart if box is None or seg.heart is None else box.mask_to_canvas(seg.heart)
    return seg, px, r_w, l_w, heart


def film_features(image: CXRImage, segmenter: LungHeartSegmenter,
                  model: NormativeModel) -> tuple[np.ndarray, dict[str, float]]:
    """The film's zone feature matrix (:func:`~cxrground.lesions.zone_features.zone_feature_matrix`, rows A–F)
    and its normative zone scores, both on the working grid exactly as :func:`read_zones` reads them."""
    _, px, r_w, l_w = _segment_on_work_grid(image, segmenter)
    z = model.z_map(px, r_w, l_w)
    feats = zone_feature_matrix(px, z, normalise_intensity(px, r_w, l_w), r_w, l_w)
    return feats, model.zone_scores(z, r_w, l_w)


def read_zones(
    image: CXRImage | str | Path | np.ndarray, segmenter: LungHeartSegmenter | str, model: NormativeModel,
    name: str | None = None, zone_model: ZoneReader | str | None = DEFAULT_ZONE_READER,
) -> tuple[ZoneReading, LungHeartMasks, np.ndarray]:
    """The reading of one film, its masks (native size) and its map on the working grid (the z-map; the lesion
    probability for the lesion reader), as ``anatomy zones`` reads it.

    ``image``: a :class:`CXRImage`, a file path or 2-D uint8 pixels; ``segmenter``: a segmenter or its registry
    name; ``zone_model``: a reader or its name (:func:`resolve_zone_reader`; default :data:`DEFAULT_ZONE_READER`,
    as ``anatomy zones``); None: the normative threshold flags (what ``resolve_zone_reader("normative")`` gives).
    Scores are the reader's probabilities (zone shares for the lesion reader, z units for the normative one).
    """
    image = as_cxr_image(image)
    if isinstance(segmenter, str):
        from cxrground.anatomy.segment.registry import get_segmenter

        segmenter = get_segmenter(segmenter)
    if isinstance(zone_model, str | Path):
        zone_model = _named_reader(str(zone_model))
    seg, px, r_w, l_w, heart = work_grid_inputs(image, segmenter)
    right, left = seg.right_lung, seg.left_lung
    if isinstance(zone_model, _LESION_MAP_READERS):
        scores, flags, z = zone_model.read(px, r_w, l_w, heart)
    elif zone_model is None:
        z = model.z_map(px, r_w, l_w)
        scores = model.zone_scores(z, r_w, l_w)
        flags = model.zone_flags(scores)
    else:
        z = model.z_map(px, r_w, l_w)
        feats = zone_feature_matrix(px, z, normalise_intensity(px, r_w, l_w), r_w, l_w)
        prob = zone_model.probability(feats[:, feature_columns(zone_model.feature_names)])
        scores = {k: float(p) for k, p in zip(ZONES, prob, strict=True)}
        flags = {k: bool(p >= zone_model.threshold) for k, p in scores.items()}
    ctr = cardiothoracic_ratio(seg.heart, right, left) if seg.heart is not None and seg.heart.any() else None
    label = name or (Path(image.path).name if image.path else "image")
    reading = ZoneReading(label, None if ctr is None else float(ctr), scores, flags, seg.heart_source,
                          reader_name(zone_model), ctr_plausible(seg, ctr),
                          "negative" if seg.extra.get("polarity") else "stored")
    return reading, seg, z


@functools.lru_cache(maxsize=8)
def _named_reader(name: str) -> ZoneReader | None:
    """:func:`resolve_zone_reader` of ``name``, loaded once per process."""
    return resolve_zone_reader(name)


#: The default panel width of ``anatomy zones`` overlays: the film's own width, at most this many pixels.
OVERLAY_WIDTH: Final[int] = 768


def overlay_width(shape: tuple[int, ...], width: int | None = None) -> int:
    """The width of each overlay panel of a film of ``shape`` (H, W): ``width`` when given, else the film's width up
    to :data:`OVERLAY_WIDTH`."""
    return int(width) if width else min(int(shape[1]), OVERLAY_WIDTH)


def _resized_mask(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``mask`` resized to ``size`` (W, H) by nearest neighbour."""
    from PIL import Image

    if mask.shape[::-1] == size:
        return mask.astype(bool)
    return np.asarray(Image.fromarray(mask.astype(np.uint8) * 255).resize(size, Image.Resampling.NEAREST)) > 127


def _resized(values: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A grey (uint8) or float image resized to ``size`` (W, H), bilinear."""
    from PIL import Image

    if values.shape[::-1] == size:
        return values
    if values.dtype == np.uint8:
        return np.asarray(Image.fromarray(values).resize(size, Image.Resampling.BILINEAR))
    return np.asarray(Image.fromarray(values.astype(np.float32), mode="F").resize(size, Image.Resampling.BILINEAR))


@dataclass(frozen=True)
class _Panel:
    """A film and its anatomy at the overlay's panel size: pixels as read, lungs and heart (the masks read on the
    working grid, resized), the zone bands, line width."""

    pixels: np.ndarray
    right: np.ndarray
    left: np.ndarray
    heart: np.ndarray | None
    bands: dict[str, np.ndarray]
    line: int

    @property
    def size(self) -> tuple[int, int]:
        return self.pixels.shape[1], self.pixels.shape[0]


def _pixels_as_read(image: CXRImage, seg: LungHeartMasks) -> np.ndarray:
    """The film's pixels as its lungs ``seg`` were read: its grey-level negative when the lung checks inverted it."""
    return 255 - image.pixels if seg.extra.get("polarity") else image.pixels


def _panel(image: CXRImage, seg: LungHeartMasks, width: int | None) -> _Panel:
    """The film (its negative when it was read so) and the masks the zones were read on, at the panel size."""
    box = work_box(image.shape)
    pixels = _pixels_as_read(image, seg)
    if box is None:
        r, lft, heart = seg.right_lung, seg.left_lung, seg.heart
    else:
        r, lft = box.mask_to_canvas(seg.right_lung), box.mask_to_canvas(seg.left_lung)
        heart = box.mask_to_canvas(seg.heart) if seg.heart is not None else None
    w = overlay_width(image.shape, width)
    size = (w, max(1, round(image.shape[0] * w / image.shape[1])))
    locations = ils_location_masks(r, lft)
    bands = {k: _resized_mask(locations[BRIXIA_ZONE_LABELS[k]], size) for k in ZONES}
    heart_p = _resized_mask(heart, size) if heart is not None and heart.any() else None
    return _Panel(_resized(pixels, size), _resized_mask(r, size), _resized_mask(lft, size), heart_p, bands,
                  max(1, round(w / 320)))


def _side_colour(zone: str) -> tuple[float, float, float]:
    """The colour of the lung holding ``zone`` (A–C: right, D–F: left)."""
    return ANATOMY_COLOURS["right_lung" if zone in ZONES[:3] else "left_lung"]


def _legend(flagged: bool = True) -> list[tuple[str, tuple[float, float, float]]]:
    """The colour legend of the anatomy panels, as caption runs (each entry in its own colour); ``flagged``: with the
    zones (their letters and the flag colour)."""
    gap = ("   ", (0.8, 0.8, 0.8))
    names = ANATOMY_COLOUR_NAMES
    right, left = (" (A-C)", " (D-F)") if flagged else ("", "")
    runs = [(f"{names['right_lung']}: right lung{right}", ANATOMY_COLOURS["right_lung"]), gap,
            (f"{names['left_lung']}: left lung{left}", ANATOMY_COLOURS["left_lung"]), gap,
            (f"{names['heart']}: heart", ANATOMY_COLOURS["heart"])]
    if flagged:
        runs += [gap, (f"{names['flagged']}: flagged zone", ANATOMY_COLOURS["flagged"])]
    return runs


def _anatomy_rgb(panel: _Panel, flagged: Sequence[str] = (), zones: bool = True) -> np.ndarray:
    """Lungs and heart tinted (flagged zones red) with their outlines; with ``zones``, each zone band outlined in its
    lung's colour and lettered A–F."""
    masks = [panel.right, panel.left] + ([panel.heart] if panel.heart is not None else [])
    colours = [ANATOMY_COLOURS["right_lung"], ANATOMY_COLOURS["left_lung"], ANATOMY_COLOURS["heart"]][: len(masks)]
    rgb = overlay_masks(panel.pixels, masks, colours, alpha=0.2, outline=False)
    if flagged:
        rgb = overlay_masks(rgb, [panel.bands[k] for k in flagged], [ANATOMY_COLOURS["flagged"]] * len(flagged),
                            alpha=0.35, outline=False)
    if zones:
        rgb = draw_edges(rgb, [panel.bands[k] for k in ZONES], [_side_colour(k) for k in ZONES], panel.line)
    else:
        rgb = draw_edges(rgb, [panel.right, panel.left], colours[:2], panel.line)
    if panel.heart is not None:
        rgb = draw_edges(rgb, [panel.heart], [ANATOMY_COLOURS["heart"]], panel.line)
    if zones:
        rgb = _letter_zones(rgb, panel, flagged)
    return rgb


def _letter_zones(rgb: np.ndarray, panel: _Panel, flagged: Sequence[str]) -> np.ndarray:
    """Each zone's letter (``C+`` when flagged) at the centre of its band, white on a dark edge."""
    from PIL import Image, ImageDraw
    from scipy import ndimage

    im = Image.fromarray(rgb)
    draw = ImageDraw.Draw(im)
    font = caption_font(max(14, round(panel.size[0] / 24)))
    for k in ZONES:
        band = panel.bands[k]
        if not band.any():
            continue
        y, x = ndimage.center_of_mass(band)
        text = f"{k}+" if k in flagged else k
        draw.text((float(x), float(y)), text, fill=(255, 255, 255), font=font, anchor="mm",
                  stroke_width=max(1, panel.line), stroke_fill=(0, 0, 0))
    return np.asarray(im)


def zones_overlay(image: CXRImage, seg: LungHeartMasks, z: np.ndarray, reading: ZoneReading,
                  width: int | None = None) -> np.ndarray:
    """Two panels of ``width`` pixels each (default :func:`overlay_width`): the lungs and heart with the six zone bands
    outlined and lettered A–F and the flagged zones tinted red, with a colour legend (and a line when the estimated
    heart's floor is uncertain, ``heart_estimate.floor_warning``); and the reader's map (red = lesion probability, or
    brighter than normal) with the lungs outlined and the heat outside them dimmed. A film read as its negative is
    drawn as read."""
    panel = _panel(image, seg, width)
    flagged = [k for k in ZONES if reading.flags[k]]
    anat = _anatomy_rgb(panel, flagged)
    ctr = "n/a" if reading.ctr is None else f"{reading.ctr:.2f}"
    if reading.ctr_plausible is False:
        ctr += " (implausible)"
    flags = " ".join(f"{k}{'+' if reading.flags[k] else '-'}" for k in ZONES)
    lesion = reading.reader.startswith((LESION_ZONE_READER, *PRIOR_READERS))
    heat = np.clip(_resized(np.asarray(z if lesion else z / 4.0, dtype=np.float32), panel.size), 0.0, 1.0)
    lungs = panel.right | panel.left
    heat = np.where(lungs, heat, 0.25 * heat)  # outside the lungs (stomach gas, soft tissue) is not read as lesion
    grey = np.repeat((panel.pixels.astype(np.float64) / 255.0)[:, :, None], 3, axis=2)
    red = np.stack([np.ones_like(heat), np.zeros_like(heat), np.zeros_like(heat)], axis=2)
    zimg = np.clip(np.rint(255 * (grey * (1 - 0.7 * heat[:, :, None]) + red * 0.7 * heat[:, :, None])), 0, 255)
    zimg = draw_edges(zimg.astype(np.uint8), [panel.right, panel.left],
                      [ANATOMY_COLOURS["right_lung"], ANATOMY_COLOURS["left_lung"]], panel.line)
    normative = reading.reader == NORMATIVE_READER
    scores = " ".join(f"{k} {reading.scores[k]:.1f}" if normative else f"{k} {reading.scores[k]:.2f}" for k in ZONES)
    caption: list[Any] = [f"CTR {ctr} (heart: {reading.heart_source})", f"zones: {flags}", f"flags: {reading.reader}"]
    if seg.heart_source == "estimate" and (seg.extra.get("heart_estimate") or {}).get("floor_warning"):
        caption.append("heart floor uncertain (lung bases far apart): check the heart outline")
    if seg.extra.get("polarity"):
        caption.append("grey levels inverted (read as the film's negative)")
    if reading.pose_warning:
        caption.append(f"pose reader: looks stored in another pose; to put it right: {reading.pose_warning}")
    caption.append(_legend())
    panels = [label_panel(anat, f"{reading.image}", caption),
              label_panel(zimg, "lesion probability (0-1)" if lesion else "deviation from normal (z, 0-4)",
                          [scores if normative else f"{_score_word(reading.reader)} {scores}",
                           "lungs outlined; the map outside them dimmed"])]
    return contact_sheet(panels, columns=2)


def failed_overlay(image: CXRImage, seg: LungHeartMasks, name: str, reason: str, width: int | None = None
                   ) -> np.ndarray:
    """One panel of a film whose lungs failed the lung checks: the rejected lungs and heart (no zones, no flags)
    with the reason as caption."""
    panel = _panel(image, seg, width)
    return label_panel(_anatomy_rgb(panel, zones=False), name,
                       [f"REJECTED, not read: {reason}", _legend(flagged=False)])


def _score_word(reader: str) -> str:
    """What a non-normative reader's zone scores are, for the overlay caption."""
    return "zone share" if reader.startswith(LESION_ZONE_READER) else "p(abnormal)"


def _pose_text(image: CXRImage, seg: LungHeartMasks) -> str:
    """The shipped pose reader's warning for the film as its lungs were read (its negative when the lung checks
    inverted it): ``CORRECTION (p P)``, or empty when it reads upright."""
    from cxrground.anatomy.segment.pose_net import pose_warning

    warning = pose_warning(_pixels_as_read(image, seg))
    return "" if warning is None else f"{warning['correction']} (p {warning['p']:.2f})"


def _raise_if_wrongly_posed(image: CXRImage, seg: LungHeartMasks, segmenter: LungHeartSegmenter, path: Path
                            ) -> None:
    """An :class:`InputError` when the film, as its lungs ``seg`` were read (its negative when the lung checks
    inverted it), looks stored in a wrong pose (upside down, mirrored, turned)."""
    from cxrground.anatomy.segment.orientation import orientation_problem

    problem = orientation_problem(segmenter, dataclasses.replace(image, pixels=_pixels_as_read(image, seg)))
    if problem:
        raise InputError(problem, path)


#: The run record of ``anatomy zones`` in its output folder (settings, inputs; kept after the run).
RUN_FILE: Final[str] = ".zones-run.json"
#: One line per film done (its reading or its failure, with the film's sha256, size and modification time), appended
#: and flushed per film; a resume hashes a film again only when its size or time differ from the recorded ones.
PROGRESS_FILE: Final[str] = ".zones-progress.jsonl"
OVERLAY_DIR: Final[str] = "overlays"
#: The folder under :data:`OVERLAY_DIR` with the overlays of films whose lungs were rejected.
FAILED_OVERLAY_DIR: Final[str] = "_failed"
#: The folder of ``--save-masks`` (:func:`mask_names`) and the masks written per film.
MASK_DIR: Final[str] = "masks"
MASK_PARTS: Final[tuple[str, ...]] = ("right_lung", "left_lung", "heart")
#: The layout of the progress records (a reading's fields); a run recorded with another layout is refused.
PROGRESS_LAYOUT: Final[int] = 3
#: What ``anatomy zones`` writes in its output folder (``--overwrite`` deletes these and nothing else).
_OUTPUTS: Final[tuple[str, ...]] = ("zones.csv", "failures.jsonl", "zones.json", RUN_FILE, PROGRESS_FILE)


def overlay_names(names: Sequence[str]) -> dict[str, str]:
    """The overlay file of each film name (its path relative to the image folder): ``overlays/<name>`` with the
    extension ``.png`` (``sub/x.jpg`` → ``overlays/sub/x.png``); a name that would clash with another's (``img1.jpg``
    beside ``img1.png``, or a file named like another's folder) gets ``.<first 8 hex of sha256(name)>`` before
    ``.png`` (``overlays/img1.0c5e1d2a.png``)."""
    return _unique_names(names, "")


def failed_overlay_names(names: Sequence[str]) -> dict[str, str]:
    """The overlay file of each film name when its lungs are rejected: ``overlays/_failed/<name>.png``, by the rules
    of :func:`overlay_names`; a name that would clash with a read film's overlay (a film under ``_failed/`` in the
    image folder) gets the sha256 suffix."""
    taken = {rel.removeprefix(f"{OVERLAY_DIR}/") for rel in overlay_names(names).values()}
    return _unique_names(names, f"{FAILED_OVERLAY_DIR}/", taken)


def mask_names(names: Sequence[str]) -> dict[str, dict[str, str]]:
    """The mask files of each film name (``--save-masks``): ``masks/<overlay name without .png>_<part>.png`` for the
    parts ``right_lung``, ``left_lung`` and ``heart`` (``sub/x.jpg`` → ``masks/sub/x_right_lung.png``), unique
    because the overlay names are."""
    out: dict[str, dict[str, str]] = {}
    for name, rel in overlay_names(names).items():
        stem = rel.removeprefix(f"{OVERLAY_DIR}/").removesuffix(".png")
        out[name] = {part: f"{MASK_DIR}/{stem}_{part}.png" for part in MASK_PARTS}
    return out


def _unique_names(names: Sequence[str], prefix: str, taken: Iterable[str] = ()) -> dict[str, str]:
    """``overlays/<prefix><name as .png>`` per name, unique (module rules of :func:`overlay_names`), avoiding the
    relative paths ``taken``."""
    out: dict[str, str] = {}
    used: set[str] = set(taken)
    folders: set[str] = {p.as_posix() for t in used for p in Path(t).parents if p.as_posix() != "."}
    for name in names:
        if name in out:
            continue
        stem = Path(name).with_suffix("").as_posix() if Path(name).suffix else name
        rel = f"{prefix}{stem}.png"
        parents = {p.as_posix() for p in Path(rel).parents if p.as_posix() != "."}
        if rel in used or rel in folders or parents & used:
            rel = f"{prefix}{stem}.{hashlib.sha256(name.encode()).hexdigest()[:8]}.png"
            parents = {p.as_posix() for p in Path(rel).parents if p.as_posix() != "."}
        out[name] = f"{OVERLAY_DIR}/{rel}"
        used.add(rel)
        folders |= parents
    return out


def _run_record(names: Sequence[str], model: NormativeModel, zone_model: ZoneReader | None, overlays: bool,
                root: Path | None, views: Mapping[str, str] | None, orientation_check: bool,
                stems: Sequence[str], segmenter: dict[str, Any], width: int | None = None,
                save_masks: bool = False, pose_reader: dict[str, Any] | None = None) -> dict[str, Any]:
    prov = zones_provenance(model, zone_model, 0, 0)
    for k in ("images", "failures"):
        prov.pop(k, None)
    view_of = {s: (views or {}).get(s) for s in stems if (views or {}).get(s)}
    return {"images": str(root.resolve()) if root is not None else None, "films": len(names),
            "films_sha256": sha256_json(list(names)), "reader": json.loads(json.dumps(prov, default=str)),
            "segmenter": segmenter, "overlays": overlays, "orientation_check": orientation_check,
            "views_sha256": sha256_json(view_of), "progress_layout": PROGRESS_LAYOUT,
            "overlay_width": width if overlays else None, "save_masks": save_masks, "pose_reader": pose_reader}


def _written_files(names: Sequence[str]) -> set[str]:
    """Every overlay and mask file a run over the films ``names`` may write (relative to its output folder)."""
    masks = {rel for parts in mask_names(names).values() for rel in parts.values()}
    return {*overlay_names(names).values(), *failed_overlay_names(names).values(), *masks}


def _clear_outputs(out: Path, overlays: Iterable[str] = ()) -> None:
    """Delete what ``anatomy zones`` writes in ``out``: its files, the overlays and masks of the run recorded there
    and ``overlays`` (the files the new run will write), then the overlay and mask folders left empty; nothing
    else."""
    done = read_progress(out / PROGRESS_FILE)
    recorded = {str(r["overlay"]) for r in done.values() if isinstance(r.get("overlay"), str)}
    for rel in {*_written_files(list(done)), *recorded, *overlays}:
        (out / rel).unlink(missing_ok=True)
    for name in _OUTPUTS:
        (out / name).unlink(missing_ok=True)
    for folder in (out / OVERLAY_DIR, out / MASK_DIR):
        if folder.is_dir():
            for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                              reverse=True):
                if not any(sub.iterdir()):
                    sub.rmdir()
            if not any(folder.iterdir()):
                folder.rmdir()


def _check_run(out: Path, record: dict[str, Any], overwrite: bool, overlays: Iterable[str] = ()) -> None:
    """Refuse an output folder holding another run's results (other films, settings or reader) unless
    ``overwrite``; a folder with the same run record resumes. ``overwrite`` deletes the outputs of any earlier run
    (this one's too, and the ``overlays`` it will write), so the films are all read afresh."""

    def older(old: Mapping[str, Any]) -> str | None:
        if old.get("progress_layout") == record["progress_layout"]:
            return None
        return (f"output folder {out} holds an anatomy zones run written by another cxrground version (its progress "
                f"records lack the columns {', '.join(QUALITY_COLUMNS)}); use another --out, or --overwrite to read "
                "its films afresh")

    check_run_folder(out, record, command="anatomy zones", run_file=RUN_FILE,
                     results=("zones.csv", "failures.jsonl", "zones.json", OVERLAY_DIR, MASK_DIR),
                     foreign=("poses.csv", "poses.json", ".poses-run.json", "segment.csv", "segment.json",
                              ".segment-run.json"),
                     out_option="--out", overwrite=overwrite, clear=lambda: _clear_outputs(out, overlays),
                     older=older)


@locks_output("anatomy zones", "out")
def write_zones(
    images: Iterable[Path], out: Path, segmenter: LungHeartSegmenter, model: NormativeModel,
    overlays: bool = True, root: Path | None = None, zone_model: ZoneReader | None = None,
    views: Mapping[str, str] | None = None, orientation_check: bool = False, overwrite: bool = False,
    retry_failed: bool = False, max_pixels: int | None = DEFAULT_MAX_PIXELS, progress: bool = False,
    overlay_width: int | None = None, save_masks: bool = False, pose_check: bool = True,
) -> tuple[list[ZoneReading], list[Failure]]:
    """Read every frontal image, write ``out/zones.csv`` (+ overlays, failures, ``zones.json`` provenance); returns
    readings and failures. An image whose view (its DICOM header, else ``views`` by file-name stem) is not PA or AP
    is a failure, not read; with ``orientation_check``, so is a film that looks stored in a
    wrong pose (:func:`~cxrground.anatomy.segment.orientation.orientation_problem`, after the lung checks).

    ``root``: names in the CSV are paths relative to it (default: the file name); an ``out`` inside it is refused
    (:func:`check_out_folder`). ``zone_model``: flags from
    that classifier; refused (:class:`~cxrground.errors.InputError`) when it was trained with another
    normative model.

    Resumable: each film's reading (or failure) is appended to ``out/.zones-progress.jsonl`` (flushed) as it is
    done, with the film's sha256, size and modification time (a resume reads a film's content again only when its
    size or time differ); ``out/.zones-run.json`` records the run (films, reader, normative model, the lung
    segmenter's settings and weights, other settings). A rerun with the same record skips the films done (a film
    read since is refused, one that failed and changed since is read again; with ``retry_failed`` every film recorded as
    a failure is read again); a folder
    holding another run's results is refused. ``overwrite`` starts afresh: it first deletes what this function
    writes there (``zones.csv``, ``failures.jsonl``, ``zones.json``, ``overlays/``, the two run files), whichever
    run wrote them. ``zones.csv``,
    ``failures.jsonl`` and ``zones.json`` are written atomically at the end, in film order. Overlay names:
    :func:`overlay_names`; a film whose lungs fail the lung checks gets an overlay of the rejected masks
    (:func:`failed_overlay`, named by :func:`failed_overlay_names`) whose path its ``failures.jsonl`` line gives as
    ``overlay``. ``overlay_width``: pixels per overlay panel (default :func:`overlay_width`). ``save_masks``: the
    lung and heart masks of each film read, as 0/255 PNGs at the film's size (:func:`mask_names`). ``max_pixels``:
    films whose header states more pixels are failures, not decoded. ``progress``: a progress bar over the films.
    ``pose_check``: the shipped pose reader reads each film read and its warning goes to the ``pose_warning``
    column and the overlay caption (the reader is recorded in the run record and ``zones.json``).
    """
    if root is not None:
        check_out_folder(out, root)
    if isinstance(zone_model, ZoneClassifier):
        check_same_normative(zone_model, model)
    if isinstance(zone_model, PriorZoneReader):
        check_same_normative(zone_model.classifier, model)
    paths = list(images)
    names = [str(p.relative_to(root).as_posix()) if root is not None else p.name for p in paths]
    settings = segmenter_settings(segmenter)
    pose_reader = None
    if pose_check:
        from cxrground.anatomy.segment.pose_net import pose_reader_record

        pose_reader = {k: v for k, v in pose_reader_record().items() if k in ("name", "sha256")}
    record = _run_record(names, model, zone_model, overlays, root, views, orientation_check,
                         [p.stem for p in paths], settings, overlay_width, save_masks, pose_reader)
    out.mkdir(parents=True, exist_ok=True)
    overlay_of = overlay_names(names)
    failed_of = failed_overlay_names(names)
    masks_of = mask_names(names)
    _check_run(out, record, overwrite, _written_files(names))
    atomic_write_text(out / RUN_FILE, json.dumps(record, indent=1, sort_keys=True) + "\n")
    done = read_progress(out / PROGRESS_FILE)
    readings: list[ZoneReading] = []
    failures: list[Failure] = []
    failure_lines: list[dict[str, Any]] = []
    bar = progress_bar(total=len(paths), desc="zones", unit="film", progress=progress)
    with (out / PROGRESS_FILE).open("a", encoding="utf-8") as log:
        for path, name in zip(paths, names, strict=True):
            bar.update(1)
            rec = done.get(name)
            try:
                digest, stat, rec = resume_record(path, name, rec, log, out=out, kept="reading",
                                                  retry_failed=retry_failed, verb="read")
            except OSError as exc:  # a broken link, a file gone since the folder was listed: looked at on every run
                failures.append(Failure.from_exception(path, "zones", InputError(
                    f"file cannot be read ({exc.strerror or exc})", path)))
                failure_lines.append(failures[-1].to_dict())
                continue
            if rec is not None and "reading" in rec:
                readings.append(ZoneReading(**rec["reading"]))
                continue
            if rec is not None:  # a recorded failure of the same film, kept
                failures.append(Failure(**rec["failure"]))
                failure_lines.append(_failure_line(failures[-1], rec.get("overlay")))
                continue
            try:
                im = read_image(path, max_pixels=max_pixels)
                view = im.view or (views or {}).get(path.stem)
                if view and not is_frontal(view):
                    raise InputError(f"view {view.upper()} is not frontal (PA/AP): zones are read on frontal films",
                                     path)
                reading, seg, z = read_zones(im, segmenter, model, name, zone_model)
                if orientation_check:
                    _raise_if_wrongly_posed(im, seg, segmenter, path)
                if pose_check:
                    reading = dataclasses.replace(reading, pose_warning=_pose_text(im, seg))
            except BatchStopped:  # a library of an extra missing: every film would fail alike
                raise
            except (InputError, CXRGroundError) as exc:
                failure = Failure.from_exception(path, "zones", exc)
                failures.append(failure)
                line = {"image": name, "sha256": digest, **stat, "failure": failure.to_dict()}
                if overlays and isinstance(exc, ImplausibleLungsError):
                    write_image(out / failed_of[name],
                                failed_overlay(exc.image, exc.masks, name, exc.reason, overlay_width))
                    line["overlay"] = failed_of[name]
                failure_lines.append(_failure_line(failure, line.get("overlay")))
            else:
                readings.append(reading)
                if overlays:
                    write_image(out / overlay_of[name], zones_overlay(im, seg, z, reading, overlay_width))
                if save_masks:
                    _write_masks(out, masks_of[name], seg)
                line = {"image": name, "sha256": digest, **stat, "reading": asdict(reading)}
            log.write(json.dumps(line, sort_keys=True) + "\n")
            log.flush()
    bar.close()
    atomic_write_text(out / "zones.csv", _csv_text(readings, overlay_of if overlays else {}))
    atomic_write_text(out / "failures.jsonl", "".join(json.dumps(line) + "\n" for line in failure_lines))
    provenance = {**zones_provenance(model, zone_model, len(readings), len(failures)), "segmenter": settings,
                  "pose_reader": pose_reader}
    atomic_write_text(out / "zones.json", json.dumps(provenance, indent=1) + "\n")
    return readings, failures


def _failure_line(failure: Failure, overlay: str | None) -> dict[str, Any]:
    """The ``failures.jsonl`` line of a failure: its record, and ``overlay`` (the rejected masks drawn) when there is
    one."""
    return {**failure.to_dict(), **({"overlay": overlay} if overlay else {})}


def _write_masks(out: Path, files: Mapping[str, str], seg: LungHeartMasks) -> None:
    """The film's lungs and heart as 0/255 PNGs at its size (no heart: no heart file)."""
    write_mask_png(out / files["right_lung"], seg.right_lung)
    write_mask_png(out / files["left_lung"], seg.left_lung)
    if seg.heart is not None and seg.heart.any():
        write_mask_png(out / files["heart"], seg.heart)


def zones_provenance(model: NormativeModel, zone_model: ZoneReader | None, images: int,
                     failures: int) -> dict[str, Any]:
    """The content of ``zones.json``: which reader produced the flags, what the scores mean, the models."""
    normative = {**model.provenance(), "sha256": normative_hash(model)}
    if isinstance(zone_model, PriorZoneReader):
        severity = "zone_sim_v1" if zone_model.severity is None else "zone_sim_v1 + lesion-unet"
        return {"reader": reader_name(zone_model), "flag": f"probability >= {zone_model.flag:.4g}",
                "score": f"probability that the zone is abnormal: {severity} film severity + position prior + "
                         "within-film zone evidence of zone_sim_v1 and lesion-unet",
                "normative": normative, "zone_model": zone_model.provenance(), "images": images,
                "failures": failures}
    if isinstance(zone_model, LesionZoneReader):
        prov = zone_model.provenance()
        return {"reader": reader_name(zone_model), "flag": f"zone share >= {zone_model.cover:.4g}",
                "score": prov["score"], "normative": None, "zone_model": prov, "images": images,
                "failures": failures}
    if zone_model is None:
        return {"reader": NORMATIVE_READER, "flag": f"zone score > {model.zone_threshold:.4g}",
                "score": "75th percentile of the normative z in the zone", "normative": normative,
                "zone_model": None, "images": images, "failures": failures}
    meta = zone_model.meta
    keep = ("path", "sha256", "method", "reader", "threshold_rule", "l2", "label_source", "cv", "code_version")
    return {"reader": reader_name(zone_model), "flag": f"probability >= {zone_model.threshold:.4g}",
            "score": "zone classifier probability that the zone is abnormal", "normative": normative,
            "zone_model": {k: meta[k] for k in keep if k in meta}, "images": images, "failures": failures}


def _csv_text(readings: Sequence[ZoneReading], overlay_of: Mapping[str, str]) -> str:
    """``zones.csv``: a row per reading, with its overlay's path under the output folder (blank without one)."""
    fh = io.StringIO(newline="")
    writer = csv.DictWriter(fh, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for r in readings:
        writer.writerow({**r.csv_row(), "overlay": overlay_of.get(r.image, "")})
    return fh.getvalue()
