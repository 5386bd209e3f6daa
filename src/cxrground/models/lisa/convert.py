"""Convert a checkpoint in the released LISA / ROSALIA layout (``xinlai/LISA-7B-v1``, ``checkone/ROSALIA-7B-v1``)
from a local folder into a cxrground LISA checkpoint (:mod:`.checkpoint`). Nothing is downloaded.

**Released layout.** The LISA repository saves the merged model with ``save_pretrained``: ``config.json``
(LLaMA fields + LLaVA fields such as ``mm_vision_tower``, ``mm_vision_select_layer``), tokenizer files, and
weights as sharded ``pytorch_model-0000x-of-0000y.bin`` + ``pytorch_model.bin.index.json`` or safetensors
shards + ``model.safetensors.index.json`` (or one unsharded file). Keys::

    model.embed_tokens.weight                       model.layers.{i}.self_attn.{q,k,v,o}_proj.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.weight model.layers.{i}.{input,post_attention}_layernorm.weight
    model.norm.weight   lm_head.weight              model.mm_projector.{weight,bias}
    model.vision_tower.vision_tower.vision_model.…  (often absent: the CLIP tower is not stored)
    model.visual_model.{image_encoder,prompt_encoder,mask_decoder}.…   (segment-anything naming)
    model.text_hidden_fcs.0.0.{weight,bias}         model.text_hidden_fcs.0.2.{weight,bias}

**Key mapping** (:data:`KEY_RULES`, applied in order to every key; SAM rules follow transformers'
``convert_sam_to_hf.py``). ``pe_layer.positional_encoding_gaussian_matrix`` feeds both the prompt encoder and
``visual_model.shared_image_embedding`` (tied in transformers' ``SamModel``).

Missing pieces: a source without the CLIP tower needs ``clip`` (a local CLIP ViT-L/14 folder,
``CLIPVisionModel`` or ``CLIPModel``; its ``vision_model.*`` weights are used); a source without SAM weights
needs ``sam`` (``sam_vit_h_4b8939.pth`` in segment-anything naming, or a transformers SAM folder). Every
source key must map to a model parameter (else error), every model parameter must be filled (else error,
except :data:`ALLOWED_MISSING` when ``allow_missing`` names it, e.g. ``text_hidden_fcs`` when starting from a
plain LLaVA). Keys in :data:`IGNORED_KEYS` (non-persistent buffers of old checkpoints) are dropped and listed.

Architecture: LLaMA from ``config.json`` (vocabulary size from ``embed_tokens``); CLIP from the ``clip`` folder's
config, else ViT-L/14 224 px; SAM inferred from the tensor shapes (width, depth, heads from the relative-position
tables, global-attention layers, canvas size); the mask decoder keeps SAM's 8 heads.

**Dtype.** The converted weights keep the source's dtype (:func:`source_dtype`: the floating dtype holding most
elements of the source folder's tensors; a bf16 release stays bf16, about 15 GB for 7B instead of 30 GB in
fp32); parts filled from ``sam``/``clip`` are cast to it. ``dtype`` overrides (``float32``, ``bfloat16``,
``float16``). The tokenizer may be only ``tokenizer.model`` (slow LLaMA SentencePiece, :func:`.text.load_tokenizer`).
The checkpoint keeps the release's slow tokenizer files (:data:`RELEASE_TOKENIZER_FILES`) beside those transformers
writes, so that :mod:`.export` can give the reference code (transformers 4.31, ``use_fast=False``) a tokenizer it
reads.

The way back (a cxrground LISA checkpoint → the released layout) is :mod:`.export`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import torch

from cxrground.errors import ConfigError, InputError
from cxrground.models.lisa.model import build_arch, sam_config

__all__ = [
    "ALLOWED_MISSING",
    "DTYPES",
    "IGNORED_KEYS",
    "KEY_RULES",
    "RELEASE_TOKENIZER_FILES",
    "ConversionReport",
    "convert_released",
    "infer_sam_config",
    "load_released_model",
    "map_key",
    "read_state_dict",
    "source_dtype",
]

#: ONE ordered table, released key (regex) → cxrground key. Each rule is applied once, in order.
KEY_RULES: Final[tuple[tuple[str, str], ...]] = (
    # --- LLaVA / LISA wrapper ----------------------------------------------------------------------
    (r"^model\.vision_tower\.vision_tower\.", "vision_tower."),
    (r"^model\.mm_projector\.", "mm_projector."),
    (r"^model\.text_hidden_fcs\.0\.0\.", "text_hidden_fcs.0."),
    (r"^model\.text_hidden_fcs\.0\.2\.", "text_hidden_fcs.2."),
    (r"^model\.visual_model\.", "visual_model."),
    (r"^model\.", "language_model.model."),  # embed_tokens, layers.{i}.…, norm
    (r"^lm_head\.", "language_model.lm_head."),
    # --- SAM: segment-anything → transformers (convert_sam_to_hf.py) -------------------------------
    (r"^visual_model\.image_encoder\.", "visual_model.vision_encoder."),
    (r"^(visual_model\.vision_encoder)\.patch_embed\.proj\.", r"\1.patch_embed.projection."),
    (r"^(visual_model\.vision_encoder)\.blocks\.", r"\1.layers."),
    (r"^(visual_model\.vision_encoder\.layers\.\d+)\.norm(\d)\.", r"\1.layer_norm\2."),
    (r"^(visual_model\.vision_encoder\.neck)\.0\.", r"\1.conv1."),
    (r"^(visual_model\.vision_encoder\.neck)\.1\.", r"\1.layer_norm1."),
    (r"^(visual_model\.vision_encoder\.neck)\.2\.", r"\1.conv2."),
    (r"^(visual_model\.vision_encoder\.neck)\.3\.", r"\1.layer_norm2."),
    (r"^(visual_model\.prompt_encoder)\.pe_layer\.positional_encoding_gaussian_matrix$",
     r"\1.shared_embedding.positional_embedding"),
    (r"^(visual_model\.prompt_encoder)\.point_embeddings\.", r"\1.point_embed."),
    (r"^(visual_model\.prompt_encoder)\.mask_downscaling\.0\.", r"\1.mask_embed.conv1."),
    (r"^(visual_model\.prompt_encoder)\.mask_downscaling\.1\.", r"\1.mask_embed.layer_norm1."),
    (r"^(visual_model\.prompt_encoder)\.mask_downscaling\.3\.", r"\1.mask_embed.conv2."),
    (r"^(visual_model\.prompt_encoder)\.mask_downscaling\.4\.", r"\1.mask_embed.layer_norm2."),
    (r"^(visual_model\.prompt_encoder)\.mask_downscaling\.6\.", r"\1.mask_embed.conv3."),
    (r"^(visual_model\.mask_decoder)\.output_upscaling\.0\.", r"\1.upscale_conv1."),
    (r"^(visual_model\.mask_decoder)\.output_upscaling\.1\.", r"\1.upscale_layer_norm."),
    (r"^(visual_model\.mask_decoder)\.output_upscaling\.3\.", r"\1.upscale_conv2."),
    (r"^(visual_model\.mask_decoder\.transformer\.layers\.\d+)\.norm(\d)\.", r"\1.layer_norm\2."),
    (r"^(visual_model\.mask_decoder\.transformer)\.norm_final_attn\.", r"\1.layer_norm_final_attn."),
    # 3-layer MLPs (hypernetworks, IoU head): layers.0/1/2 → proj_in / layers.0 / proj_out
    (r"^(visual_model\.mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.layers\.2\.",
     r"\1.proj_out."),
    (r"^(visual_model\.mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.layers\.0\.",
     r"\1.proj_in."),
    (r"^(visual_model\.mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.layers\.1\.",
     r"\1.layers.0."),
)

#: Extra target of a mapped key (transformers ties these parameters).
TIED: Final[dict[str, str]] = {
    "visual_model.prompt_encoder.shared_embedding.positional_embedding":
        "visual_model.shared_image_embedding.positional_embedding",
}

#: Source keys dropped on purpose (non-persistent buffers saved by older library versions).
IGNORED_KEYS: Final[tuple[str, ...]] = (r"\.rotary_emb\.inv_freq$", r"(^|\.)pixel_mean$", r"(^|\.)pixel_std$")

#: Model parts that may be left at their initialisation when ``allow_missing`` names them.
ALLOWED_MISSING: Final[tuple[str, ...]] = ("text_hidden_fcs", "visual_model.mask_decoder")

#: ``dtype`` choices of the converter (``source`` = keep the source's dtype).
DTYPES: Final[tuple[str, ...]] = ("source", "float32", "bfloat16", "float16")
#: The release's slow-tokenizer files a converted checkpoint keeps (transformers ≥ 5 writes none of them; the
#: reference's transformers 4.31 reads its tokenizer from them with ``use_fast=False``).
RELEASE_TOKENIZER_FILES: Final[tuple[str, ...]] = ("tokenizer.model", "added_tokens.json", "special_tokens_map.json")

_COMPILED = tuple((re.compile(p), r) for p, r in KEY_RULES)
_IGNORED = tuple(re.compile(p) for p in IGNORED_KEYS)


def map_key(key: str) -> str:
    """The cxrground name of a released-layout key (:data:`KEY_RULES` in order)."""
    for pattern, repl in _COMPILED:
        key = pattern.sub(repl, key, count=1)
    return key


def read_state_dict(folder_or_file: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint: sharded/unsharded ``.bin`` or ``.safetensors``, or one ``.pth``/``.bin`` file."""
    from cxrground.io.weights import load_safetensors

    path = Path(folder_or_file)
    if not path.exists():
        raise InputError("does not exist", path)
    if path.is_file():
        files = [path]
    else:
        files = []
        for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            if (path / index).is_file():
                weight_map = json.loads((path / index).read_text(encoding="utf-8"))["weight_map"]
                files = [path / name for name in dict.fromkeys(weight_map.values())]
                break
        if not files:
            files = [p for p in (path / "model.safetensors", path / "pytorch_model.bin") if p.is_file()]
    if not files:
        raise InputError("no weights found (model.safetensors[.index.json] or pytorch_model.bin[.index.json])", path)
    state: dict[str, torch.Tensor] = {}
    for f in files:
        if not f.is_file():
            raise InputError("weight shard listed in the index is missing", f)
        if f.suffix == ".safetensors":
            part = load_safetensors(f)
        else:
            try:
                part = torch.load(f, map_location="cpu", weights_only=True)
            except Exception as exc:  # a truncated or foreign pickle: torch raises several error types
                raise InputError(f"not a readable PyTorch weights file ({exc})", f) from None
        if isinstance(part, Mapping) and "model" in part and isinstance(part["model"], Mapping):
            part = part["model"]
        state.update(part)
    return state


