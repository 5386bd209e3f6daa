"""Export a cxrground LISA checkpoint (:mod:`.checkpoint`) in the released LISA / ROSALIA layout: the way back of
:mod:`.convert`, for the reference code (``LISAForCausalLM.from_pretrained(folder, seg_token_idx=…,
vision_tower=…)`` of ``KAIST-Edlab/ROSALIA`` / ``dvlab-research/LISA``). Nothing is downloaded.

**Keys.** :data:`INVERSE_KEY_RULES` (one ordered table, applied once each, like :data:`.convert.KEY_RULES`) turns
every model parameter into its released name; each result is checked by mapping it forward again with
:func:`.convert.map_key` (and, for SAM, by holding no piece of transformers' naming, which ``map_key`` would pass
through), so the two tables cannot drift apart. A parameter without a released name, a weight the
architecture does not have or a parameter the weights lack is an :class:`~cxrground.errors.InputError` naming it.
SAM's tied positional matrix (``visual_model.shared_image_embedding.positional_embedding`` = the prompt encoder's
``shared_embedding.positional_embedding``) is written once, as
``model.visual_model.prompt_encoder.pe_layer.positional_encoding_gaussian_matrix`` (segment-anything has one
buffer); the two copies must be equal. The CLIP tower is written as
``model.vision_tower.vision_tower.vision_model.…`` (transformers 4.x naming) unless ``clip_weights="omit"``;
``"auto"`` omits it when the checkpoint, or the converted checkpoint its ``base_model`` chain leads to, was
converted from a release that did not store it (the reference code ignores stored tower weights anyway: it loads
CLIP from ``config.vision_tower``). Non-persistent buffers of old
checkpoints (``rotary_emb.inv_freq``, which :mod:`.convert` drops) are not written back.

**Weights.** Safetensors shards ``model-0000i-of-0000n.safetensors`` (metadata ``format: pt``, as transformers
requires) of at most ``max_shard_size`` each (a tensor larger than that gets a shard of its own) and
``model.safetensors.index.json`` (``metadata.total_size``, ``weight_map``), also for one shard. Tensors are read
one at a time from the checkpoint and one shard is held in memory. ``dtype`` None keeps each weight's dtype.

**config.json** (:func:`released_config`). Start: the release's own ``config.json`` when the checkpoint records it
(``conversion.released_config``, written by :func:`.convert.convert_released`), else the one recorded by / found in
its ``base_model`` (a converted checkpoint or a released folder that still exists), else nothing. Then the LISA
fields missing from it get the values the reference's ``LisaModel`` sets (:data:`LISA_DEFAULTS`), and the fields
the weights determine are always rewritten from the architecture: the LLaMA fields, ``vocab_size`` (rows of
``embed_tokens``), ``tie_word_embeddings`` false, ``architectures`` ``["LISAForCausalLM"]``, ``model_type``
``llava``, ``train_mask_decoder`` true (the reference builds SAM and ``text_hidden_fcs`` at construction only
when the config has it), ``out_dim`` (SAM prompt width, the last ``text_hidden_fcs`` layer), ``mm_hidden_size``
(CLIP width, ``mm_projector``'s input), ``mm_vision_select_layer``, ``mm_vision_select_feature`` ``patch``,
``mm_use_im_start_end`` true (the prompt this model uses), ``vision_tower`` = ``mm_vision_tower`` (the CLIP the
reference loads: ``vision_tower`` argument, else the release's, else ``openai/clip-vit-large-patch14``) and
``torch_dtype``. Never written (:data:`KWARG_FIELDS`): ``seg_token_idx``, ``vision_pretrained`` and the loss
weights are keyword arguments of ``from_pretrained``; transformers hands a keyword that names a config attribute
to the config instead, and ``LISAForCausalLM.__init__`` then fails on ``kwargs.pop("seg_token_idx")``.

**Tokenizer.** The checkpoint's tokenizer files are copied (``[SEG]``, ``<im_start>``, ``<im_end>`` included), or
those of ``tokenizer`` (e.g. the released folder), which must encode a conversation with the same ids. The
reference loads its tokenizer with transformers 4.31 and ``use_fast=False``: that needs ``tokenizer.model`` and
``added_tokens.json``; the files transformers ≥ 5 writes are unreadable there. A converted checkpoint keeps the
release's slow files (:data:`~.convert.RELEASE_TOKENIZER_FILES`); a checkpoint without them (a trained one, or one
converted by an older version) takes the tokenizer files of the release it was made from when that folder is on
this machine and gives the same ids (its ``base_model`` chain); otherwise a note says what is missing. Checked with
the reference code itself (``bench/lisa_reference.py``): the export of a tiny model loads in
``LISAForCausalLM.from_pretrained`` (transformers 4.31), every tensor equal, the reference's tokenizer gives
cxrground's ids, and its mask logits agree to about 1e-6.

**Limits of the reference.** It builds SAM ViT-H and reads CLIP from ``vision_tower``: a model of another size
(the tiny test model) is exported, but only this package reads it back (a note says so). It also gives
``mm_projector`` two layers when the folder's path contains both ``llava`` and ``1.5``: keep such names out of the
path the folder is loaded from (a note says so when ``out_dir`` has them).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from cxrground.errors import ConfigError, InputError
from cxrground.fields import option

if TYPE_CHECKING:
    import torch

__all__ = [
    "CLIP_NAME",
    "INVERSE_KEY_RULES",
    "KWARG_FIELDS",
    "LISA_DEFAULTS",
    "ExportRequest",
    "export_released",
    "export_request",
    "released_config",
    "released_key",
]

#: ONE ordered table, cxrground key (regex) → released key. Each rule is applied once, in order; the result is checked
#: against :func:`cxrground.models.lisa.convert.map_key`.
INVERSE_KEY_RULES: Final[tuple[tuple[str, str], ...]] = (
    # --- SAM: transformers → segment-anything (inverse of convert_sam_to_hf.py) -----------------------
    (r"^visual_model\.vision_encoder\.", "visual_model.image_encoder."),
    (r"^(visual_model\.image_encoder)\.patch_embed\.projection\.", r"\1.patch_embed.proj."),
    (r"^(visual_model\.image_encoder)\.layers\.(\d+)\.layer_norm(\d)\.", r"\1.blocks.\2.norm\3."),
    (r"^(visual_model\.image_encoder)\.layers\.", r"\1.blocks."),
    (r"^(visual_model\.image_encoder\.neck)\.conv1\.", r"\1.0."),
    (r"^(visual_model\.image_encoder\.neck)\.layer_norm1\.", r"\1.1."),
    (r"^(visual_model\.image_encoder\.neck)\.conv2\.", r"\1.2."),
    (r"^(visual_model\.image_encoder\.neck)\.layer_norm2\.", r"\1.3."),
    (r"^(visual_model\.prompt_encoder)\.shared_embedding\.positional_embedding$",
     r"\1.pe_layer.positional_encoding_gaussian_matrix"),
    (r"^(visual_model\.prompt_encoder)\.point_embed\.", r"\1.point_embeddings."),
    (r"^(visual_model\.prompt_encoder)\.mask_embed\.conv1\.", r"\1.mask_downscaling.0."),
    (r"^(visual_model\.prompt_encoder)\.mask_embed\.layer_norm1\.", r"\1.mask_downscaling.1."),
    (r"^(visual_model\.prompt_encoder)\.mask_embed\.conv2\.", r"\1.mask_downscaling.3."),
    (r"^(visual_model\.prompt_encoder)\.mask_embed\.layer_norm2\.", r"\1.mask_downscaling.4."),
    (r"^(visual_model\.prompt_encoder)\.mask_embed\.conv3\.", r"\1.mask_downscaling.6."),
    (r"^(visual_model\.mask_decoder)\.upscale_conv1\.", r"\1.output_upscaling.0."),
    (r"^(visual_model\.mask_decoder)\.upscale_layer_norm\.", r"\1.output_upscaling.1."),
    (r"^(visual_model\.mask_decoder)\.upscale_conv2\.", r"\1.output_upscaling.3."),
    (r"^(visual_model\.mask_decoder\.transformer\.layers\.\d+)\.layer_norm(\d)\.", r"\1.norm\2."),
    (r"^(visual_model\.mask_decoder\.transformer)\.layer_norm_final_attn\.", r"\1.norm_final_attn."),
    # 3-layer MLPs (hypernetworks, IoU head): proj_in / layers.0 / proj_out → layers.0/1/2 (layers.0 first)
    (r"^(visual_model\.mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.layers\.0\.",
     r"\1.layers.1."),
    (r"^(visual_model\.mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.proj_in\.",
     r"\1.layers.0."),
    (r"^(visual_model\.mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))\.proj_out\.",
     r"\1.layers.2."),
    # --- LLaVA / LISA wrapper ----------------------------------------------------------------------
    (r"^visual_model\.", "model.visual_model."),
    (r"^vision_tower\.(?:vision_model\.)?", "model.vision_tower.vision_tower.vision_model."),
    (r"^mm_projector\.", "model.mm_projector."),
    (r"^text_hidden_fcs\.(\d+)\.", r"model.text_hidden_fcs.0.\1."),
    (r"^language_model\.model\.", "model."),  # embed_tokens, layers.{i}.…, norm
    (r"^language_model\.lm_head\.", "lm_head."),
)

#: The CLIP the reference loads when neither the caller nor the recorded release names one.
CLIP_NAME: Final[str] = "openai/clip-vit-large-patch14"

#: ``from_pretrained`` keyword arguments of the reference's ``LISAForCausalLM``: never config fields (module docstring).
KWARG_FIELDS: Final[tuple[str, ...]] = ("seg_token_idx", "vision_pretrained", "ce_loss_weight", "dice_loss_weight",
                                        "bce_loss_weight", "use_mm_start_end")

#: LLaVA / LISA fields the reference's ``LisaModel`` / ``initialize_vision_modules`` set, for a config without them.
LISA_DEFAULTS: Final[dict[str, Any]] = {
    "mm_vision_select_feature": "patch", "mm_use_im_patch_token": False, "use_mm_proj": True,
    "image_aspect_ratio": "square", "image_grid_pinpoints": None, "tune_mm_mlp_adapter": False,
    "freeze_mm_mlp_adapter": True, "pretrain_mm_mlp_adapter": None, "use_cache": False,
}

#: Tokenizer files copied when present.
TOKENIZER_FILES: Final[tuple[str, ...]] = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                           "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                                           "chat_template.jinja", "chat_template.json")

#: The index of the released weights' shards.
INDEX_FILE: Final[str] = "model.safetensors.index.json"
_BYTES: Final[dict[str, int]] = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
                                 "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_UNITS: Final[dict[str, int]] = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
                                 "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_DTYPES: Final[tuple[str, ...]] = ("float32", "bfloat16", "float16")
_INVERSE = tuple((re.compile(p), r) for p, r in INVERSE_KEY_RULES)
#: Name pieces that exist only in transformers' SAM naming (``map_key`` passes them through unchanged, so a SAM name
#: holding one would map back to our key although the released layout spells it otherwise).
_TRANSFORMERS_ONLY: Final[tuple[str, ...]] = (
    ".vision_encoder.", ".patch_embed.projection.", ".image_encoder.layers.", "layer_norm", ".neck.conv",
    ".shared_embedding.", ".shared_image_embedding.", ".point_embed.", ".mask_embed.", ".upscale_", ".proj_in.",
    ".proj_out.")


def _same_key(ours: str) -> str:
    """Our key with the CLIP tower's ``vision_model.`` level removed (transformers 4.x has it, 5.x not)."""
    return ours.replace("vision_tower.vision_model.", "vision_tower.", 1)


