"""Tiny random chat VLMs of the open families people benchmark, built offline in the transformers layout (needs
the ``vlm`` extra: transformers and tokenizers).

Each builder saves a folder that ``hf:FOLDER`` loads like a released checkpoint: ``config.json`` + weights of the
family's real ``*ForConditionalGeneration`` class (1-2 layers, hidden size 16-32), its tokenizer with the family's
special tokens (a byte-level BPE trained on the CheXpercept templates), its image processor, processor settings
and a chat template in the family's own markup (ChatML for Qwen and InternVL, ``<start_of_turn>`` for Gemma 3,
``User:``/``<end_of_utterance>`` for Idefics3 / SmolVLM). Generation suppresses EOS, every special token and every
token with a digit or ``<`` in it, so each reply is exactly ``max_tokens`` tokens of digit-free text.

:data:`FAMILIES` maps a family name to ``(builder, expected image tokens for a list of (h, w) image sizes)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cxrground.vocab import percept_templates as pt

QWEN_PIXELS = (28 * 28, 112 * 112)  # min / max pixels: a 28-multiple image inside keeps its size
GEMMA_TOKENS = 4  # mm_tokens_per_image (a 2x2 pooled grid of the 4x4 patches of a 32-px image)
IDEFICS_SIDE, IDEFICS_SEQ = 32, 4  # sub-image side and its tokens: (32/8)^2 / scale_factor^2
INTERNVL_SEQ = 4  # (32/8)^2 * downsample_ratio^2


def chat_tokenizer(specials: Sequence[str], named: dict[str, str], bos: str = "<s>", eos: str = "</s>",
                   roles: str = "user assistant system model User Assistant") -> Any:
    """A byte-level BPE tokenizer (400 tokens) trained on the CheXpercept templates and the chat ``roles``, with the
    family's special tokens (``specials``; ``named``: the processor's named ones, e.g. ``image_token``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [pt.SYSTEM_PROMPT, pt.CONTOUR_EVAL, pt.INITIAL_CONTEXT, pt.EXPANSION, pt.CONTRACTION,
              pt.REVISION_RESULT, pt.DISTRIBUTION, pt.LOCATION, pt.SEVERITY, pt.COMPARISON,
              f"Options: Yes No None Answer: {roles} edema lung"] * 3
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", bos, eos, *specials], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=bos, eos_token=eos, unk_token="<unk>",
                                   pad_token="<unk>", extra_special_tokens=named, model_max_length=1 << 15)


def _template(turn: str, end: str, image: str, generation: str, *, bos: str = "", role: str = "message['role']"
              ) -> str:
    """A Jinja chat template: ``turn`` opens a message (with ``ROLE``), ``end`` closes it."""
    opening = turn.replace("ROLE", "' ~ " + role + " ~ '")
    return (
        bos + "{%- for message in messages -%}{{ '" + opening + "' }}"
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- elif part['type'] == 'image' -%}" + image +
        "{%- endif -%}{%- endfor -%}{%- endif -%}" + end +
        "{%- endfor -%}{%- if add_generation_prompt -%}" + generation + "{%- endif -%}"
    )


CHATML = _template("<|im_start|>ROLE\n", "<|im_end|>\n", "<|vision_start|><|image_pad|><|vision_end|>",
                   "<|im_start|>assistant\n")
INTERNVL_CHATML = _template("<|im_start|>ROLE\n", "<|im_end|>\n", "<IMG_CONTEXT>\n", "<|im_start|>assistant\n")
GEMMA = _template("<start_of_turn>ROLE\n", "<end_of_turn>\n", "<start_of_image>", "<start_of_turn>model\n",
                  bos="{{ bos_token }}", role="('model' if message['role'] == 'assistant' else message['role'])")
IDEFICS = _template("ROLE:", "<end_of_utterance>\n", "<image>", "Assistant:", bos="<|im_start|>",
                    role="message['role'] | capitalize")


def _llm(tok: Any, **extra: Any) -> dict[str, Any]:
    return {"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 1 << 13,
            "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
            **extra}


def _save(model: Any, tok: Any, folder: Path) -> Path:
    gen = model.generation_config
    gen.pad_token_id = tok.pad_token_id
    gen.bos_token_id, gen.eos_token_id = tok.bos_token_id, tok.eos_token_id
    gen.suppress_tokens = [i for i in range(len(tok))
                           if i in tok.all_special_ids or any(c.isdigit() or c == "<" for c in tok.decode([i]))]
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _write_processor(folder: Path, processor_class: str, template: str, **settings: Any) -> None:
    """``processor_config.json`` and ``chat_template.jinja`` as ``ProcessorMixin.save_pretrained`` writes them."""
    (folder / "processor_config.json").write_text(
        json.dumps({"processor_class": processor_class, **settings}, indent=2, sort_keys=True), encoding="utf-8")
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")


