"""The trained baseline as an :class:`~cxrground.models.base.IlsModel`.

Inference rule (per pair): the image is prepared as in training (:func:`.data.prepare_image`), the network
gives mask logits on the canvas, a presence probability and the heads' outputs.

- ``presence < 0.5`` → the lesion is absent: the mask is empty and the answer is the negative template of the
  instruction's type (:func:`~cxrground.vocab.ils_templates.negative_answer`, target and location as written).
- otherwise the canvas logits are mapped to the native ``H×W`` with
  :meth:`~cxrground.io.transform.Letterbox.logits_to_native` (un-padded region, bilinear) and thresholded at 0
  (the mask may still be empty); the answer is the positive template: ``[SEG]`` for basic; for global the
  location labels (``[SEG]`` alone for cardiomegaly); for lesion inference the argmax lesion and certainty.

Global location labels (``BaselineConfig.global_location``):

- ``mask`` (default): read off the canvas mask (logits > 0) with the ILS location-label masks the anatomy planes
  already hold (:func:`mask_locations`), mimicking the dataset's grounded location GL (ILS.md §10 — a reported
  whole lung is refined into the upper / mid / base zones the lesion touches): a side counts when at least
  ``SIDE_SHARE`` (15 %) of the mask lies in that lung; on such a side the zone (upper, mid, base) holding most of
  the side's mask is named, plus every other zone the mask covers to at least ``ZONE_COVERAGE`` (60 %) of its
  area; a side named by its upper zone alone becomes the apical zone when ≥ ``APICAL_SHARE`` (80 %) of the
  side's mask is apical. Labels come in vocabulary order (right before left, top to bottom), which is the order
  of every GL the generator writes. On synthetic ILS data this rule reproduces ~76 % of the global-positive
  answers from the ground-truth masks (the misses are mostly whole-lung reports whose boxes reach zones the
  mask does not). An empty mask, or one outside both lungs, falls back to the head.
- ``head``: the labels whose location-head probability is ≥ 0.5 in vocabulary order (the most probable one
  when none is).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cxrground.errors import ConfigError, InputError
from cxrground.io.image import CXRImage
from cxrground.io.weights import load_safetensors
from cxrground.models.base import CHECKPOINT_FILE, IlsOutput
from cxrground.models.baseline.conditioning import CERTAINTIES, LI_LESIONS, encode, parse, render_answer
from cxrground.models.baseline.config import BaselineConfig
from cxrground.models.baseline.data import WorkingImage, check_lungs, make_segmenter, prepare_image
from cxrground.models.baseline.net import build_net
from cxrground.models.baseline.training import BEST_WEIGHTS, LAST_WEIGHTS, MODEL_NAME
from cxrground.vocab.ils_templates import TENTATIVE_WORD
from cxrground.vocab.lesions import HEART_MASK_LESIONS
from cxrground.vocab.locations import ILS_LOCATION_LABELS, SIDES, lung_label, zone_label

__all__ = ["APICAL_SHARE", "PRESENCE_THRESHOLD", "SIDE_SHARE", "ZONE_COVERAGE", "BaselineModel", "load_model",
           "mask_locations"]

#: Presence probability below which the answer is negative and the mask empty.
PRESENCE_THRESHOLD = 0.5
#: ``mask`` global locations: least share of the mask inside a lung for that side to be named.
SIDE_SHARE = 0.15
#: ... least coverage of a (non-dominant) zone by the mask for the zone to be named too.
ZONE_COVERAGE = 0.6
#: ... least share of a side's mask in the apical zone for a lone upper zone to become the apical zone.
APICAL_SHARE = 0.8
_ZONES = ("upper zone lung", "mid zone lung", "lung base")


def mask_locations(mask: np.ndarray, labels: Mapping[str, np.ndarray]) -> list[str]:
    """ILS location labels of a lesion mask (see the module docstring), in vocabulary order; [] when none.

    ``labels`` maps the ILS labels (at least the two lungs and their zones) to boolean masks of ``mask``'s shape.
    """
    m = np.asarray(mask, dtype=bool)
    area = int(m.sum())
    out: list[str] = []
    if not area:
        return out
    for side in SIDES:
        on_side = int((m & labels[lung_label(side)]).sum())
        if not on_side or on_side < SIDE_SHARE * area:
            continue
        inter = {z: int((m & labels[zone_label(side, z)]).sum()) for z in _ZONES}
        best = max(_ZONES, key=lambda z: inter[z])
        chosen = [z for z in _ZONES
                  if z == best or inter[z] >= ZONE_COVERAGE * max(int(labels[zone_label(side, z)].sum()), 1)]
        apical = int((m & labels[zone_label(side, "apical zone lung")]).sum())
        if chosen == ["upper zone lung"] and apical >= APICAL_SHARE * on_side:
            chosen = ["apical zone lung"]
        out += [zone_label(side, z) for z in chosen]
    return [lab for lab in ILS_LOCATION_LABELS if lab in out]


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
        check_lungs(self.info.get("lungs"), self.segmenter, "this checkpoint")

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
            if self.config.global_location == "mask" and p.kind == "global" and present:
                canvas = dict(zip(ILS_LOCATION_LABELS, w.anatomy[2:], strict=True))
                locs = mask_locations(logits[i] > 0, canvas) or locs
            li_lesion, cert = LI_LESIONS[int(lesion[i])], CERTAINTIES[int(certainty[i])]
            is_li = p.kind == "lesion_inference"
            results.append(IlsOutput(
                answer=render_answer(p, present, li_lesion, cert, locs),
                mask=mask,
                presence=float(presence[i]),
                present=present,
                lesion=(li_lesion if present else TENTATIVE_WORD) if is_li else p.target,
                locations=locs if (p.kind == "global" and present and p.target not in HEART_MASK_LESIONS)
                else p.locations,
                kind=p.kind,
                certainty=cert if (is_li and present) else None,
                extra={"instruction_target": p.target,
                       "location_probabilities": dict(zip(ILS_LOCATION_LABELS, map(float, loc_prob[i]), strict=True))},
            ))
        return results


def load_model(checkpoint_dir: Path, device: str = "cpu", weights: str = "best",
               overrides: Mapping[str, Any] | None = None) -> BaselineModel:
    """Load a baseline checkpoint folder; ``weights`` ``best`` (selected, default) or ``last``.

    ``overrides`` replaces inference-time settings of the recorded configuration (e.g. ``global_location``).
    """
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
    config = BaselineConfig.from_dict(info["config"]).with_overrides(overrides)
    return BaselineModel(config, load_safetensors(path), device=device, info=info)
