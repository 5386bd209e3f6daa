"""The trained baseline as an :class:`~cxrground.models.base.IlsModel`.

Inference rule (per pair): the image is prepared as in training (:func:`.data.prepare_image`), the network
gives mask logits on the canvas, a presence probability and the heads' outputs.

- ``presence < 0.5`` → the lesion is absent: the mask is empty and the answer is the negative template of the
  instruction's type (:func:`~cxrground.vocab.ils_templates.negative_answer`, target and location as written).
- otherwise the canvas logits are mapped to the native ``H×W`` with
  :meth:`~cxrground.io.transform.Letterbox.logits_to_native` (un-padded region, bilinear) and thresholded at 0
  (the mask may still be empty); the answer is the positive template: ``[SEG]`` for basic; for global the
  location labels whose head probability is ≥ 0.5 in vocabulary order (the most probable one when none is;
  ``[SEG]`` alone for cardiomegaly); for lesion inference the argmax lesion and certainty.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from cxrground.errors import ConfigError, InputError
from cxrground.io.image import CXRImage
from cxrground.models.base import CHECKPOINT_FILE, IlsOutput
from cxrground.models.baseline.conditioning import CERTAINTIES, LI_LESIONS, encode, parse, render_answer
from cxrground.models.baseline.config import BaselineConfig
from cxrground.models.baseline.data import WorkingImage, make_segmenter, prepare_image
from cxrground.models.baseline.net import build_net
from cxrground.models.baseline.training import BEST_WEIGHTS, LAST_WEIGHTS, MODEL_NAME
from cxrground.vocab.ils_templates import TENTATIVE_WORD
from cxrground.vocab.locations import ILS_LOCATION_LABELS

__all__ = ["PRESENCE_THRESHOLD", "BaselineModel", "load_model"]

#: Presence probability below which the answer is negative and the mask empty.
PRESENCE_THRESHOLD = 0.5


class BaselineModel:
    """Loaded baseline; ``predict_batch`` runs one forward pass over the pairs."""

    name = MODEL_NAME

    def __init__(self, config: BaselineConfig, state: dict[str, torch.Tensor], device: str = "cpu",
                 info: dict | None = None) -> None:
        self.config = config
        self.device = torch.device(device)
        self.info = info or {}
        self.net = build_net(config)
        self.net.load_state_dict(state)
        self.net.to(self.device).eval()
        self.segmenter = make_segmenter(config)

    def prepare(self, image: CXRImage) -> WorkingImage:
        """The image on the working canvas with its anatomy planes."""
        return prepare_image(image.pixels, self.config, self.segmenter)

    def predict(self, image: CXRImage, instruction: str) -> IlsOutput:
        """Answer one instruction on one image (mask at the image's native size)."""
        return self.predict_batch([image], [instruction])[0]

    @torch.no_grad()
    def predict_batch(self, images: list[CXRImage], instructions: list[str]) -> list[IlsOutput]:
        """Answer several (image, instruction) pairs; an image object repeated in ``images`` is prepared once."""
        if len(images) != len(instructions):
            raise InputError(f"{len(images)} images but {len(instructions)} instructions")
        if not images:
            return []
        parsed = [parse(text) for text in instructions]
        prepared: dict[int, WorkingImage] = {}
        for im in images:
            if id(im) not in prepared:
                prepared[id(im)] = self.prepare(im)
        work = [prepared[id(im)] for im in images]
        out = self.net(
            torch.from_numpy(np.stack([w.image for w in work])[:, None]).to(self.device),
            torch.from_numpy(np.stack([w.anatomy for w in work]).astype(np.float32)).to(self.device),
            torch.from_numpy(np.stack([encode(p) for p in parsed])).to(self.device),
        )
        presence = out["presence"].sigmoid().cpu().numpy()
        logits = out["mask"].cpu().numpy()
        lesion = out["lesion"].argmax(1).cpu().numpy()
        certainty = out["certainty"].argmax(1).cpu().numpy()
        loc_prob = out["location"].sigmoid().cpu().numpy()
        results = []
        for i, (p, w) in enumerate(zip(parsed, work, strict=True)):
            present = bool(presence[i] >= PRESENCE_THRESHOLD)
            mask = (w.box.logits_to_native(logits[i]) > 0) if present else np.zeros(w.box.src_hw, dtype=bool)
            locs = [lab for lab, q in zip(ILS_LOCATION_LABELS, loc_prob[i], strict=True) if q >= 0.5]
            locs = locs or [ILS_LOCATION_LABELS[int(loc_prob[i].argmax())]]
            li_lesion, cert = LI_LESIONS[int(lesion[i])], CERTAINTIES[int(certainty[i])]
            is_li = p.kind == "lesion_inference"
            results.append(IlsOutput(
                answer=render_answer(p, present, li_lesion, cert, locs),
                mask=mask,
                presence=float(presence[i]),
                present=present,
                lesion=(li_lesion if present else TENTATIVE_WORD) if is_li else p.target,
                locations=locs if (p.kind == "global" and present and p.target != "cardiomegaly") else p.locations,
                kind=p.kind,
                certainty=cert if (is_li and present) else None,
                extra={"instruction_target": p.target,
                       "location_probabilities": dict(zip(ILS_LOCATION_LABELS, map(float, loc_prob[i]), strict=True))},
            ))
        return results


def load_model(checkpoint_dir: Path, device: str = "cpu", weights: str = "best") -> BaselineModel:
    """Load a baseline checkpoint folder; ``weights`` ``best`` (selected, default) or ``last``."""
    folder = Path(checkpoint_dir)
    try:
        info = json.loads((folder / CHECKPOINT_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"not a cxrground checkpoint (no {CHECKPOINT_FILE})", folder) from None
    if info.get("model") != MODEL_NAME:
        raise ConfigError(f"{folder} is a {info.get('model')!r} checkpoint, not {MODEL_NAME!r}")
    if weights not in ("best", "last"):
        raise ConfigError(f"weights must be 'best' or 'last', got {weights!r}")
    path = folder / (BEST_WEIGHTS if weights == "best" else LAST_WEIGHTS)
    if not path.is_file():
        raise InputError("checkpoint has no weights file (training not finished one epoch?)", path)
    return BaselineModel(BaselineConfig.from_dict(info["config"]), load_file(str(path)), device=device, info=info)