def _seeded(build: Callable[[], Any]) -> Any:
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build().eval()


# --- Qwen2-VL / Qwen2.5-VL: image tokens = (h/28)·(w/28) per image ------------------------------------------

_QWEN_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def _qwen(folder: Path, version: str) -> Path:
    import transformers

    tok = chat_tokenizer(_QWEN_SPECIALS, {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"})
    ids = tok.convert_tokens_to_ids
    image_processor = transformers.Qwen2VLImageProcessor(min_pixels=QWEN_PIXELS[0], max_pixels=QWEN_PIXELS[1],
                                                         patch_size=14, merge_size=2, temporal_patch_size=2)
    vision: dict[str, Any] = {"depth": 1, "num_heads": 2, "patch_size": 14, "spatial_merge_size": 2,
                              "temporal_patch_size": 2, "in_channels": 3}
    if version == "2":
        vision.update(embed_dim=16, hidden_size=32, mlp_ratio=2)
        config_cls, model_cls = transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration
    else:
        vision.update(hidden_size=16, out_hidden_size=32, intermediate_size=32, window_size=56,
                      fullatt_block_indexes=[0])
        config_cls, model_cls = transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration
    config = config_cls(text_config=_llm(tok, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
                        vision_config=vision, image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))
    _save(_seeded(lambda: model_cls(config)), tok, folder)
    video = {"video_processor_type": "Qwen2VLVideoProcessor", "min_pixels": QWEN_PIXELS[0],
             "max_pixels": QWEN_PIXELS[1], "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}
    processor = "Qwen2VLProcessor" if version == "2" else "Qwen2_5_VLProcessor"
    _write_processor(folder, processor, CHATML, image_processor=image_processor.to_dict(), video_processor=video)
    return folder


def build_qwen2_vl(folder: Path) -> Path:
    """Qwen2-VL (``Qwen2VLForConditionalGeneration``): dynamic resolution, 14-px patches merged 2x2."""
    return _qwen(folder, "2")


def build_qwen2_5_vl(folder: Path) -> Path:
    """Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): window attention in the vision tower."""
    return _qwen(folder, "2.5")


def qwen_tokens(sizes: Sequence[tuple[int, int]]) -> int:
    """Image tokens for 28-multiple sizes within :data:`QWEN_PIXELS` (no resize): one per 28x28 block."""
    return sum((h // 28) * (w // 28) for h, w in sizes)


# --- Gemma 3 / MedGemma: a fixed number of soft tokens per image ----------------------------------------------

def build_gemma3(folder: Path) -> Path:
    """Gemma 3 (``Gemma3ForConditionalGeneration``; MedGemma is the same architecture): SigLIP + pooled tokens."""
    import transformers

    tok = chat_tokenizer(
        ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"],
        {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
        bos="<bos>", eos="<eos>")
    ids = tok.convert_tokens_to_ids
    config = transformers.Gemma3Config(
        text_config=_llm(tok, head_dim=16, sliding_window=64),
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        mm_tokens_per_image=GEMMA_TOKENS, boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"), image_token_index=ids("<image_soft_token>"))
    _save(_seeded(lambda: transformers.Gemma3ForConditionalGeneration(config)), tok, folder)
    image_processor = transformers.Gemma3ImageProcessor(size={"height": 32, "width": 32})
    _write_processor(folder, "Gemma3Processor", GEMMA, image_processor=image_processor.to_dict(),
                     image_seq_length=GEMMA_TOKENS)
    return folder


def gemma_tokens(sizes: Sequence[tuple[int, int]]) -> int:
    """Soft image tokens: :data:`GEMMA_TOKENS` per image whatever its size."""
    return GEMMA_TOKENS * len(sizes)


# --- Idefics3 / SmolVLM: image split into tiles, each tile and a global view get a fixed token block ----------

_IDEFICS_SPECIALS = ["<|im_start|>", "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                     *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))]


def _idefics(folder: Path, family: str) -> Path:
    import transformers

    tok = chat_tokenizer(_IDEFICS_SPECIALS, {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                                             "end_of_utterance_token": "<end_of_utterance>",
                                             "global_image_token": "<global-img>"})
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": IDEFICS_SIDE, "patch_size": 8}
    common = {"text_config": _llm(tok), "vision_config": vision, "scale_factor": 2,
              "image_token_id": tok.convert_tokens_to_ids("<image>")}
    sizes = {"size": {"longest_edge": 2 * IDEFICS_SIDE}, "max_image_size": {"longest_edge": IDEFICS_SIDE}}
    if family == "idefics3":
        config = transformers.Idefics3Config(**common)
        model_cls, processor = transformers.Idefics3ForConditionalGeneration, "Idefics3Processor"
        image_processor = transformers.Idefics3ImageProcessor(do_image_splitting=True, **sizes)
    else:
        config = transformers.SmolVLMConfig(**common)
        model_cls, processor = transformers.SmolVLMForConditionalGeneration, "SmolVLMProcessor"
        image_processor = transformers.SmolVLMImageProcessor(do_image_splitting=True, **sizes)
    _save(_seeded(lambda: model_cls(config)), tok, folder)
    settings: dict[str, Any] = {"image_processor": image_processor.to_dict(), "image_seq_len": IDEFICS_SEQ}
    if family == "smolvlm":
        settings["video_processor"] = {"video_processor_type": "SmolVLMVideoProcessor"}
    _write_processor(folder, processor, IDEFICS, **settings)
    return folder


def build_idefics3(folder: Path) -> Path:
    """Idefics3 (``Idefics3ForConditionalGeneration``): SigLIP tiles + pixel shuffle."""
    return _idefics(folder, "idefics3")


def build_smolvlm(folder: Path) -> Path:
    """SmolVLM (``SmolVLMForConditionalGeneration``, the Idefics3 design with a video processor)."""
    return _idefics(folder, "smolvlm")


def idefics_tokens(sizes: Sequence[tuple[int, int]]) -> int:
    """Tokens: the longest edge is scaled to 2 tiles, each side rounded up to whole tiles; tiles + 1 global view."""
    total = 0
    for h, w in sizes:
        scale = 2 * IDEFICS_SIDE / max(h, w)
        rows, cols = math.ceil(h * scale / IDEFICS_SIDE), math.ceil(w * scale / IDEFICS_SIDE)
        total += IDEFICS_SEQ * (rows * cols + 1)
    return total


# --- InternVL (transformers-native "-hf" checkpoints) ------------------------------------------------------

def build_internvl(folder: Path) -> Path:
    """InternVL 3 in the transformers layout (``InternVLForConditionalGeneration``, ``OpenGVLab/InternVL3-*-hf``)."""
    import transformers

    tok = chat_tokenizer(["<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"],
                         {"start_image_token": "<img>", "end_image_token": "</img>",
                          "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"})
    config = transformers.InternVLConfig(
        text_config={"model_type": "qwen2", **_llm(tok)},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": [32, 32], "patch_size": [8, 8]},
        image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"), image_seq_length=INTERNVL_SEQ,
        downsample_ratio=0.5)
    _save(_seeded(lambda: transformers.InternVLForConditionalGeneration(config)), tok, folder)
    image_processor = transformers.GotOcr2ImageProcessor(size={"height": 32, "width": 32}, crop_to_patches=True,
                                                         min_patches=1, max_patches=1)
    _write_processor(folder, "InternVLProcessor", INTERNVL_CHATML, image_processor=image_processor.to_dict(),
                     video_processor={"video_processor_type": "InternVLVideoProcessor"},
                     image_seq_length=INTERNVL_SEQ)
    return folder


def internvl_tokens(sizes: Sequence[tuple[int, int]]) -> int:
    """``<IMG_CONTEXT>`` tokens: :data:`INTERNVL_SEQ` per image (``max_patches=1``: one 32-px tile, no thumbnail)."""
    return INTERNVL_SEQ * len(sizes)


FAMILIES: dict[str, tuple[Callable[[Path], Path], Callable[[Sequence[tuple[int, int]]], int]]] = {
    "qwen2-vl": (build_qwen2_vl, qwen_tokens),
    "qwen2.5-vl": (build_qwen2_5_vl, qwen_tokens),
    "gemma3": (build_gemma3, gemma_tokens),
    "idefics3": (build_idefics3, idefics_tokens),
    "smolvlm": (build_smolvlm, idefics_tokens),
    "internvl": (build_internvl, internvl_tokens),
}