def source_dtype(state: Mapping[str, torch.Tensor]) -> torch.dtype:
    """The floating dtype holding most elements of ``state`` (float32 when it has no floating tensor)."""
    sizes: dict[torch.dtype, int] = {}
    for value in state.values():
        if value.is_floating_point():
            sizes[value.dtype] = sizes.get(value.dtype, 0) + value.numel()
    return max(sizes, key=lambda d: sizes[d]) if sizes else torch.float32


def _target_dtype(dtype: str, state: Mapping[str, torch.Tensor]) -> torch.dtype:
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return source_dtype(state) if dtype == "source" else getattr(torch, dtype)


class ConversionReport(dict):
    """``{"mapped": n, "ignored": [...], "filled_from": {...}, "left_initialised": [...]}``."""


def infer_sam_config(state: Mapping[str, torch.Tensor], prefix: str = "visual_model.") -> dict[str, Any]:
    """SAM ``SamConfig`` kwargs read from transformers-named tensors (see the module docstring)."""
    v = f"{prefix}vision_encoder."
    try:
        proj = state[f"{v}patch_embed.projection.weight"]
        grid = state[f"{v}pos_embed"].shape[1]
        layers = sorted({int(k[len(v) + 7:].split(".")[0]) for k in state if k.startswith(f"{v}layers.")})
        rel = [state[f"{v}layers.{i}.attn.rel_pos_h"] for i in layers]
        head_dim = rel[0].shape[1]
        global_attn = [i for i, r in zip(layers, rel, strict=True) if r.shape[0] == 2 * grid - 1]
        windowed = [r.shape[0] for r in rel if r.shape[0] != 2 * grid - 1]
        prompt_dim = state[f"{v}neck.conv1.weight"].shape[0]
        pe = state[f"{prefix}prompt_encoder.shared_embedding.positional_embedding"]
    except KeyError as exc:
        raise InputError(f"SAM weights incomplete: {exc.args[0]} missing") from exc
    hidden, patch = proj.shape[0], proj.shape[2]
    cfg = sam_config(hidden=hidden, layers=len(layers), heads=hidden // head_dim, global_attn=global_attn,
                     image_size=grid * patch, patch_size=patch, window=(windowed[0] + 1) // 2 if windowed else grid,
                     prompt_dim=prompt_dim, mlp_dim=state[f"{v}layers.0.mlp.lin1.weight"].shape[0],
                     decoder_mlp=state[f"{prefix}mask_decoder.transformer.layers.0.mlp.lin1.weight"].shape[0],
                     mask_input_channels=state[f"{prefix}prompt_encoder.mask_embed.conv2.weight"].shape[0])
    cfg["vision_config"]["num_pos_feats"] = int(pe.shape[1])
    cfg["mask_decoder_config"]["iou_head_hidden_dim"] = int(
        state[f"{prefix}mask_decoder.iou_prediction_head.proj_in.weight"].shape[0])
    return cfg


