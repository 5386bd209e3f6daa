"""``ils:CHECKPOINT``: an ILS model as a CheXpercept agent, answering every stage from its own mask + geometry.

The grounding-first baseline: the model segments the case's lesion once (global instruction ``Segment the
{lesion}.`` on the case's CXR, the first image of the conversation) and each question is answered from that mask
and the project's geometry, with no language reasoning:

- **detection**: ``Yes`` when the mask has pixels (the model's presence decision), else ``No``;
- **contour evaluation**: the shown mask is read back from the overlay (pixels equal to the §10.1 cyan blend of
  the CXR); a major revision is needed (``Yes``) when IoU(own, shown) < :data:`CONTOUR_IOU`;
- **expansion** / **contraction**: each point's centre is found by its colour in the points image (the
  expansion turn's image; the contraction turn has none); a point is an expansion point when the own mask covers
  most of its disc and the shown mask (from the contour-evaluation overlay) does not, a contraction point in the
  opposite case; none → ``None``;
- **revision result**: the option whose overlay mask has the highest IoU with the own mask;
- **attributes**: the own mask's connected components against the lung geometry of the CXR (lungs from the
  shipped lung U-Net, :func:`cxrground.anatomy.percept_regions.percept_geometry`) through the same overlap
  rules the benchmark builder uses (:mod:`cxrground.anatomy.overlap`): distribution from the positive zones,
  location from the positive sub-regions among the options (none → option 4), severity of the lung the question
  names, comparison of the two lungs.

The lesion is read from the detection question's text (vocabulary names); the client reads the question's
``qid`` and option texts from the runner's side channel, never its ground truth. The mask and the geometry are
computed once per CXR (keyed by the image's digest). Identity: the checkpoint path and its fingerprint
(:func:`~cxrground.models.base.checkpoint_fingerprint`: ``checkpoint.json`` and the weight files' names, sizes
and contents); answers are ``Answer: n`` like the baselines'.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from cxrground.errors import ConfigError, InputError
from cxrground.evaluation.percept.conversation import format_gt
from cxrground.io.overlay import blend
from cxrground.llm import Completion, PermanentError
from cxrground.models.base import checkpoint_fingerprint
from cxrground.vocab import ils_templates as T
from cxrground.vocab import percept_templates as pt
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.locations import SIDES, lung_label

if TYPE_CHECKING:
    from cxrground.anatomy.percept_regions import PerceptGeometry
    from cxrground.evaluation.percept.conversation import Question

__all__ = ["CONTOUR_IOU", "POINT_COVER", "IlsAgentClient", "Reading", "answer_question", "point_centres",
           "shown_mask"]

#: Contour evaluation: a major revision is needed when IoU(own mask, shown mask) is below this.
CONTOUR_IOU: Final[float] = 0.5
#: A point selects when at least this share of its disc is in the own mask and outside the shown one (or vice versa).
POINT_COVER: Final[float] = 0.5
#: Per-channel tolerance (8-bit) when matching the cyan blend and the point colours.
_TOL: Final[int] = 3


@dataclass(frozen=True)
class Reading:
    """What the agent computed for one CXR: its grey pixels, its own mask and the lung geometry (lazy)."""

    grey: np.ndarray
    mask: np.ndarray
    geometry: PerceptGeometry | None


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = int((a | b).sum())
    return 1.0 if union == 0 else int((a & b).sum()) / union


def decode_data_url(url: str) -> np.ndarray:
    """``H×W×3`` uint8 pixels of a ``data:image/...;base64,`` URL."""
    from PIL import Image, UnidentifiedImageError

    head, _, data = url.partition(",")
    if not head.startswith("data:image/") or ";base64" not in head:
        raise PermanentError(f"the ils agent reads data-URL images only, got {head[:40]!r}")
    try:
        with Image.open(io.BytesIO(base64.b64decode(data))) as im:
            return np.asarray(im.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise PermanentError(f"undecodable image in the request ({exc})") from exc


def _user_images(messages: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Image URLs of every user message, in order."""
    out = []
    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("content"), list):
            out.append([p["image_url"]["url"] for p in m["content"] if p.get("type") == "image_url"])
    return out


def shown_mask(overlay: np.ndarray, grey: np.ndarray) -> np.ndarray:
    """The mask shown in a §10.1 cyan overlay of ``grey`` (pixels equal to the blend, within a small tolerance)."""
    if overlay.shape[:2] != grey.shape:
        raise PermanentError(f"overlay {overlay.shape[:2]} and CXR {grey.shape} differ in size")
    cyan = blend(grey, np.ones(grey.shape, bool), pt.MASK_RGB, pt.MASK_ALPHA).astype(np.int16)
    plain = np.repeat(grey[:, :, None], 3, axis=2).astype(np.int16)
    ov = overlay.astype(np.int16)
    return (np.abs(ov - cyan) <= _TOL).all(axis=2) & (np.abs(ov - plain) > _TOL).any(axis=2)


