"""The cxrground LISA checkpoint folder: write and read.

Layout::

    checkpoint.json      {"model": "lisa", "arch": {llm, clip, sam}, "config": LisaConfig, "dataset_hash",
                          "seed", "step", "select_layer", ...}
    model.safetensors    merged weights (LoRA folded in), names of :class:`LisaForSegmentation`
    tokenizer files      ``save_pretrained`` output of the tokenizer (``[SEG]``, ``<im_start>``, ``<im_end>`` added);
                         a converted release also keeps the release's ``tokenizer.model``, ``added_tokens.json``
                         and ``special_tokens_map.json`` (what the reference's slow tokenizer reads)
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import torch

from cxrground.errors import InputError
from cxrground.io.files import atomic_path, atomic_write_text
from cxrground.models.base import CHECKPOINT_FILE, checkpoint_info
from cxrground.models.lisa.model import LisaForSegmentation, merged_state_dict
from cxrground.models.lisa.text import load_tokenizer, seg_token_id

__all__ = ["MODEL_NAME", "WEIGHTS_FILE", "load_checkpoint", "save_checkpoint"]

MODEL_NAME: Final[str] = "lisa"
WEIGHTS_FILE: Final[str] = "model.safetensors"


def save_checkpoint(out: Path, model: torch.nn.Module, tokenizer: Any, info: dict[str, Any],
                    dtype: torch.dtype | None = None, extra_files: Sequence[Path] = ()) -> Path:
    """Write a checkpoint folder atomically per file (weights, tokenizer, then ``checkpoint.json`` last).

    ``dtype``: store every floating-point weight in it (a mixed-precision model's float32 trainable parts and
    merged LoRA layers with the rest); None keeps each weight's dtype. LoRA deltas are folded in before the cast.
    ``extra_files``: copied into the folder under their names after the tokenizer (e.g. a release's slow tokenizer
    files, which transformers ≥ 5 does not write).
    """
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in merged_state_dict(model).items()}
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    with atomic_path(out / WEIGHTS_FILE) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(out))
    for path in extra_files:
        with atomic_path(out / Path(path).name) as tmp:
            shutil.copyfile(path, tmp)
    meta = {"model": MODEL_NAME, **info}
    atomic_write_text(out / CHECKPOINT_FILE, json.dumps(meta, indent=1, sort_keys=True))
    return out


def load_checkpoint(folder: Path, device: str = "cpu", dtype: torch.dtype | None = None
                    ) -> tuple[LisaForSegmentation, Any, dict[str, Any]]:
    """Model (eval mode, on ``device``), tokenizer and ``checkpoint.json`` of a LISA checkpoint folder."""
    from cxrground.io.weights import load_safetensors

    folder = Path(folder)
    info = checkpoint_info(folder)
    if info.get("model") != MODEL_NAME or "arch" not in info:
        raise InputError(f"not a LISA checkpoint (model={info.get('model')!r})", folder / CHECKPOINT_FILE)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise InputError(f"checkpoint has no {WEIGHTS_FILE}", folder)
    tokenizer = load_tokenizer(folder)
    model = LisaForSegmentation(info["arch"], seg_token_id(tokenizer), int(info.get("select_layer", -2)))
    state = load_safetensors(weights)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise InputError(f"weights do not match the architecture: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}", weights)
    model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    return model.eval(), tokenizer, info