def _map_all(state: Mapping[str, torch.Tensor], prefix: str = "") -> tuple[dict[str, torch.Tensor], list[str]]:
    out: dict[str, torch.Tensor] = {}
    ignored: list[str] = []
    for key, value in state.items():
        if any(p.search(key) for p in _IGNORED):
            ignored.append(key)
            continue
        new = map_key(prefix + key)
        out[new] = value
        if new in TIED:
            out[TIED[new]] = value
    return out, ignored


def _sam_state(sam: Path) -> dict[str, torch.Tensor]:
    """SAM weights (segment-anything ``.pth`` or transformers folder) under ``visual_model.``."""
    raw = read_state_dict(sam)
    if any(k.startswith("image_encoder.") for k in raw):
        return _map_all(raw, "model.visual_model.")[0]
    return {f"visual_model.{k}": v for k, v in raw.items()
            if k.startswith(("vision_encoder.", "prompt_encoder.", "mask_decoder.", "shared_image_embedding."))}


def _clip_state(clip: Path) -> dict[str, torch.Tensor]:
    """The vision-tower weights of a CLIP folder (``CLIPModel`` or ``CLIPVisionModel``) under ``vision_tower.``."""
    raw = read_state_dict(clip)
    skip = ("text_model.", "text_projection", "visual_projection", "logit_scale")
    return {f"vision_tower.{k}": v for k, v in raw.items() if not k.startswith(skip) and "position_ids" not in k}


