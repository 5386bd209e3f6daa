"""Inference with the LISA model: free generation (:class:`LisaPredictor`, the :class:`IlsModel` of this backend)
and teacher-forced segmentation (:func:`teacher_forced_masks`), both at the image's native size.

Free generation (ILS.md §17.5): greedy, one beam, ``max_new_tokens`` (512); the answer is the decoded text after
``ASSISTANT:`` up to ``</s>``; the mask comes from the hidden state that predicted the first generated
``[SEG]``; **no ``[SEG]`` generated → an all-empty mask** (and ``extra["seg_generated"] = False``).
``presence`` is 1.0 when the mask has pixels, else 0.0 (the model has no calibrated probability);
``present`` is the same decision. ``lesion``/``locations``/``kind`` are parsed from the instruction with the
vocabulary (:func:`~cxrground.vocab.ils_templates.parse_instruction`; the target as written, e.g. ``opacity``);
for lesion-inference answers ``lesion`` and ``certainty`` are read from the generated sentence when it follows a
template.

Teacher-forced segmentation: the mask from the ``[SEG]`` of the ground-truth answer (the reference evaluation
protocol for segmentation metrics). :meth:`LisaPredictor.predict_teacher_forced` (``ils predict --mode
teacher-forced``) gives that mask with the freely generated answer text (text accuracy is always free
generation, ILS.md §15.2), so one predictions file serves both metrics.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cxrground.io.image import CXRImage
from cxrground.models.base import IlsOutput
from cxrground.models.lisa.config import LisaConfig
from cxrground.models.lisa.model import LisaForSegmentation
from cxrground.models.lisa.preprocess import clip_pixels, logits_to_native, sam_pixels
from cxrground.models.lisa.text import Encoded, answer_text, encode
from cxrground.vocab import ils_templates as T
from cxrground.vocab.lesions import LESION_INFERENCE_LESIONS

__all__ = ["LisaPredictor", "load_model", "model_inputs", "teacher_forced_masks"]

_LI_ANSWERS = tuple(
    (re.compile("^" + re.escape(template).replace(re.escape("{lesion}"), "(?P<lesion>[a-z ]+)") + "$"), cert)
    for template, cert in ((T.LESION_INFERENCE_DEFINITIVE, "definitive"), (T.LESION_INFERENCE_TENTATIVE, "tentative"))
)


def model_inputs(model: LisaForSegmentation, config: LisaConfig, grey: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, Any]:
    """CLIP pixels, SAM pixels and the SAM frame of one 8-bit image."""
    sam, box = sam_pixels(grey, model.sam_size)
    return clip_pixels(grey, model.clip_size, config.clip_mode), sam, box


def _max_text(model: LisaForSegmentation, config: LisaConfig) -> int:
    return config.max_length - (model.n_image_tokens - 1)


def teacher_forced_masks(model: LisaForSegmentation, tokenizer: Any, config: LisaConfig,
                         items: Sequence[tuple[np.ndarray, str, str]], device: str = "cpu") -> list[np.ndarray]:
    """Native-size bool masks for ``(grey image, instruction, ground-truth answer)`` items (one batch)."""
    enc, clips, sams, boxes = [], [], [], []
    for grey, instruction, answer in items:
        c, s, box = model_inputs(model, config, grey)
        enc.append(encode(tokenizer, instruction, answer, _max_text(model, config)))
        clips.append(c)
        sams.append(s)
        boxes.append(box)
    low = model.teacher_forced_low_res(enc, torch.as_tensor(np.stack(clips), device=device),
                                       torch.as_tensor(np.stack(sams), device=device))
    return [logits_to_native(lr.float().cpu().numpy(), box) > 0 for lr, box in zip(low, boxes, strict=True)]


class LisaPredictor:
    """A loaded LISA checkpoint answering ILS instructions (see the module docstring)."""

    name = "lisa"

    def __init__(self, model: LisaForSegmentation, tokenizer: Any, config: LisaConfig, device: str = "cpu",
                 info: dict[str, Any] | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = config
        self.device = device
        self.info = dict(info or {})

    def _encode(self, instruction: str) -> Encoded:
        return encode(self.tokenizer, instruction, None, _max_text(self.model, self.config))

    def predict(self, image: CXRImage, instruction: str) -> IlsOutput:
        """Free generation on one image; the mask has the image's native ``H×W``."""
        c, s, box = model_inputs(self.model, self.config, image.pixels)
        ids, low = self.model.generate(
            self._encode(instruction), torch.as_tensor(c[None], device=self.device),
            torch.as_tensor(s[None], device=self.device), max_new_tokens=self.config.max_new_tokens,
            eos_token_id=int(self.tokenizer.eos_token_id), pad_token_id=int(self.tokenizer.pad_token_id))
        answer = answer_text(self.tokenizer, ids)
        if low is None:
            mask = np.zeros(image.shape, dtype=bool)
        else:
            mask = logits_to_native(low.float().cpu().numpy(), box) > 0
        present = bool(mask.any())
        parsed = T.parse_instruction(instruction)
        lesion, certainty = (parsed.target if parsed else None), None
        if parsed is not None and parsed.kind == "lesion_inference":
            for pattern, cert in _LI_ANSWERS:
                m = pattern.match(answer)
                if m and m.group("lesion") in LESION_INFERENCE_LESIONS:
                    lesion, certainty = m.group("lesion"), cert
        return IlsOutput(answer=answer, mask=mask, presence=1.0 if present else 0.0, present=present,
                         lesion=lesion, locations=list(parsed.locations) if parsed else [],
                         kind=parsed.kind if parsed else None, certainty=certainty,
                         extra={"seg_generated": low is not None, "generated_tokens": len(ids)})

    def predict_teacher_forced(self, images: list[CXRImage], instructions: list[str],
                               answers: list[str]) -> list[IlsOutput]:
        """Masks from the ``[SEG]`` of the ground-truth ``answers`` (one batch), text from free generation."""
        if not len(images) == len(instructions) == len(answers):
            raise ValueError(f"{len(images)} images, {len(instructions)} instructions, {len(answers)} answers")
        masks = teacher_forced_masks(self.model, self.tokenizer, self.config,
                                     [(im.pixels, ins, ans) for im, ins, ans in zip(images, instructions, answers,
                                                                                    strict=True)], self.device)
        out = []
        for image, instruction, mask in zip(images, instructions, masks, strict=True):
            free = self.predict(image, instruction)
            present = bool(mask.any())
            out.append(dataclasses.replace(free, mask=mask, present=present, presence=float(present),
                                           extra={**free.extra, "seg_mode": "teacher-forced"}))
        return out

    def predict_batch(self, images: list[CXRImage], instructions: list[str]) -> list[IlsOutput]:
        """One :meth:`predict` per pair (greedy decoding of right-padded batches would differ)."""
        if len(images) != len(instructions):
            raise ValueError(f"{len(images)} images but {len(instructions)} instructions")
        return [self.predict(im, ins) for im, ins in zip(images, instructions, strict=True)]


