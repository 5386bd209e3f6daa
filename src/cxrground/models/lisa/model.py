"""``LisaForSegmentation``: the LISA / ROSALIA architecture (ILS.md §17.1) from ``transformers`` components.

Modules (their names are the state-dict prefixes of a cxrground LISA checkpoint):

- ``language_model``: ``LlamaForCausalLM`` (the LLaVA language model, vocabulary resized for the added tokens);
- ``vision_tower``: ``CLIPVisionModel``; features = hidden states of layer ``select_layer`` (−2), CLS dropped
  (256 patch tokens for ViT-L/14 at 224 px);
- ``mm_projector``: a single ``Linear`` (LLaVA v1 / LISA), CLIP width → LLM width;
- ``visual_model``: ``SamModel`` (vision encoder frozen and always run under ``no_grad``; prompt encoder; mask
  decoder). No points, boxes or dense prompts; ``multimask_output=False``; one mask per sample;
- ``text_hidden_fcs``: Linear(h→h) → ReLU → Linear(h→256) → Dropout(0) on the **last-layer** hidden state at the
  position that *predicts* ``[SEG]`` (the token just before it); its output is the single sparse prompt.

Exactly one ``[SEG]`` per sample is used (the first); a training sample without ``[SEG]`` is an error.
LoRA (peft) is injected by :func:`prepare_for_training` on every ``Linear`` outside SAM, the CLIP tower,
``mm_projector`` and ``text_hidden_fcs`` (ILS.md §17.4); fully trained: ``lm_head``, ``embed_tokens``, the SAM
mask decoder and ``text_hidden_fcs``; everything else is frozen. :func:`merged_state_dict` folds the LoRA
deltas into the base weights without touching the live model (checkpoints store merged weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch
import torch.nn.functional as F
from torch import nn

from cxrground.models.lisa.text import IGNORE_INDEX, IMAGE_PLACEHOLDER, Encoded
from cxrground.models.losses import dice_loss, sigmoid_bce

__all__ = [
    "FROZEN_PREFIXES",
    "LORA_EXCLUDED_PREFIXES",
    "TRAINED_PARTS",
    "LisaForSegmentation",
    "LisaLoss",
    "build_arch",
    "clip_vit_l14_config",
    "lora_target_names",
    "merged_state_dict",
    "prepare_for_training",
    "sam_config",
    "tiny_arch",
]

#: Module prefixes whose ``Linear`` layers never get LoRA (ILS.md §17.4).
LORA_EXCLUDED_PREFIXES: Final[tuple[str, ...]] = ("visual_model", "vision_tower", "mm_projector", "text_hidden_fcs")
#: Parameter-name fragments that are fully trained (LISA's rule: substring match).
TRAINED_PARTS: Final[tuple[str, ...]] = ("lm_head", "embed_tokens", "mask_decoder", "text_hidden_fcs")
#: Frozen parts (documentation and tests): CLIP tower, projector, SAM image and prompt encoders.
FROZEN_PREFIXES: Final[tuple[str, ...]] = ("vision_tower.", "mm_projector.", "visual_model.vision_encoder.",
                                           "visual_model.prompt_encoder.", "visual_model.shared_image_embedding")


def clip_vit_l14_config() -> dict[str, Any]:
    """CLIP ViT-L/14 at 224 px (``openai/clip-vit-large-patch14`` vision tower)."""
    return {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
            "image_size": 224, "patch_size": 14, "projection_dim": 768, "hidden_act": "quick_gelu"}


def sam_config(hidden: int = 1280, layers: int = 32, heads: int = 16, global_attn: Sequence[int] = (7, 15, 23, 31),
               image_size: int = 1024, patch_size: int = 16, window: int = 14, prompt_dim: int = 256,
               mlp_dim: int | None = None, decoder_mlp: int = 2048, decoder_heads: int = 8,
               mask_input_channels: int = 16) -> dict[str, Any]:
    """``SamConfig`` kwargs; the defaults are SAM ViT-H (``sam_vit_h_4b8939.pth``)."""
    return {
        "vision_config": {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                          "global_attn_indexes": list(global_attn), "image_size": image_size,
                          "patch_size": patch_size, "window_size": window, "output_channels": prompt_dim,
                          "num_pos_feats": prompt_dim // 2, "mlp_dim": mlp_dim or hidden * 4},
        "prompt_encoder_config": {"hidden_size": prompt_dim, "image_size": image_size, "patch_size": patch_size,
                                  "mask_input_channels": mask_input_channels},
        "mask_decoder_config": {"hidden_size": prompt_dim, "mlp_dim": decoder_mlp, "num_attention_heads": decoder_heads,
                                "iou_head_hidden_dim": prompt_dim},
    }


def tiny_arch(vocab_size: int, sam_size: int = 64) -> dict[str, Any]:
    """A random tiny architecture for CPU tests (same module structure as the 7B + SAM-H model; the mask decoder
    keeps SAM's 8 heads, which the converter assumes)."""
    return {
        "llm": {"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 512,
                "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
        "clip": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
                 "image_size": 32, "patch_size": 8, "projection_dim": 32},
        "sam": sam_config(hidden=32, layers=2, heads=2, global_attn=(1,), image_size=sam_size, patch_size=16,
                          window=2, prompt_dim=32, mlp_dim=64, decoder_mlp=64, decoder_heads=8, mask_input_channels=8),
    }


def build_arch(llm: dict[str, Any], clip: dict[str, Any] | None = None, sam: dict[str, Any] | None = None) -> dict:
    """An architecture record (JSON-ready): LLaMA config, CLIP vision config (ViT-L/14), SAM config (ViT-H)."""
    return {"llm": dict(llm), "clip": dict(clip or clip_vit_l14_config()), "sam": dict(sam or sam_config())}


@dataclass
class LisaLoss:
    """The loss terms of one batch (ILS.md §17.3) and the low-resolution mask logits."""

    total: torch.Tensor
    txt: torch.Tensor
    bce: torch.Tensor
    dice: torch.Tensor
    low_res: torch.Tensor


class LisaForSegmentation(nn.Module):
    """LLaVA (LLaMA + CLIP + linear projector) + SAM + ``[SEG]`` projection (see the module docstring)."""

    def __init__(self, arch: dict[str, Any], seg_token_id: int, select_layer: int = -2) -> None:
        super().__init__()
        from transformers import CLIPVisionConfig, CLIPVisionModel, LlamaConfig, LlamaForCausalLM, SamConfig, SamModel

        self.arch = arch
        self.seg_token_id = int(seg_token_id)
        self.select_layer = int(select_layer)
        self.language_model = LlamaForCausalLM(LlamaConfig.from_dict(dict(arch["llm"])))
        self.vision_tower = CLIPVisionModel(CLIPVisionConfig.from_dict(dict(arch["clip"])))
        hidden = self.language_model.config.hidden_size
        self.mm_projector = nn.Linear(self.vision_tower.config.hidden_size, hidden)
        self.visual_model = SamModel(SamConfig.from_dict(dict(arch["sam"])))
        out_dim = self.visual_model.config.prompt_encoder_config.hidden_size
        self.text_hidden_fcs = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(inplace=True),
                                             nn.Linear(hidden, out_dim), nn.Dropout(0.0))

    # --- sizes -----------------------------------------------------------------------------------
    @property
    def clip_size(self) -> int:
        """CLIP input side (224 for ViT-L/14)."""
        return int(self.vision_tower.config.image_size)

    @property
    def sam_size(self) -> int:
        """SAM canvas side (1024 for SAM ViT-H)."""
        return int(self.visual_model.config.vision_config.image_size)

    @property
    def n_image_tokens(self) -> int:
        """Patch tokens that replace ``<image>`` (256 for ViT-L/14 at 224 px)."""
        return (self.clip_size // int(self.vision_tower.config.patch_size)) ** 2

    # --- encoders --------------------------------------------------------------------------------
    def image_features(self, clip_pixels: torch.Tensor) -> torch.Tensor:
        """``(B, P, h)`` projected CLIP patch features (layer ``select_layer``, CLS dropped)."""
        out = self.vision_tower(clip_pixels.to(self.mm_projector.weight.dtype), output_hidden_states=True)
        return self.mm_projector(out.hidden_states[self.select_layer][:, 1:])

    def sam_embeddings(self, sam_pixels: torch.Tensor) -> torch.Tensor:
        """SAM image embeddings; the image encoder is frozen and always run without gradients."""
        encoder = self.visual_model.vision_encoder
        with torch.no_grad():
            dtype = encoder.patch_embed.projection.weight.dtype
            return encoder(sam_pixels.to(dtype)).last_hidden_state

    def seg_low_res(self, seg_hidden: torch.Tensor, image_embeddings: torch.Tensor) -> torch.Tensor:
        """``(B, h', w')`` low-resolution mask logits from the ``[SEG]`` hidden states ``(B, hidden)``."""
        sam = self.visual_model
        prompt = self.text_hidden_fcs(seg_hidden)
        batch = image_embeddings.shape[0]
        sparse = prompt[:, None, None, :].to(image_embeddings.dtype)
        _, dense = sam.prompt_encoder(None, None, None, None)
        dense = dense.expand(batch, -1, -1, -1)
        pos = sam.get_image_wide_positional_embeddings().repeat(batch, 1, 1, 1)
        masks, _ = sam.mask_decoder(image_embeddings=image_embeddings, image_positional_embeddings=pos,
                                    sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                    multimask_output=False)
        return masks[:, 0, 0]

    def canvas_logits(self, low_res: torch.Tensor) -> torch.Tensor:
        """Low-resolution logits upsampled (bilinear) to the SAM canvas ``(B, S, S)``."""
        return F.interpolate(low_res[:, None].float(), size=(self.sam_size, self.sam_size), mode="bilinear",
                             align_corners=False)[:, 0]

    # --- sequences -------------------------------------------------------------------------------
    def build_inputs(self, encoded: Sequence[Encoded], features: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[int]]]:
        """Splice image features into the token embeddings; right-pad.

        Returns ``inputs_embeds (B, L, h)``, ``attention_mask (B, L)``, ``labels (B, L)`` and the expanded token
        lists (image positions = :data:`IMAGE_PLACEHOLDER`).
        """
        embed = self.language_model.get_input_embeddings()
        rows, labels, tokens = [], [], []
        for enc, feats in zip(encoded, features, strict=True):
            ids = list(enc.input_ids)
            lab = list(enc.labels)
            if ids.count(IMAGE_PLACEHOLDER) != 1:
                found = ids.count(IMAGE_PLACEHOLDER)
                raise ValueError(f"a sequence needs exactly one image placeholder, found {found}")
            at = ids.index(IMAGE_PLACEHOLDER)
            n = feats.shape[0]
            ids_t = torch.tensor([0 if i == IMAGE_PLACEHOLDER else i for i in ids], device=feats.device)
            emb = embed(ids_t)
            rows.append(torch.cat([emb[:at], feats.to(emb.dtype), emb[at + 1:]], 0))
            labels.append(lab[:at] + [IGNORE_INDEX] * n + lab[at + 1:])
            tokens.append(ids[:at] + [IMAGE_PLACEHOLDER] * n + ids[at + 1:])
        length = max(r.shape[0] for r in rows)
        hidden = rows[0].shape[1]
        batch = len(rows)
        embeds = rows[0].new_zeros((batch, length, hidden))
        mask = torch.zeros((batch, length), dtype=torch.long, device=embeds.device)
        label_t = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long, device=embeds.device)
        for b, (r, lab) in enumerate(zip(rows, labels, strict=True)):
            embeds[b, :r.shape[0]] = r
            mask[b, :r.shape[0]] = 1
            label_t[b, :r.shape[0]] = torch.tensor(lab, device=embeds.device)
        return embeds, mask, label_t, tokens

    def seg_positions(self, tokens: Sequence[Sequence[int]]) -> list[int]:
        """Index of the position that predicts the first ``[SEG]`` of each expanded sequence (error if none)."""
        out = []
        for b, seq in enumerate(tokens):
            seq = list(seq)
            if self.seg_token_id not in seq:
                raise ValueError(f"sample {b} has no [SEG] token (truncated or malformed answer)")
            out.append(seq.index(self.seg_token_id) - 1)
        return out

    # --- training forward ------------------------------------------------------------------------
    def valid_canvas(self, valid_hw: Sequence[Sequence[int]], device: torch.device | str | None = None
                     ) -> torch.Tensor:
        """``(B, S, S)`` bool: the un-padded region ``[:h, :w]`` of each sample's SAM canvas (``valid_hw`` = the
        resized image sizes, :attr:`Letterbox.resized_hw <cxrground.io.transform.Letterbox.resized_hw>`)."""
        size = self.sam_size
        valid = torch.zeros((len(valid_hw), size, size), dtype=torch.bool, device=device)
        for b, (h, w) in enumerate(valid_hw):
            h, w = int(h), int(w)
            if not (0 < h <= size and 0 < w <= size):
                raise ValueError(f"sample {b}: resized size {(h, w)} does not fit the {size}² SAM canvas")
            valid[b, :h, :w] = True
        return valid

    def forward(self, encoded: Sequence[Encoded], clip_pixels: torch.Tensor, sam_pixels: torch.Tensor,
                gt_masks: torch.Tensor, valid_hw: Sequence[Sequence[int]] | None = None,
                weights: tuple[float, float, float] = (0.5, 5.0, 1.0)) -> LisaLoss:
        """Teacher-forced pass: ``L = w_txt·L_txt + w_bce·L_bce + w_dice·L_dice`` (ILS.md §17.3).

        ``gt_masks`` are ``(B, S, S)`` canvas targets (0/1; all zero for negatives). The text loss is the mean
        next-token cross-entropy over the answer tokens; BCE over every mask, Dice over the non-empty ones.
        ``valid_hw``: each sample's resized image size on the canvas; the mask losses then cover that un-padded
        region ``[:h, :w]`` only, as in the reference (the padding is never supervised). ``None``: the whole canvas.
        """
        embeds, attn, labels, tokens = self.build_inputs(encoded, self.image_features(clip_pixels))
        out = self.language_model(inputs_embeds=embeds, attention_mask=attn, output_hidden_states=True)
        logits = out.logits[:, :-1].float()
        target = labels[:, 1:]
        txt = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE_INDEX)
        last = out.hidden_states[-1]
        pos = torch.tensor(self.seg_positions(tokens), device=last.device)
        seg_hidden = last[torch.arange(last.shape[0], device=last.device), pos]
        low_res = self.seg_low_res(seg_hidden, self.sam_embeddings(sam_pixels))
        pred = self.canvas_logits(low_res)
        gt = gt_masks.to(pred.device, pred.dtype)
        valid = None if valid_hw is None else self.valid_canvas(valid_hw, pred.device)
        bce = sigmoid_bce(pred, gt, valid)
        dice = dice_loss(pred, gt, valid)
        w_txt, w_bce, w_dice = weights
        return LisaLoss(w_txt * txt + w_bce * bce + w_dice * dice, txt, bce, dice, low_res)

    # --- inference -------------------------------------------------------------------------------
    @torch.no_grad()
    def teacher_forced_low_res(self, encoded: Sequence[Encoded], clip_pixels: torch.Tensor,
                               sam_pixels: torch.Tensor) -> torch.Tensor:
        """Low-resolution logits from the ``[SEG]`` of the ground-truth answers (teacher-forced segmentation)."""
        embeds, attn, _, tokens = self.build_inputs(encoded, self.image_features(clip_pixels))
        out = self.language_model(inputs_embeds=embeds, attention_mask=attn, output_hidden_states=True)
        last = out.hidden_states[-1]
        pos = torch.tensor(self.seg_positions(tokens), device=last.device)
        seg_hidden = last[torch.arange(last.shape[0], device=last.device), pos]
        return self.seg_low_res(seg_hidden, self.sam_embeddings(sam_pixels))

    @torch.no_grad()
    def generate(self, encoded: Encoded, clip_pixels: torch.Tensor, sam_pixels: torch.Tensor, *,
                 max_new_tokens: int, eos_token_id: int, pad_token_id: int) -> tuple[list[int], torch.Tensor | None]:
        """Greedy decoding (one beam) of one prompt; returns the new token ids and, when a ``[SEG]`` was generated,
        the low-resolution mask logits ``(h', w')`` from the hidden state that predicted it (else None)."""
        from transformers import GenerationConfig

        embeds, attn, _, _ = self.build_inputs([encoded], self.image_features(clip_pixels))
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                  eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                                  output_hidden_states=True, return_dict_in_generate=True)
        out = self.language_model.generate(inputs_embeds=embeds, attention_mask=attn, generation_config=config)
        new = [int(t) for t in out.sequences[0].tolist()]
        if self.seg_token_id not in new:
            return new, None
        step = new.index(self.seg_token_id)
        seg_hidden = out.hidden_states[step][-1][:, -1]
        return new, self.seg_low_res(seg_hidden, self.sam_embeddings(sam_pixels))[0]