def point_centres(image: np.ndarray, colours: Sequence[str]) -> dict[str, tuple[int, int] | None]:
    """``colour -> (x, y)`` centre of the disc of that colour in a points image (None when not found)."""
    out: dict[str, tuple[int, int] | None] = {}
    img = image.astype(np.int16)
    for colour in colours:
        rgb = np.rint(np.asarray(pt.POINT_RGB[colour]) * 255).astype(np.int16)
        ys, xs = np.nonzero((np.abs(img - rgb) <= _TOL).all(axis=2))
        out[colour] = (int(np.rint(xs.mean())), int(np.rint(ys.mean()))) if len(xs) else None
    return out


def _disc(shape: tuple[int, int], centre: tuple[int, int], radius: float) -> np.ndarray:
    yy, xx = np.ogrid[:shape[0], :shape[1]]
    return (xx - centre[0]) ** 2 + (yy - centre[1]) ** 2 <= radius ** 2


def _points_where(inside: np.ndarray, outside: np.ndarray, centres: dict[str, tuple[int, int] | None],
                  radius: float) -> list[str]:
    """Colours whose disc lies mostly in ``inside & ~outside``."""
    chosen = []
    for colour, c in centres.items():
        if c is None:
            continue
        disc = _disc(inside.shape, c, radius)
        if (inside & ~outside & disc).sum() >= POINT_COVER * max(1, disc.sum()):
            chosen.append(colour)
    return chosen


def _point_answer(q: Question, colours: list[str]) -> tuple[int, ...]:
    idx = tuple(i + 1 for i, o in enumerate(q.options) if o.removesuffix(" point") in colours)
    return idx or (q.options.index(pt.NONE_OPTION) + 1,)


def _records(reading: Reading, lesion: str) -> list[Any]:
    from scipy import ndimage

    from cxrground.anatomy.overlap import component_overlap

    if reading.geometry is None:
        return []
    labels, n = ndimage.label(reading.mask)
    cardio = lesion == "cardiomegaly"
    return [component_overlap(labels == i, reading.geometry, cardiomegaly=cardio) for i in range(1, n + 1)]


def _attribute(q: Question, reading: Reading, lesion: str) -> tuple[int, ...]:
    from cxrground.anatomy.overlap import (
        comparison_answer_index,
        distribution_answer_index,
        positive_subregions,
        positive_zones,
        severity_index,
        severity_ratio,
    )
    from cxrground.anatomy.percept_regions import SUBREGION_NAMES

    records = _records(reading, lesion)
    if q.qid == "distribution":
        return (distribution_answer_index(len(positive_zones(records))),)
    if q.qid == "location":
        positive = {pt.subregion_text(n) for n in positive_subregions(records)}
        known = {pt.subregion_text(n) for n in SUBREGION_NAMES}
        idx = tuple(i + 1 for i, o in enumerate(q.options) if o in known and o in positive)
        return idx or (q.options.index(pt.LOCATION_NONE_OPTION) + 1,)
    if q.qid == "severity":
        side = next((s for s in SIDES if lung_label(s) in q.text), SIDES[0])
        return (severity_index(severity_ratio(records, side)),)
    if q.qid == "comparison":
        return (comparison_answer_index(records),)
    raise PermanentError(f"the ils agent cannot answer question {q.qid!r}")


def answer_question(q: Question, reading: Reading, lesion: str, images: list[list[str]]) -> tuple[int, ...]:
    """The option indices the agent picks for ``q`` (``images``: image URLs of every user message so far)."""
    yes, no = (q.options.index(v) + 1 if v in q.options else 0 for v in pt.YES_NO)
    if q.qid == "detection":
        return (yes if reading.mask.any() else no,)
    if q.qid == "contour_eval":
        shown = shown_mask(decode_data_url(images[-1][0]), reading.grey)
        return (yes if _iou(reading.mask, shown) < CONTOUR_IOU else no,)
    if q.qid in ("expansion", "contraction"):
        from cxrground.percept.render import point_geometry

        shown = shown_mask(decode_data_url(images[1][0]), reading.grey)  # the contour-evaluation overlay
        colours = [o.removesuffix(" point") for o in q.options if o != pt.NONE_OPTION]
        centres = point_centres(decode_data_url(images[2][0]), colours)  # the expansion turn's points image
        radius = point_geometry(reading.grey.shape)[0]
        if q.qid == "expansion":
            return _point_answer(q, _points_where(reading.mask, shown, centres, radius))
        return _point_answer(q, _points_where(shown, reading.mask, centres, radius))
    if q.qid == "revision_result":
        ious = [_iou(reading.mask, shown_mask(decode_data_url(u), reading.grey)) for u in images[-1]]
        return (int(np.argmax(ious)) + 1,)
    return _attribute(q, reading, lesion)