def released_key(key: str) -> str:
    """The released-layout name of a cxrground LISA key (:data:`INVERSE_KEY_RULES`), checked against
    :func:`~cxrground.models.lisa.convert.map_key`; an :class:`InputError` naming the key when it has none."""
    from cxrground.models.lisa.convert import map_key

    name = key
    for pattern, repl in _INVERSE:
        name = pattern.sub(repl, name, count=1)
    sam_left = name.startswith("model.visual_model.") and any(t in name for t in _TRANSFORMERS_ONLY)
    if sam_left or not name.startswith(("model.", "lm_head.")) or _same_key(map_key(name)) != _same_key(key):
        raise InputError(f"no released-layout name for model parameter {key!r} (got {name!r})")
    return name


def _tied() -> dict[str, str]:
    """Tied copy → the parameter it copies (written once, under the latter's released name)."""
    from cxrground.models.lisa.convert import TIED

    return {copy: first for first, copy in TIED.items()}


def _parse_size(size: int | str) -> int:
    """Bytes of ``5GB`` / ``500MB`` / ``2GiB`` / an integer (transformers' ``max_shard_size`` units)."""
    if isinstance(size, int) and not isinstance(size, bool):
        n = size
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*", str(size), flags=re.IGNORECASE)
        if m is None or (m.group(2) or "").upper() not in _UNITS:
            raise ConfigError(f"max_shard_size must be bytes or a size such as 5GB / 500MB / 2GiB, got {size!r}")
        n = int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])
    if n < 1:
        raise ConfigError(f"max_shard_size must be positive, got {size!r}")
    return n