# --- LoRA / trainable parts ----------------------------------------------------------------------
def lora_target_names(model: nn.Module) -> list[str]:
    """Full names of every ``nn.Linear`` outside :data:`LORA_EXCLUDED_PREFIXES` (LLM projections + ``lm_head``)."""
    return [name for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and not name.startswith(LORA_EXCLUDED_PREFIXES)]


def prepare_for_training(model: LisaForSegmentation, r: int, alpha: int, dropout: float) -> list[str]:
    """Inject LoRA (bias none) into :func:`lora_target_names` and set the trainable/frozen parts; returns the
    wrapped module names."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = lora_target_names(model)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none", target_modules=targets)
    inject_adapter_in_model(config, model)
    for name, param in model.named_parameters():
        param.requires_grad = "lora_" in name or any(part in name for part in TRAINED_PARTS)
    return targets


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights with every LoRA delta folded into its base layer (plain names, no adapters)."""
    from peft.tuners.lora import LoraLayer

    state = {}
    deltas: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            base = module.get_base_layer()
            delta = sum((module.get_delta_weight(a) for a in module.active_adapters), torch.zeros_like(base.weight))
            deltas[f"{name}.weight"] = (base.weight + delta).detach()
    for key, value in model.state_dict().items():
        if "lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        state[key] = deltas.get(key, value).detach().clone().contiguous()
    return state
