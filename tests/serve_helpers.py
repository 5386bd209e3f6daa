"""A deterministic ILS test double and image builders shared by the ``test_serve_*`` files."""

from __future__ import annotations

import base64
import io
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from cxrground.io.image import CXRImage
from cxrground.models.base import IlsOutput
from cxrground.vocab import ils_templates
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.locations import ILS_LOCATION_LABELS

#: Pixels at or above this grey value are "the lesion" for the test double.
BRIGHT = 200


def parse(instruction: str) -> tuple[str, str, list[str]]:
    """(kind, target, locations) of a rendered ILS instruction (by re-rendering the vocab templates)."""
    low = instruction.lower()
    locations = [label for label in sorted(ILS_LOCATION_LABELS, key=len, reverse=True) if label in low]
    locations = [label for label in locations if not any(label != o and label in o for o in locations)]
    locations = sorted(locations, key=low.index)
    target = next((lesion for lesion in LESIONS if lesion in low), ils_templates.TENTATIVE_WORD)
    if locations and instruction == ils_templates.instruction("lesion_inference", target, locations):
        return "lesion_inference", target, locations
    if instruction == ils_templates.instruction("global", target):
        return "global", target, []
    return "basic", target, locations or ["right lung"]


@dataclass
class ThresholdModel:
    """Segments the pixels ``>= BRIGHT``; answers through the vocab templates; checks it is never re-entered."""

    name: str = "threshold-test"
    delay: float = 0.0
    calls: int = 0
    active: int = 0
    max_active: int = 0
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def predict(self, image: CXRImage, instruction: str) -> IlsOutput:
        with self._guard:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.calls += 1
        try:
            if self.delay:
                time.sleep(self.delay)  # widens the window in which overlapping calls would be seen
            return expected_output(image.pixels, instruction)
        finally:
            with self._guard:
                self.active -= 1

    def predict_batch(self, images: list[CXRImage], instructions: list[str]) -> list[IlsOutput]:
        return [self.predict(im, text) for im, text in zip(images, instructions, strict=True)]


def expected_output(pixels: np.ndarray, instruction: str) -> IlsOutput:
    """What :class:`ThresholdModel` answers for ``pixels`` and ``instruction``."""
    kind, target, locations = parse(instruction)
    mask = pixels >= BRIGHT
    present = bool(mask.any())
    if present and kind == "global":
        cols = np.flatnonzero(mask.any(axis=0))
        locations = ["right lung" if cols.mean() < pixels.shape[1] / 2 else "left lung"]
    if present:
        answer = ils_templates.positive_answer(kind, target, locations, "definitive")
    else:
        answer = ils_templates.negative_answer(kind, target, locations)
        mask = np.zeros_like(mask)
    return IlsOutput(answer=answer, mask=mask, presence=0.9 if present else 0.1, present=present,
                     lesion=target, locations=locations, kind=kind,
                     certainty="definitive" if kind == "lesion_inference" and present else None)


def cxr_pixels(h: int = 50, w: int = 70) -> np.ndarray:
    """A grey gradient (never ``>= BRIGHT``) with a bright block in the image's left half (patient's right)."""
    rows = np.linspace(40, 150, h)[:, None]
    cols = np.linspace(0, 30, w)[None, :]
    px = np.rint(rows + cols).astype(np.uint8)
    px[10:30, 5:25] = 230
    return px


def png_bytes(pixels: np.ndarray) -> bytes:
    """PNG file bytes of a uint8 or uint16 grey array (or RGB)."""
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    """``data:<mime>;base64,...``."""
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def decode_png_b64(text: str) -> np.ndarray:
    """Array of a base64 PNG."""
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(text))))