def _target(dtype: str | torch.dtype | None) -> torch.dtype | None:
    import torch

    if dtype is None or dtype == "source":
        return None
    name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype
    if isinstance(name, str) and name in _DTYPES:
        return getattr(torch, name)
    raise ConfigError(f"dtype must be None/source or one of {_DTYPES}, got {dtype!r}")


def _base_chain(info: Mapping[str, Any], steps: int = 4) -> Iterator[tuple[Path, Mapping[str, Any] | None]]:
    """The folders a checkpoint was made from, nearest first (its ``base_model``, that one's, … up to ``steps``):
    each with its ``checkpoint.json`` content, or None for a folder without one (a release), which ends the chain;
    it also ends at a folder that cannot be read."""
    from cxrground.models.base import CHECKPOINT_FILE, checkpoint_info

    for _ in range(steps):
        base = (info.get("config") or {}).get("base_model")
        if not base:
            return
        base = Path(str(base))
        try:
            following = checkpoint_info(base) if (base / CHECKPOINT_FILE).is_file() else None
        except (OSError, ValueError, InputError):
            return
        yield base, following
        if following is None:
            return
        info = following


def _recorded_release(info: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None, dict[str, Any]]:
    """The released ``config.json`` a checkpoint records, directly or through its ``base_model`` chain (module
    docstring), where it was found, and the ``filled_from`` of the conversion that recorded it (else empty)."""
    current = info
    chain = _base_chain(info)
    while True:
        recorded = (current.get("conversion") or {}).get("released_config")
        if isinstance(recorded, dict):
            return dict(recorded), "checkpoint.json conversion.released_config", _filled_from(current)
        base, following = next(chain, (None, None))
        if base is None:
            return None, None, _filled_from(current)
        if following is None:  # a release folder: its own config.json
            try:
                cfg = json.loads((base / "config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                cfg = None
            return ((dict(cfg), str(base / "config.json"), _filled_from(current)) if isinstance(cfg, dict)
                    else (None, None, _filled_from(current)))
        current = following


def _filled_from(info: Mapping[str, Any]) -> dict[str, Any]:
    """The ``filled_from`` record of a checkpoint's conversion (empty when it was not converted)."""
    return dict((info.get("conversion") or {}).get("filled_from") or {})


def _clip_name(vision_tower: str | None, release: Mapping[str, Any] | None) -> str:
    """The CLIP name/path for ``vision_tower``: given, else the release's, else :data:`CLIP_NAME` (checked as the
    reference's ``build_vision_tower`` checks it)."""
    release = release or {}
    name = str(vision_tower or release.get("vision_tower") or release.get("mm_vision_tower") or CLIP_NAME)
    if not (name.startswith(("openai", "laion")) or "clip" in name):
        raise ConfigError(f"the reference code loads only an openai/laion/…clip… vision tower, got {name!r}")
    return name


def released_config(arch: Mapping[str, Any], *, vocab_size: int, select_layer: int, dtype: torch.dtype,
                    release: Mapping[str, Any] | None = None, vision_tower: str | None = None) -> dict[str, Any]:
    """``config.json`` of the released layout for ``arch`` (see the module docstring for each field)."""
    cfg = {k: v for k, v in dict(release or {}).items() if k not in KWARG_FIELDS}
    for key, value in LISA_DEFAULTS.items():
        cfg.setdefault(key, value)
    name = _clip_name(vision_tower, cfg)
    cfg.update({k: v for k, v in dict(arch["llm"]).items() if v is not None})
    cfg.update({
        "architectures": ["LISAForCausalLM"], "model_type": "llava", "vocab_size": int(vocab_size),
        "tie_word_embeddings": False, "train_mask_decoder": True,
        "out_dim": int(arch["sam"]["prompt_encoder_config"]["hidden_size"]),
        "mm_hidden_size": int(arch["clip"]["hidden_size"]), "mm_vision_select_layer": int(select_layer),
        "mm_vision_select_feature": "patch", "mm_use_im_start_end": True, "mm_vision_tower": name,
        "vision_tower": name, "torch_dtype": str(dtype).removeprefix("torch."),
    })
    return dict(sorted(cfg.items()))


def _reference_notes(arch: Mapping[str, Any], out: Path) -> list[str]:
    """Where the reference code would not load this export as it is (module docstring)."""
    from cxrground.models.lisa.model import clip_vit_l14_config, sam_config

    notes = []
    sam, ref_sam = dict(arch["sam"]["vision_config"]), sam_config()["vision_config"]
    clip, ref_clip = dict(arch["clip"]), clip_vit_l14_config()
    sam_keys = ("hidden_size", "num_hidden_layers", "global_attn_indexes", "image_size", "patch_size")
    clip_keys = ("hidden_size", "num_hidden_layers", "image_size", "patch_size")
    if any(json.dumps(sam.get(k)) != json.dumps(ref_sam[k]) for k in sam_keys) or any(
            clip.get(k) != ref_clip[k] for k in clip_keys):
        notes.append("this model is not SAM ViT-H + CLIP ViT-L/14 224 px: the reference code builds those, so only "
                     "cxrground (ils convert-lisa) can read this export")
    path = str(out.absolute())
    if "llava" in path and "1.5" in path:
        notes.append(f"{path} contains 'llava' and '1.5': the reference code would build a two-layer mm_projector "
                     "for a folder loaded from such a path; rename it before loading it there")
    return notes


def _same_ids(other: Any, tok: Any) -> bool:
    """Whether tokenizer ``other`` has ``tok``'s size and encodes a conversation with the same ids."""
    from cxrground.models.lisa.text import token_ids
    from cxrground.vocab import ils_templates as T

    sample = T.llava_prompt("Segment the edema in the right lung.", f"{T.SEG_TOKEN} There is no edema.")
    return len(other) == len(tok) and token_ids(other, sample) == token_ids(tok, sample)


def _release_tokenizer(info: Mapping[str, Any]) -> Path | None:
    """The nearest folder with a slow tokenizer (``tokenizer.model``) in a checkpoint's ``base_model`` chain; None
    when there is none on this machine."""
    return next((base for base, _ in _base_chain(info) if (base / "tokenizer.model").is_file()), None)


def _tokenizer_source(checkpoint: Path, tokenizer: Path | None, tok: Any, info: Mapping[str, Any]
                      ) -> tuple[Path, list[str]]:
    """The folder whose tokenizer files are written, and notes: ``tokenizer`` when given (it must give the same
    ids); else the checkpoint when it has ``tokenizer.model``; else the release it was made from when that folder
    is here and gives the same ids; else the checkpoint."""
    from cxrground.models.lisa.text import load_tokenizer

    if tokenizer is not None:
        other = load_tokenizer(tokenizer)
        if not _same_ids(other, tok):
            raise InputError(f"this tokenizer does not give the checkpoint's ids ({len(other)} vs {len(tok)} tokens, "
                             f"or another encoding of a conversation)", tokenizer)
        return Path(tokenizer), []
    if (checkpoint / "tokenizer.model").is_file():
        return checkpoint, []
    release = _release_tokenizer(info)
    if release is not None:
        try:
            if _same_ids(load_tokenizer(release), tok):
                return release, [f"tokenizer files written from {release} (the release this checkpoint was made from; "
                                 "it has the tokenizer.model the reference reads)"]
        except (InputError, ConfigError, OSError, ValueError):
            pass
    return checkpoint, []


def _write_tokenizer(source: Path, out: Path, tok: Any) -> list[str]:
    """Copy the tokenizer files of ``source`` and check they read back with the checkpoint's ``[SEG]``; notes."""
    from cxrground.models.lisa.text import load_tokenizer, seg_token_id

    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not copied:
        raise InputError("no tokenizer files found", source)
    for name in copied:
        shutil.copyfile(source / name, out / name)
    written = load_tokenizer(out)
    if seg_token_id(written) != seg_token_id(tok) or len(written) != len(tok):
        raise InputError("the copied tokenizer does not read back with the checkpoint's [SEG] id and size", source)
    if "tokenizer.model" not in copied:
        return ["no tokenizer.model (SentencePiece) written: the tokenizer files here were written by transformers "
                ">= 5, which the reference's transformers 4.31 cannot read (use_fast=False needs tokenizer.model, and "
                "its tokenizers cannot parse the newer tokenizer.json); pass --tokenizer <released folder> (same ids)"]
    if "added_tokens.json" not in copied:
        return ["no added_tokens.json written: the reference's slow tokenizer would lack [SEG], <im_start> and "
                "<im_end>; pass --tokenizer <released folder> (same ids)"]
    return []


def _plan(keys: list[tuple[str, str]], sizes: Mapping[str, int], limit: int) -> list[list[tuple[str, str]]]:
    """Shards of (our key, released key) in order, each at most ``limit`` bytes (or one oversized tensor)."""
    shards: list[list[tuple[str, str]]] = [[]]
    used = 0
    for pair in keys:
        size = sizes[pair[0]]
        if shards[-1] and used + size > limit:
            shards.append([])
            used = 0
        shards[-1].append(pair)
        used += size
    return shards


def export_released(checkpoint_dir: Path, out_dir: Path, *, dtype: str | torch.dtype | None = None,
                    max_shard_size: int | str = "5GB", clip_weights: str = "auto", vision_tower: str | None = None,
                    tokenizer: Path | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Write the released LISA / ROSALIA layout of a cxrground LISA checkpoint into ``out_dir``; returns it.

    ``dtype``: None (or ``source``) keeps each weight's dtype, else ``float32`` / ``bfloat16`` / ``float16``.
    ``max_shard_size``: bytes per safetensors shard (``5GB``, ``500MB``, an integer). ``clip_weights``: ``auto``,
    ``write`` or ``omit`` the CLIP tower. ``vision_tower``: the CLIP name/path written to the config.
    ``tokenizer``: a folder whose tokenizer files are written instead of the checkpoint's (same ids required).
    ``log`` receives the notes on what the reference code needs beyond this folder. See the module docstring.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from cxrground.io.files import atomic_path, atomic_write_text
    from cxrground.models.base import checkpoint_info
    from cxrground.models.lisa.checkpoint import MODEL_NAME, WEIGHTS_FILE
    from cxrground.models.lisa.model import LisaForSegmentation
    from cxrground.models.lisa.text import load_tokenizer, seg_token_id

    checkpoint, out = Path(checkpoint_dir), Path(out_dir)
    target = _target(dtype)
    limit = _parse_size(max_shard_size)
    if clip_weights not in ("auto", "write", "omit"):
        raise ConfigError(f"clip_weights must be auto, write or omit, got {clip_weights!r}")
    info = checkpoint_info(checkpoint)
    if info.get("model") != MODEL_NAME or "arch" not in info:
        raise InputError(f"not a LISA checkpoint (model={info.get('model')!r})", checkpoint)
    weights = checkpoint / WEIGHTS_FILE
    if not weights.is_file():
        raise InputError(f"checkpoint has no {WEIGHTS_FILE}", checkpoint)
    if out.exists():
        if out.resolve() == checkpoint.resolve():
            raise InputError("the export must go to another folder than the checkpoint", out)
        taken = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
        if taken:
            raise InputError(f"folder is not empty ({', '.join(taken[:4])}{', …' if len(taken) > 4 else ''}): "
                             "export into a new or empty folder (a file left from another model, such as a "
                             "tokenizer.model, would be read with this one)", out)
    release, found, filled_from = _recorded_release(info)
    _clip_name(vision_tower, release)
    tok = load_tokenizer(checkpoint)
    tok_source, tok_notes = _tokenizer_source(checkpoint, tokenizer, tok, info)
    select_layer = int(info.get("select_layer", -2))
    with torch.device("meta"):
        expected = list(LisaForSegmentation(info["arch"], seg_token_id(tok), select_layer).state_dict())

    tied = _tied()
    omit_clip = clip_weights == "omit" or (clip_weights == "auto" and "vision_tower" in filled_from)
    with safe_open(str(weights), framework="pt") as fh:
        stored = set(fh.keys())
        extra, missing = sorted(stored - set(expected)), [k for k in expected if k not in stored]
        if extra or missing:
            raise InputError(f"weights do not match the architecture: parameters without a weight {missing[:8]}, "
                             f"weights of no parameter {extra[:8]}", weights)
        names, unnamed = [], []
        for key in expected:
            if key in tied or (omit_clip and key.startswith("vision_tower.")):
                continue
            try:
                names.append((key, released_key(key)))
            except InputError:
                unnamed.append(key)
        if unnamed:
            raise InputError(f"{len(unnamed)} model parameters have no released-layout name: {unnamed[:8]}", weights)
        released = [r for _, r in names]
        if len(set(released)) != len(released):
            raise InputError("two parameters map to one released name", weights)
        for copy, first in tied.items():
            if not torch.equal(fh.get_tensor(copy), fh.get_tensor(first)):
                raise InputError(f"tied weights differ: {copy} vs {first} (the released layout has one)", weights)

        def nbytes(key: str) -> int:
            sl = fh.get_slice(key)
            code = sl.get_dtype()
            each = target.itemsize if target is not None and code.startswith(("F", "BF")) else _BYTES.get(code, 4)
            n = 1
            for d in sl.get_shape():
                n *= int(d)
            return n * each

        sizes = {key: nbytes(key) for key, _ in names}
        vocab = int(fh.get_slice("language_model.model.embed_tokens.weight").get_shape()[0])
        shards = _plan(names, sizes, limit)
        out.mkdir(parents=True, exist_ok=True)
        notes = tok_notes + _write_tokenizer(tok_source, out, tok)
        weight_map: dict[str, str] = {}
        by_dtype: dict[torch.dtype, int] = {}
        for i, shard in enumerate(shards, 1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            tensors = {}
            for key, name in shard:
                value = fh.get_tensor(key)
                if target is not None and value.is_floating_point():
                    value = value.to(target)
                if value.is_floating_point():
                    by_dtype[value.dtype] = by_dtype.get(value.dtype, 0) + value.numel()
                tensors[name] = value.contiguous()
                weight_map[name] = file
            with atomic_path(out / file) as tmp:
                save_file(tensors, str(tmp), metadata={"format": "pt"})
            del tensors
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": dict(sorted(weight_map.items()))}
    atomic_write_text(out / INDEX_FILE, json.dumps(index, indent=2))
    written_dtype = max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else torch.float32
    cfg = released_config(info["arch"], vocab_size=vocab, select_layer=select_layer, dtype=written_dtype,
                          release=release, vision_tower=vision_tower)
    atomic_write_text(out / "config.json", json.dumps(cfg, indent=2))
    notes.append(f"config.json from {found} + this architecture" if found else
                 "config.json built from this architecture (no released config.json recorded)")
    notes += _reference_notes(info["arch"], out)
    for line in notes:
        if log is not None:
            log(f"note: {line}")
    return out


@dataclass(frozen=True, kw_only=True)
class ExportRequest:
    """The checkpoint to export, the folder to write, the weights' dtype and shard size, the CLIP tower and the
    tokenizer to write."""

    checkpoint: Path = option(path="dir", help="cxrground LISA checkpoint folder (ils train --model lisa, "
                              "ils convert-lisa).")
    out: Path = option(path="out_dir", help="Folder to write in the released LISA/ROSALIA layout (config.json, "
                       "tokenizer, model-0000i-of-0000n.safetensors + model.safetensors.index.json).")
    dtype: str = option("source", choices=("source", "float32", "bfloat16", "float16"),
                        help="Dtype of the written weights (source = keep the checkpoint's).")
    max_shard_size: str = option("5GB", help="Largest safetensors shard (5GB, 500MB, 2GiB or bytes).")
    clip_weights: str = option("auto", choices=("auto", "write", "omit"),
                               help="Write the CLIP tower's weights (auto: unless the release it was converted from "
                                    "lacked them; the reference code loads CLIP from --vision-tower anyway).")
    vision_tower: str | None = option(None, help="CLIP name or path for config.json's vision_tower (default: the "
                                      "release's, else openai/clip-vit-large-patch14).")
    tokenizer: Path | None = option(None, path="dir", help="Folder whose tokenizer files to write instead of the "
                                    "checkpoint's, e.g. the release (its tokenizer.model); must give the same ids.")


def export_request(request: ExportRequest, log: Callable[[str], None] | None = None) -> Path:
    """Write the released layout of the checkpoint (:func:`export_released`); returns the folder."""
    r = request
    return export_released(r.checkpoint, r.out, dtype=r.dtype, max_shard_size=r.max_shard_size,
                           clip_weights=r.clip_weights, vision_tower=r.vision_tower, tokenizer=r.tokenizer, log=log)