def lesion_of(text: str) -> str:
    """The vocabulary lesion named in a question text (longest name first)."""
    low = text.lower()
    for name in sorted(LESIONS, key=len, reverse=True):
        if name in low:
            return name
    raise PermanentError(f"no lesion named in {text[:80]!r}")


class IlsAgentClient:
    """A loaded ILS checkpoint answering CheXpercept questions (see the module docstring)."""

    kind = "ils"
    max_images = 10**6

    def __init__(self, checkpoint: str | Path, device: str = "cpu", segmenter: Any = None) -> None:
        self.checkpoint = Path(checkpoint)
        meta = self.checkpoint / "checkpoint.json"
        if not meta.is_file():
            raise InputError("not an ILS checkpoint folder (no checkpoint.json)", self.checkpoint)
        self.model = f"ils:{self.checkpoint}"
        self.device = device
        self.decoding: dict[str, Any] = {}
        self._fingerprint = checkpoint_fingerprint(self.checkpoint)
        self._ils: Any = None
        self._segmenter = segmenter
        self._readings: dict[str, Reading] = {}
        self._lock = asyncio.Lock()

    @property
    def identity(self) -> dict[str, Any]:
        """The checkpoint path and its fingerprint (``checkpoint.json`` and the weight files)."""
        return {"kind": self.kind, "checkpoint": str(self.checkpoint.resolve()),
                "checkpoint_fingerprint": self._fingerprint}

    def cache_context(self, question: Question, case_id: str) -> dict[str, Any] | None:
        """None: the answer depends on the messages only."""
        return None

    def _read(self, url: str, lesion: str) -> Reading:
        """Segment ``lesion`` on the CXR of ``url`` and compute its lung geometry (cached per image)."""
        key = hashlib.sha256(f"{lesion}|{url}".encode()).hexdigest()
        if key in self._readings:
            return self._readings[key]
        from cxrground.anatomy.percept_regions import percept_geometry
        from cxrground.io.image import CXRImage

        grey = decode_data_url(url)[:, :, 0].copy()
        image = CXRImage(pixels=grey, source_format="chexpercept-request")
        if self._ils is None:
            from cxrground.models.base import load_model

            self._ils = load_model(self.checkpoint, device=self.device)
        if self._segmenter is None:
            from cxrground.anatomy.segment.registry import get_segmenter

            self._segmenter = get_segmenter("unet", threads=1)
        out = self._ils.predict(image, T.instruction("global", lesion))
        mask = np.asarray(out.mask, bool)
        geometry = None
        if lesion != "cardiomegaly" and mask.any():
            from cxrground.anatomy.segment.base import segment_image

            lungs = segment_image(self._segmenter, image)
            try:
                geometry = percept_geometry(lungs.right_lung, lungs.left_lung)
            except (ValueError, InputError):
                geometry = None  # no usable lungs: attributes fall back to "no overlap"
        reading = Reading(grey, mask, geometry)
        self._readings[key] = reading
        return reading

    async def complete(self, messages: Sequence[dict[str, Any]], question: Question, case_id: str = "",
                       seed: int | None = None) -> Completion:
        """``Answer: n`` for the current question (see the module docstring)."""
        images = _user_images(messages)
        if not images or not images[0]:
            raise PermanentError("the first user message carries no CXR image")
        first = next(m for m in messages if m.get("role") == "user")
        lesion = lesion_of(next(p["text"] for p in first["content"] if p.get("type") == "text"))
        async with self._lock:
            try:
                reading = await asyncio.to_thread(self._read, images[0][0], lesion)
            except ConfigError as exc:
                raise PermanentError(str(exc)) from exc
            answer = await asyncio.to_thread(answer_question, question, reading, lesion, images)
        return Completion(pt.IMPLICIT_ANSWER.format(gt=format_gt(answer)), {}, self.model)

    async def aclose(self) -> None:
        """Drop the loaded model."""
        self._ils = None
        self._readings.clear()
