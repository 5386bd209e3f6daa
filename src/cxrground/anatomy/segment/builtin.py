"""Built-in backends: the shipped lung U-Net (:class:`UNetLungSegmenter`) and given masks
(:class:`GivenMasksSegmenter`, an oracle for tests and for data that comes with masks).

Neither segments the heart from the image: the U-Net's heart is :func:`~.heart.estimate_heart` from its
lungs (``heart_source="estimate"``); given masks use a supplied heart (``"truth"``) or the estimate.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from scipy import ndimage

from cxrground.anatomy.ctr import EmptyAnatomyError, cardiothoracic_ratio
from cxrground.anatomy.percept_regions import largest_component
from cxrground.anatomy.segment.base import HeartSource, LungHeartMasks
from cxrground.anatomy.segment.heart import (
    HEART_METHOD,
    OUTLINE_CALIBRATION,
    HeartEstimateParams,
    estimate_heart,
    floor_warning,
    midline,
)
from cxrground.anatomy.segment.heart_image import (
    SEEN_HEART_METHOD,
    SeenHeartParams,
    cardiac_row_widths,
    radiological_ctr,
    seen_cardiac_borders,
)
from cxrground.anatomy.segment.plausibility import lung_problems
from cxrground.anatomy.segment.tilt import MIN_TILT, thorax_tilt, turn
from cxrground.errors import InputError
from cxrground.extras import missing_extra
from cxrground.io.borders import ContentBox, content_box
from cxrground.io.image import CXRImage, as_cxr_image
from cxrground.io.masks import as_mask, check_shape
from cxrground.io.transform import Letterbox

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "ANATOMY_WORK_SIZE",
    "DEFAULT_WEIGHTS",
    "PLAUSIBLE_CTR_MIN",
    "GivenMasksSegmenter",
    "UNetLungSegmenter",
    "ctr_plausible",
    "default_weights_path",
    "heart_from_lungs",
    "lung_weights",
    "postprocess_lungs",
    "work_box",
]

#: File stem of the shipped weights under ``cxrground/anatomy/segment/weights/``.
DEFAULT_WEIGHTS: Final[str] = "lung_unet_v2"
#: Estimated hearts narrower than this CTR are flagged ``ctr_plausible: False`` in ``extra``: a CTR below
#: 0.3 is rare in adults, so it more likely means the lung masks run over the heart shadow.
PLAUSIBLE_CTR_MIN: Final[float] = 0.30
#: Lung post-processing and the heart estimate run on a grid whose longest side is at most this many
#: pixels; a larger image's masks are mapped back to native pixels exactly (nearest neighbour, see
#: :func:`work_box`). Images up to this size are processed at native size, as before.
ANATOMY_WORK_SIZE: Final[int] = 640


def ctr_plausible(masks: LungHeartMasks, ctr: float | None) -> bool | None:
    """Whether the CTR ``ctr`` of ``masks`` is plausible: the segmenter's judgement of its estimated heart when it
    made one (``extra["heart_estimate"]["ctr_plausible"]``), else CTR at least :data:`PLAUSIBLE_CTR_MIN`; None
    without a CTR."""
    if ctr is None:
        return None
    judged = (masks.extra.get("heart_estimate") or {}).get("ctr_plausible")
    return bool(judged) if isinstance(judged, bool) else bool(ctr >= PLAUSIBLE_CTR_MIN)


def work_box(shape: tuple[int, int], work_size: int = ANATOMY_WORK_SIZE) -> Letterbox | None:
    """The native → working-grid transform for an image of ``shape`` (None: small enough to stay native).

    The grid keeps the aspect ratio, has no padding and a longest side of ``work_size``; a working mask
    maps to native with :meth:`Letterbox.mask_to_native` (each native pixel takes the grid pixel holding its
    centre), so working → native → working gives the working mask back.
    """
    if max(shape) <= work_size:
        return None
    return Letterbox.stretch(shape, Letterbox.fit(shape, work_size).resized_hw)


def default_weights_path() -> Path:
    """Path of the shipped lung U-Net, ``lung_unet_v2.safetensors`` (inside the installed package)."""
    return Path(str(resources.files("cxrground.anatomy.segment") / "weights" / f"{DEFAULT_WEIGHTS}.safetensors"))


def lung_weights(lungs: str | Path) -> Path:
    """A lung U-Net's weights: a shipped one by name (``lung_unet_v1``, ``lung_unet_v2``; the file need not exist),
    or a ``.safetensors`` path as given."""
    text = str(lungs)
    if isinstance(lungs, Path) or text.endswith(".safetensors") or "/" in text or os.sep in text:
        return Path(lungs)
    return default_weights_path().with_name(f"{text}.safetensors")


def postprocess_lungs(
    prob_right: np.ndarray, prob_left: np.ndarray, threshold: float = 0.5, low: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities → exclusive masks: threshold, the larger probability wins where both pass, keep the
    largest 8-connected component per lung, fill holes (a pixel the other lung holds stays there).

    With ``low`` (< ``threshold``): hysteresis. The pixels above ``low`` that are 8-connected to that largest
    component join it (the exclusive assignment is made at ``low``); ``low=None`` or ``low >= threshold`` is the
    plain rule."""
    floor = threshold if low is None or low >= threshold else float(low)
    r = prob_right > floor
    lft = prob_left > floor
    both = r & lft
    r_wins = prob_right >= prob_left
    r &= ~both | r_wins
    lft &= ~both | ~r_wins
    r = ndimage.binary_fill_holes(_grown(r, prob_right > threshold, floor < threshold))
    lft = ndimage.binary_fill_holes(_grown(lft, prob_left > threshold, floor < threshold)) & ~r
    return r, lft


