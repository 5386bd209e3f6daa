"""Configuration of the ROSALIA-style LISA model (ILS.md §17): one frozen dataclass recorded in ``checkpoint.json``.

Every default is the paper configuration of §17.4 (ILS.md §18.2: deviations are explicit overrides):
LoRA r 128 / α 256 / dropout 0.05 on every ``Linear`` outside SAM, the CLIP tower, ``mm_projector`` and
``text_hidden_fcs``; loss weights λ_txt 0.5, λ_bce 5.0, λ_dice 1.0; AdamW lr 3e-4, betas (0.9, 0.95),
weight decay 0; 100 linear warm-up steps from 0, then linear decay to 0; gradient clipping 1.0; 15 epochs;
global batch 256 (§17.4: 128 per GPU × 2 GPUs) reached by gradient accumulation over ``micro_batch_size``;
sequences of at most 512 tokens (image patches included); SAM canvas 1024 (the single configuration
point of the SAM frame, §18.4); CLIP centre crop (``clip_mode="pad"`` = pad-to-square, §18.10);
histogram equalisation with probability 0.5 during training (§17.2, §18.11).

Model sources are local paths only (nothing is downloaded): ``base_model`` (a converted cxrground LISA
checkpoint or a folder in the released LISA/ROSALIA layout), ``sam_checkpoint`` (``sam_vit_h_4b8939.pth``
or a transformers SAM folder, used when the base has no SAM weights), ``clip`` (a local CLIP ViT-L/14
folder, used when the base does not store the tower), ``tokenizer`` (defaults to the base folder).
``tiny=True`` builds a random tiny architecture and tokenizer instead (tests, smoke runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from cxrground.errors import ConfigError
from cxrground.fields import check_non_negative
from cxrground.registry import strict_bool

__all__ = ["CLIP_MODES", "DISTRIBUTED_MODES", "TINY_DEFAULTS", "LisaConfig"]

#: CLIP-branch geometry: ``center_crop`` (shortest side to the CLIP size, centre crop; the released
#: weights' preprocessing) or ``pad`` (pad to a square with the CLIP mean colour, then resize).
CLIP_MODES: tuple[str, str] = ("center_crop", "pad")

#: Training process layout (:mod:`cxrground.models.lisa.distributed`): ``auto`` = data-parallel when launched
#: with ``WORLD_SIZE`` > 1 (torchrun / accelerate launch), DeepSpeed ZeRO-2 under a DeepSpeed launch, ``ddp`` = always
#: join a process group, ``deepspeed`` = DeepSpeed ZeRO-2 (:mod:`cxrground.models.lisa.zero`). Results do not depend
#: on it (up to float rounding), so it is not part of a resume state's identity.
DISTRIBUTED_MODES: tuple[str, str, str] = ("auto", "ddp", "deepspeed")

#: Defaults replaced when ``tiny=True`` (random tiny architecture on CPU).
TINY_DEFAULTS: dict[str, Any] = {
    "sam_image_size": 64, "max_length": 160, "batch_size": 2, "micro_batch_size": 2, "epochs": 1,
    "warmup_steps": 2, "lora_r": 8, "lora_alpha": 16, "max_new_tokens": 24, "gradient_checkpointing": False,
    "lr": 1e-3, "save_every_steps": 50,
}


@dataclass(frozen=True)
class LisaConfig:
    """Training, loss, preprocessing and inference settings (defaults = ILS.md §17; see the module docstring)."""

    # model sources (local paths) / tiny random configuration
    base_model: str | None = None
    sam_checkpoint: str | None = None
    clip: str | None = None
    tokenizer: str | None = None
    tiny: bool = False
    # LoRA (§17.4)
    lora_r: int = 128
    lora_alpha: int = 256
    lora_dropout: float = 0.05
    # losses (§17.3)
    w_txt: float = 0.5
    w_bce: float = 5.0
    w_dice: float = 1.0
    # optimisation (§17.4)
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    warmup_steps: int = 100
    grad_clip: float = 1.0
    epochs: int = 15
    batch_size: int = 256
    micro_batch_size: int = 8
    max_steps: int | None = None
    gradient_checkpointing: bool = True
    dtype: str = "auto"
    # sequence / preprocessing (§17.2, §4.1)
    max_length: int = 512
    sam_image_size: int = 1024
    clip_mode: str = "center_crop"
    hist_eq_p: float = 0.5
    mm_vision_select_layer: int = -2
    # inference (§17.5)
    max_new_tokens: int = 512
    # bookkeeping
    save_every_steps: int = 200
    val_limit: int | None = None
    threads: int | None = None
    distributed: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if self.clip_mode not in CLIP_MODES:
            raise ConfigError(f"clip_mode must be one of {CLIP_MODES}, got {self.clip_mode!r}")
        if not 0.0 <= self.hist_eq_p <= 1.0:
            raise ConfigError(f"hist_eq_p must be in [0, 1], got {self.hist_eq_p}")
        for name in ("lora_r", "epochs", "batch_size", "micro_batch_size", "max_length", "sam_image_size",
                     "max_new_tokens", "save_every_steps"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.batch_size % self.micro_batch_size:
            raise ConfigError(f"batch_size {self.batch_size} must be a multiple of micro_batch_size "
                              f"{self.micro_batch_size}")
        if self.distributed not in DISTRIBUTED_MODES:
            raise ConfigError(f"distributed must be one of {DISTRIBUTED_MODES}, got {self.distributed!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto/float32/bfloat16/float16, got {self.dtype!r}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"betas must be two numbers in [0, 1), e.g. 0.9,0.95, got {self.betas}")
        check_non_negative(self, ("lr", "weight_decay", "grad_clip", "lora_dropout", "w_txt", "w_bce", "w_dice"))
        if int(self.warmup_steps) < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps!r}")
        if not self.tiny and self.base_model is None:
            raise ConfigError("set base_model=<local LISA/ROSALIA folder or converted checkpoint>, or tiny=true")

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimiser step."""
        return self.batch_size // self.micro_batch_size

    @classmethod
    def tiny_defaults(cls, **overrides: Any) -> LisaConfig:
        """The random tiny architecture's configuration (CPU tests): :data:`TINY_DEFAULTS` + ``overrides``."""
        return cls.from_overrides({"tiny": True, **overrides})

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any] | None = None) -> LisaConfig:
        """Defaults + ``overrides`` (CLI strings coerced; unknown keys are a :class:`ConfigError`).

        With ``tiny`` true the defaults are first replaced by :data:`TINY_DEFAULTS` (small canvas and batch,
        LoRA r 8); loss weights, LoRA targets and the schedule's shape stay those of §17.
        """
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides or {}) - set(known))
        if unknown:
            raise ConfigError(f"unknown lisa setting(s) {unknown}; known: {sorted(known)}")
        try:
            values = {k: _coerce(known[k].type, v, k) for k, v in (overrides or {}).items()}
            if values.get("tiny"):
                values = {**TINY_DEFAULTS, **values}
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad lisa settings {dict(overrides or {})}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record."""
        data = asdict(self)
        data["betas"] = list(self.betas)
        return data




def _coerce(annotation: Any, value: Any, key: str = "") -> Any:
    """Turn CLI strings (``--set key=value``) into the field's type."""
    if not isinstance(value, str):
        return value
    text = str(annotation)
    if value.lower() in ("none", "null") and "None" in text:
        return None
    if text.startswith("bool"):
        return strict_bool(key, value)
    if text.startswith("int"):
        return int(value)
    if text.startswith("float"):
        return float(value)
    if text.startswith("tuple"):
        return tuple(float(v) for v in value.strip("()[] ").split(","))
    return value