def load_model(checkpoint_dir: Path, device: str = "cpu", quantize: str = "none",
               device_map: str | dict[str, Any] | None = None) -> LisaPredictor:
    """Load a LISA checkpoint folder (trained or converted) as an :class:`IlsModel`.

    ``quantize`` (``8bit``/``4bit``, bitsandbytes) and ``device_map`` (``auto`` or ``{prefix: device}``) are the
    large-checkpoint options of :mod:`.loading`; options this machine cannot honour are a :class:`ConfigError`.
    """
    from cxrground.models.lisa.checkpoint import load_checkpoint
    from cxrground.models.lisa.loading import check_loading, dispatch, parse_device_map, quantize_language_model

    device_map = parse_device_map(device_map)
    check_loading(device, quantize, device_map)
    gpu = device.startswith("cuda") or (device_map is not None and torch.cuda.is_available())
    dtype = torch.bfloat16 if gpu else torch.float32
    model, tok, info = load_checkpoint(Path(checkpoint_dir), device="cpu", dtype=dtype)
    replaced = quantize_language_model(model, quantize, dtype)
    if device_map is not None:
        used = dispatch(model, device_map, dtype)
        device = str(next(iter(used.values()))) if used else "cpu"
        device = f"cuda:{device}" if device.isdigit() else device
    else:
        model.to(device)
    config = LisaConfig.from_overrides(info.get("config") or {})
    info = {**info, "loading": {"quantize": quantize, "quantized_layers": len(replaced),
                                "device_map": device_map, "device": device}}
    return LisaPredictor(model, tok, config, device=device, info=info)