def _grown(candidates: np.ndarray, strong: np.ndarray, hysteresis: bool) -> np.ndarray:
    """The largest 8-connected component of ``candidates & strong``, grown (hysteresis) through the 8-connected
    ``candidates`` that touch it."""
    seed = largest_component(candidates & strong)
    if not hysteresis or not seed.any():
        return seed
    labels, _ = ndimage.label(candidates, structure=np.ones((3, 3), bool))
    keep = np.unique(labels[seed])
    return np.isin(labels, keep[keep > 0])


def heart_from_lungs(
    right: np.ndarray, left: np.ndarray, params: HeartEstimateParams | None = None,
    pixels: np.ndarray | None = None, work_size: int = ANATOMY_WORK_SIZE,
    seen_params: SeenHeartParams | None = None,
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """The heart estimate plus a provenance record (method, CTR, plausibility); None when a lung is empty.

    With ``pixels`` (the image), the cardiac borders seen in the image widen the estimate
    (:mod:`.heart_image`); without, the heart comes from the lungs' medial borders alone. ``seen_params``: how
    the seen rows are found and give the transverse diameter (:class:`~.heart_image.SeenHeartParams`, default
    the 75th-percentile row). Images larger than ``work_size`` are estimated on the working grid and the mask
    mapped back to native pixels.
    """
    info: dict[str, Any] = {"method": HEART_METHOD if pixels is None else f"{HEART_METHOD}+{SEEN_HEART_METHOD}"}
    box = work_box(right.shape, work_size)
    r_w, l_w = (right, left) if box is None else (box.mask_to_canvas(right), box.mask_to_canvas(left))
    px_w = None if pixels is None else (pixels if box is None else box.image_to_canvas(pixels))
    try:
        borders, rctr = None, None
        if px_w is not None:
            rows = cardiac_row_widths(px_w, r_w, l_w, seen_params)
            mid = _mediastinal_midline(r_w, l_w)
            borders, info["seen"] = seen_cardiac_borders(px_w, r_w, l_w, seen_params, rows=rows, midline=mid)
            rctr, info["radiological"] = _radiological(rows, mid, r_w, l_w, params)
        heart = estimate_heart(r_w, l_w, params, seen_borders=borders)
        warning = floor_warning(r_w, l_w)
        if warning is not None:
            info["floor_warning"] = warning
        calibrated = (params or HeartEstimateParams()).outline_calibration
        if px_w is not None and calibrated is not None and heart.any():
            heart, info["outline_calibration"] = _calibrated_outline(heart, r_w, l_w, params, calibrated, borders)
    except EmptyAnatomyError as exc:
        return None, {**info, "error": str(exc)}
    if not heart.any():
        return None, {**info, "error": "the lungs leave no room for a heart between them"}
    if box is not None:
        heart = box.mask_to_native(heart)
    ctr = cardiothoracic_ratio(heart, right, left)
    seen = px_w is not None and info["seen"].get("error") is None
    if rctr is not None:
        info["ctr_radiological"] = round(float(rctr), 4)
    info.update(ctr=round(float(ctr), 4), ctr_plausible=bool(ctr >= PLAUSIBLE_CTR_MIN),
                note="heart width seen in the image (cardiac silhouette), outline estimated" if seen else
                "heart estimated from the lungs' medial borders, not segmented from the image")
    return heart, info


def _calibrated_outline(heart: np.ndarray, right: np.ndarray, left: np.ndarray, params: HeartEstimateParams | None,
                        calibration: tuple[float, float], borders: tuple[float, float] | None
                        ) -> tuple[np.ndarray, dict[str, Any]]:
    """The outline redrawn with the width scale that maps its CTR ``c`` to ``a + b·c`` (``calibration``); the scale
    and both CTRs."""
    a, b = calibration
    drawn = cardiothoracic_ratio(heart, right, left)
    scale = (a + b * drawn) / drawn
    redrawn = estimate_heart(right, left, params, seen_borders=borders, width_scale=scale)
    if not redrawn.any():
        return heart, {"ctr_drawn": round(drawn, 4), "error": "the redrawn outline is empty"}
    return redrawn, {"ctr_drawn": round(drawn, 4), "width_scale": round(scale, 4),
                     "target_ctr": round(a + b * drawn, 4)}


def _mediastinal_midline(right: np.ndarray, left: np.ndarray) -> float | None:
    """:func:`~.heart.midline` over the rows 20-45 % down the lungs (above the heart); None without lungs."""
    lung_rows = np.flatnonzero((right | left).any(axis=1))
    if lung_rows.size == 0:
        return None
    y0, height = int(lung_rows[0]), int(lung_rows[-1] - lung_rows[0])
    return midline(right, left, y0 + round(0.2 * height), y0 + round(0.45 * height))


def _radiological(rows: np.ndarray, mid: float | None, right: np.ndarray, left: np.ndarray,
                  params: HeartEstimateParams | None) -> tuple[float | None, dict[str, Any]]:
    """:func:`~.heart_image.radiological_ctr` about the mediastinal midline ``mid``
    (:func:`_mediastinal_midline`)."""
    if mid is None:
        return None, {"error": "no row holds both lungs above the heart"}
    return radiological_ctr(rows, mid, right, left, (params or HeartEstimateParams()).max_right_share)


class UNetLungSegmenter:
    """The shipped lung U-Net (right/left lungs) with the heart estimated from the lungs.

    ``weights``: a ``.safetensors`` path (its ``.json`` sidecar next to it); None = the shipped
    ``lung_unet_v2``. Loads lazily on the first :meth:`segment`; CPU only; thread-safe loading.
    ``threads``: torch intra-op threads during inference (None: torch's setting; 1 is the safe choice
    on a CPU shared with other busy processes, see :func:`.unet.predict_logits`). ``ctr_calibration``: draw the
    heart outline with :data:`~.heart.OUTLINE_CALIBRATION` (its CTR read in the adult range on NIH films; off by
    default, see ``HeartEstimateParams.outline_calibration``). ``content_box``: read the lungs inside the film's
    exposed field, uniform borders cut (:func:`cxrground.io.borders.content_box`); off by default (the whole film
    is read; ``bench/records/film_borders_preregistration.md``). ``deskew``: read a film whose lungs say it is
    tilted by at least :data:`~.tilt.MIN_TILT` degrees upright and turn its masks back (:func:`deskewed`).
    """

    name = "unet"

    def __init__(
        self,
        weights: str | Path | None = None,
        threshold: float | None = None,
        estimate_heart: bool = True,
        heart_params: HeartEstimateParams | None = None,
        threads: int | None = None,
        seen_heart: bool = True,
        work_size: int = ANATOMY_WORK_SIZE,
        ctr_calibration: bool = False,
        content_box: bool = False,
        deskew: bool = False,
    ) -> None:
        if ctr_calibration:
            heart_params = replace(heart_params or HeartEstimateParams(), outline_calibration=OUTLINE_CALIBRATION)
        self.weights = Path(weights) if weights is not None else default_weights_path()
        self.threads = threads
        self.seen_heart = seen_heart
        self.work_size = int(work_size)
        self.content_box = bool(content_box)
        self.deskew = bool(deskew)
        self._threshold = threshold
        self.estimate_heart = estimate_heart
        self.heart_params = heart_params
        self._model: torch.nn.Module | None = None
        self._meta: dict[str, Any] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_model(cls, model: torch.nn.Module, meta: dict[str, Any], **kwargs: Any) -> UNetLungSegmenter:
        """Wrap an in-memory model (e.g. during training) with its sidecar-like ``meta``."""
        seg = cls(weights=meta.get("path", "<in-memory>"), **kwargs)
        seg._model, seg._meta = model, meta
        return seg

    # --- loading ---------------------------------------------------------------------------------
    def _ensure(self) -> tuple[torch.nn.Module, dict[str, Any]]:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    from cxrground.anatomy.segment.unet import load_model

                    try:
                        model, meta = load_model(self.weights)
                    except ImportError as exc:  # pragma: no cover
                        raise missing_extra(exc, "the U-Net backend") from exc
                    self._meta = meta
                    self._model = model
        assert self._model is not None and self._meta is not None
        return self._model, self._meta

    @property
    def meta(self) -> dict[str, Any]:
        """The model's sidecar (loads the model)."""
        return self._ensure()[1]

    def identity(self) -> dict[str, str]:
        """Name and sha256 of the weights (from the sidecar), as checkpoints and fitted readers record them."""
        meta = self.meta
        return {"name": str(meta.get("name")), "sha256": str(meta.get("sha256"))}

    @property
    def threshold(self) -> float:
        """Probability threshold (argument, else the sidecar's, else 0.5)."""
        if self._threshold is not None:
            return float(self._threshold)
        return float(self._meta.get("threshold", 0.5)) if self._meta else 0.5

    # --- inference -------------------------------------------------------------------------------
    def probabilities(
        self, image: CXRImage, size_hw: tuple[int, int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """Right- and left-lung probabilities at native size (or on a ``size_hw`` grid), the letterbox record and,
        when borders were cut, the content box (``[top, bottom, left, right]`` pixels of the film)."""
        from cxrground.anatomy.segment.unet import predict_logits, prepare_input

        model, meta = self._ensure()
        size = int(meta["input"]["size"])
        field = content_box(image.pixels) if self.content_box else ContentBox(image.shape)
        canvas, box = prepare_input(field.crop(image.pixels), size)
        logits = predict_logits(model, canvas[None], threads=self.threads)[0]
        classes = list(meta.get("classes", ["right_lung", "left_lung"]))
        grid = field if size_hw is None else field.on_grid(tuple(size_hw))
        inner = (grid.shape[0] - grid.top - grid.bottom, grid.shape[1] - grid.left - grid.right)
        to = Letterbox(inner, box.canvas_hw, box.resized_hw, box.offset_yx)
        out = []
        for name in ("right_lung", "left_lung"):
            native = to.logits_to_native(logits[classes.index(name)])
            out.append(grid.place(1.0 / (1.0 + np.exp(-np.clip(native, -60.0, 60.0)))))
        extra: dict[str, Any] = {"letterbox": box.to_dict()}
        if not field.empty:
            extra["content_box"] = field.to_list()
        return out[0], out[1], extra

    def segment(self, image: CXRImage) -> LungHeartMasks:
        """Right/left lungs from the U-Net at native size; the heart estimated from them and the image.

        Post-processing and the heart run on the working grid (:func:`work_box`) and are mapped back. With
        ``deskew``, a tilted film is read upright (:func:`deskewed`). ``image`` may also be a file path or 2-D uint8
        pixels (:func:`~cxrground.io.image.as_cxr_image`).
        """
        image = as_cxr_image(image)
        masks = self._segment_as_stored(image)
        return deskewed(self, image, masks) if self.deskew else masks

    def _segment_as_stored(self, image: CXRImage) -> LungHeartMasks:
        """:meth:`segment` without the tilt check."""
        box = work_box(image.shape, self.work_size)
        p_r, p_l, extra = self.probabilities(image, None if box is None else box.canvas_hw)
        right, left = postprocess_lungs(p_r, p_l, self.threshold)
        pixels = image.pixels if box is None else box.image_to_canvas(image.pixels)
        heart: np.ndarray | None = None
        source: HeartSource = "none"
        if self.estimate_heart:
            heart, info = heart_from_lungs(right, left, self.heart_params, pixels if self.seen_heart else None)
            extra["heart_estimate"] = info
            source = "estimate" if heart is not None else "none"
        if box is not None:
            right, left = box.mask_to_native(right), box.mask_to_native(left)
            heart = box.mask_to_native(heart) if heart is not None else None
            extra["work_letterbox"] = box.to_dict()
            if heart is not None:  # the CTR of the native masks (the same up to the grid's rounding)
                extra["heart_estimate"]["ctr"] = round(float(cardiothoracic_ratio(heart, right, left)), 4)
        extra["weights_sha256"] = self._meta.get("sha256") if self._meta else None
        return LungHeartMasks(right, left, heart, source, self.name, extra)

    def _calibration(self) -> tuple[float, float] | None:
        """The heart outline's CTR calibration, when on."""
        return self.heart_params.outline_calibration if self.heart_params is not None else None

    def provenance(self) -> dict[str, Any]:
        """Backend, weights path and sha256, architecture, training data summary and metrics."""
        _, meta = self._ensure()
        return {
            "backend": self.name,
            "weights": str(self.weights),
            "weights_sha256": meta.get("sha256"),
            "model_name": meta.get("name"),
            "format": meta.get("format"),
            "architecture": meta.get("architecture"),
            "input": meta.get("input"),
            "normalisation": meta.get("normalisation"),
            "threshold": self.threshold,
            "postprocess": "exclusive argmax where both > threshold, largest 8-component per lung, holes filled",
            "heart": {"source": "estimate" if self.estimate_heart else "none",
                      "method": f"{HEART_METHOD}+{SEEN_HEART_METHOD}" if self.seen_heart else HEART_METHOD,
                      **({"outline_calibration": list(calibration)} if (calibration := self._calibration()) else {})},
            "work_size": self.work_size,
            "content_box": "uniform borders cut (cxrground.io.borders)" if self.content_box else "whole film",
            "deskew": (f"films tilted >= {MIN_TILT:g} degrees read upright (cxrground.anatomy.segment.tilt)"
                       if self.deskew else "off"),
            "metrics": meta.get("metrics"),
            "training_data": (meta.get("data") or {}).get("summary"),
        }


def deskewed(seg: UNetLungSegmenter, image: CXRImage, masks: LungHeartMasks) -> LungHeartMasks:
    """``masks`` (the film read as stored), or the film read upright when its lungs say it is tilted.

    When :func:`~.tilt.thorax_tilt` of the lungs is at least :data:`~.tilt.MIN_TILT` in size, the film is turned
    upright on the working grid, read again (lungs and heart outline) and the masks are turned back; the upright
    reading is kept when its lungs are plausible (judged upright, as read) or the stored reading's were not.
    ``extra["tilt"]`` records the angle (None: no tilt could be estimated), ``extra["tilt_kept"]`` whether the
    upright reading was kept (:func:`~.plausibility.reading_problems` then judges its lungs upright)."""
    tilt = thorax_tilt(masks.right_lung, masks.left_lung) if masks.right_lung.any() and masks.left_lung.any() else None
    masks.extra["tilt"] = tilt
    if tilt is None or abs(tilt) < MIN_TILT:
        return masks
    box = work_box(image.shape, seg.work_size)
    pixels = image.pixels if box is None else box.image_to_canvas(image.pixels)
    upright = seg._segment_as_stored(replace(image, pixels=turn(pixels, tilt)))
    if lung_problems(upright.right_lung, upright.left_lung) and not lung_problems(masks.right_lung, masks.left_lung):
        # each judged as read: the upright reading upright, the stored one as stored
        masks.extra["tilt_kept"] = False
        return masks
    right, left = postprocess_lungs(turn(upright.right_lung, -tilt, mask=True).astype(np.float32),
                                    turn(upright.left_lung, -tilt, mask=True).astype(np.float32))
    heart = turn(upright.heart, -tilt, mask=True) if upright.heart is not None else None
    if box is not None:
        right, left = box.mask_to_native(right), box.mask_to_native(left)
        heart = box.mask_to_native(heart) if heart is not None else None
    extra = {**upright.extra, "tilt": tilt, "tilt_kept": True}
    if box is not None:
        extra["work_letterbox"] = box.to_dict()
    if heart is not None and not heart.any():
        heart = None
    if heart is not None and "heart_estimate" in extra:
        extra["heart_estimate"] = {**extra["heart_estimate"], "ctr_upright": extra["heart_estimate"].get("ctr"),
                                   "ctr": round(float(cardiothoracic_ratio(heart, right, left)), 4)}
    source: HeartSource = upright.heart_source if heart is not None else "none"
    return LungHeartMasks(right, left, heart, source, upright.source, extra)


MaskTriple = tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, np.ndarray | None]
Provider = Callable[[CXRImage], "LungHeartMasks | MaskTriple | Mapping[str, Any]"]


class GivenMasksSegmenter:
    """Masks supplied per image (synthetic truth, the pack's lung masks, another tool's output).

    ``masks``: a mapping from an image key to the masks, or a callable ``image -> masks``. The key is
    :attr:`CXRImage.path` (also tried resolved, and by file name); masks are ``(right, left)``,
    ``(right, left, heart)``, a mapping with ``right_lung``/``left_lung``/``heart`` keys, or a
    :class:`LungHeartMasks`. A supplied heart gives ``heart_source="truth"``; otherwise the heart is
    estimated from the lungs (``"estimate"``) unless ``estimate_heart=False`` (``"none"``).
    """

    name = "given"

    def __init__(
        self,
        masks: Mapping[str, Any] | Provider,
        estimate_heart: bool = True,
        label: str = "given",
        heart_params: HeartEstimateParams | None = None,
        seen_heart: bool = True,
    ) -> None:
        self._masks = masks
        self.seen_heart = seen_heart
        self.estimate_heart = estimate_heart
        self.label = label
        self.heart_params = heart_params

    @classmethod
    def from_arrays(
        cls, right: np.ndarray, left: np.ndarray, heart: np.ndarray | None = None, **kwargs: Any
    ) -> GivenMasksSegmenter:
        """The same masks for every image (which must have their shape)."""
        return cls(lambda _image: (right, left, heart), **kwargs)

    def _lookup(self, image: CXRImage) -> Any:
        if callable(self._masks):
            return self._masks(image)
        if image.path is None:
            raise InputError("GivenMasksSegmenter needs image.path to look masks up (the image has no path)")
        keys = [image.path, str(Path(image.path).resolve()), Path(image.path).name]
        for key in keys:
            if key in self._masks:
                return self._masks[key]
        raise InputError("no masks were given for this image", image.path)

    def segment(self, image: CXRImage) -> LungHeartMasks:
        """The supplied masks, checked against the image's shape."""
        got = self._lookup(image)
        if isinstance(got, LungHeartMasks):
            right, left, heart = got.right_lung, got.left_lung, got.heart
        elif isinstance(got, Mapping):
            right, left, heart = got["right_lung"], got["left_lung"], got.get("heart")
        else:
            seq = tuple(got)
            if len(seq) not in (2, 3):
                raise InputError(f"given masks must be (right, left[, heart]), got {len(seq)} items", image.path)
            right, left = seq[0], seq[1]
            heart = seq[2] if len(seq) == 3 else None
        right = check_shape(as_mask(right, "right lung mask"), image.shape, "right lung mask", image.path)
        left = check_shape(as_mask(left, "left lung mask"), image.shape, "left lung mask", image.path)
        extra: dict[str, Any] = {"label": self.label}
        source: HeartSource = "none"
        if heart is not None:
            heart = check_shape(as_mask(heart, "heart mask"), image.shape, "heart mask", image.path)
            source = "truth"
        elif self.estimate_heart:
            heart, info = heart_from_lungs(right, left, self.heart_params, image.pixels if self.seen_heart else None)
            extra["heart_estimate"] = info
            source = "estimate" if heart is not None else "none"
        return LungHeartMasks(right, left, heart, source, f"{self.name}:{self.label}", extra)

    def provenance(self) -> dict[str, Any]:
        """Backend name and label (the masks' origin is the caller's to record)."""
        method = f"{HEART_METHOD}+{SEEN_HEART_METHOD}" if self.seen_heart else HEART_METHOD
        return {"backend": self.name, "label": self.label, "estimate_heart": self.estimate_heart,
                "heart_method": method if self.estimate_heart else None}