def _adapt_clip_names(state: dict[str, torch.Tensor], expected: Iterable[str]) -> dict[str, torch.Tensor]:
    """Match the CLIP tower's ``vision_model.`` level to the installed ``transformers`` naming (4.x has it, 5.x not)."""
    expected = set(expected)
    out = {}
    for key, value in state.items():
        if key.startswith("vision_tower.") and key not in expected:
            rest = key[len("vision_tower."):].removeprefix("vision_model.")
            for candidate in (f"vision_tower.{rest}", f"vision_tower.vision_model.{rest}"):
                if candidate in expected:
                    key = candidate
                    break
        out[key] = value
    return out


def _clip_config(clip: Path | None) -> dict[str, Any] | None:
    if clip is None:
        return None
    from transformers import CLIPVisionConfig

    try:
        cfg = CLIPVisionConfig.from_pretrained(str(clip), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read a CLIP config ({exc})", clip) from exc
    return {k: v for k, v in cfg.to_dict().items() if k not in ("transformers_version", "architectures")}


_LLAMA_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "rms_norm_eps", "max_position_embeddings", "hidden_act", "rope_theta", "rope_scaling",
               "bos_token_id", "eos_token_id", "pad_token_id", "attention_bias", "mlp_bias", "head_dim")


def _llama_config(source: Path, state: Mapping[str, torch.Tensor]) -> tuple[dict[str, Any], int]:
    try:
        cfg = json.loads((source / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError("source folder has no config.json", source) from exc
    llm = {k: cfg[k] for k in _LLAMA_KEYS if cfg.get(k) is not None}
    embed = state.get("language_model.model.embed_tokens.weight")
    if embed is None:
        raise InputError("source has no model.embed_tokens.weight", source)
    llm["vocab_size"] = int(embed.shape[0])
    llm["tie_word_embeddings"] = False
    return llm, int(cfg.get("mm_vision_select_layer", -2))


def load_released_model(source: Path, *, sam: Path | None = None, clip: Path | None = None,
                        tokenizer: Path | None = None, allow_missing: Iterable[str] = (),
                        dtype: str = "float32") -> tuple[Any, Any, dict]:
    """Model, tokenizer and conversion report from a released-layout folder (see the module docstring).

    The model's weights are in ``dtype`` (one of :data:`DTYPES`; ``source`` keeps the source folder's dtype).
    """
    from cxrground.models.lisa.model import LisaForSegmentation
    from cxrground.models.lisa.text import load_tokenizer, seg_token_id

    source = Path(source)
    state, ignored = _map_all(read_state_dict(source))
    target = _target_dtype(dtype, state)
    filled: dict[str, str] = {}
    if not any(k.startswith("visual_model.") for k in state):
        if sam is None:
            raise ConfigError(f"{source} has no SAM weights (model.visual_model.*): pass the SAM checkpoint")
        state.update(_sam_state(Path(sam)))
        filled["visual_model"] = str(sam)
    if not any(k.startswith("vision_tower.") for k in state):
        if clip is None:
            raise ConfigError(f"{source} does not store the CLIP tower: pass a local CLIP ViT-L/14 folder")
        state.update(_clip_state(Path(clip)))
        filled["vision_tower"] = str(clip)
    llm, select_layer = _llama_config(source, state)
    arch = build_arch(llm, _clip_config(Path(clip) if clip else None), infer_sam_config(state))
    tok = load_tokenizer(tokenizer or source)
    model = LisaForSegmentation(arch, seg_token_id(tok), select_layer)
    if len(tok) > model.language_model.config.vocab_size:
        raise InputError(f"tokenizer has {len(tok)} tokens but the embeddings only {llm['vocab_size']}", source)
    expected = model.state_dict()
    state = _adapt_clip_names(state, expected)
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise InputError(f"{len(unexpected)} source keys map to no model parameter: {unexpected[:8]}", source)
    allowed = tuple(a for a in allow_missing if a in ALLOWED_MISSING)
    missing = sorted(set(expected) - set(state))
    fatal = [k for k in missing if not k.startswith(allowed)] if allowed else missing
    if fatal:
        parts = sorted({k.split(".")[0] for k in fatal})
        hint = ("; the CLIP vision tower is not in the release: give a local CLIP ViT-L/14 folder with --clip"
                if any(k.startswith("vision_tower") for k in fatal) else "")
        hint += ("; the SAM weights are missing: give sam_vit_h_4b8939.pth with --sam"
                 if any(k.startswith(("sam", "visual_model")) for k in fatal) else "")
        raise InputError(f"{len(fatal)} model parameters have no source tensor (in {', '.join(parts)}): "
                         f"{fatal[:8]}{hint}", source)
    shapes = [k for k in state if tuple(state[k].shape) != tuple(expected[k].shape)]
    if shapes:
        raise InputError(f"shape mismatch for {shapes[:5]}: source {[tuple(state[k].shape) for k in shapes[:5]]} vs "
                         f"model {[tuple(expected[k].shape) for k in shapes[:5]]}", source)
    model.to(target)
    expected = model.state_dict()
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=False)
    report = ConversionReport(mapped=len(state), ignored=ignored, filled_from=filled, left_initialised=missing,
                              source=str(source), select_layer=select_layer, arch=arch,
                              dtype=str(target).removeprefix("torch."))
    return model.eval(), tok, report


def convert_released(source: Path, out: Path, *, sam: Path | None = None, clip: Path | None = None,
                     tokenizer: Path | None = None, allow_missing: Iterable[str] = (), dtype: str = "source") -> Path:
    """Write a cxrground LISA checkpoint folder converted from a released-layout folder; returns ``out``.

    The weights are written in the source's dtype unless ``dtype`` names another (:data:`DTYPES`).
    ``checkpoint.json`` records the source's ``config.json`` as ``conversion.released_config`` (read back by
    :func:`cxrground.models.lisa.export.export_released`, the way back to the released layout).
    """
    from cxrground.models.lisa.checkpoint import save_checkpoint
    from cxrground.models.lisa.config import LisaConfig

    model, tok, report = load_released_model(source, sam=sam, clip=clip, tokenizer=tokenizer,
                                             allow_missing=allow_missing, dtype=dtype)
    config = LisaConfig(base_model=str(source), sam_checkpoint=str(sam) if sam else None,
                        clip=str(clip) if clip else None, sam_image_size=model.sam_size,
                        mm_vision_select_layer=report["select_layer"])
    released_config = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
    info = {"arch": report["arch"], "config": config.to_dict(), "select_layer": report["select_layer"],
            "dataset_hash": None, "seed": None, "step": 0,
            "conversion": {**{k: report[k] for k in ("source", "mapped", "ignored", "filled_from", "left_initialised",
                                                     "dtype")}, "released_config": released_config}}
    tok_folder = Path(tokenizer or source)
    slow = [tok_folder / name for name in RELEASE_TOKENIZER_FILES if (tok_folder / name).is_file()]
    return save_checkpoint(Path(out), model, tok, info, extra_files=slow if (tok_folder / "tokenizer.model").is_file()
                           else ())
