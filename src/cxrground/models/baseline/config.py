"""Configuration of the CPU baseline ILS model (one frozen dataclass, recorded in ``checkpoint.json``).

Defaults: working canvas 128 px (longest side, centred letterbox), a 4-level U-Net (16-32-64-128
channels) with FiLM conditioning, AdamW (lr 2e-3, weight decay 1e-4, betas 0.9/0.95), linear warm-up then
cosine decay to 1 %, gradient clipping 1.0, batch 16, 2 intra-op threads. Loss weights: ``w_bce`` 5.0 and
``w_dice`` 1.0 as in ILS.md §17.3, presence BCE 1.0, lesion-type / certainty CE and location BCE 0.5 each.
Global positives name the location labels read off the predicted mask (``global_location="mask"``, default;
``"head"`` uses the multi-label location head instead). ``lung_weights``: the lung U-Net ``.safetensors`` whose
lungs feed the anatomy channels (empty: the shipped lung U-Net); ``checkpoint.json`` records which one was used
(``lungs``), and a checkpoint is neither resumed nor loaded with other lungs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from cxrground.errors import ConfigError
from cxrground.fields import check_non_negative
from cxrground.registry import strict_bool

__all__ = ["ANATOMY_CHOICES", "GLOBAL_LOCATION_CHOICES", "BaselineConfig"]

#: ``unet``: lung masks from the shipped lung U-Net feed the network and place the location labels;
#: ``none``: no anatomy input (ablation; the location channel is then empty).
ANATOMY_CHOICES: tuple[str, str] = ("unet", "none")

#: How a global positive's location labels are chosen at inference (see :mod:`.model`): ``mask`` from the
#: predicted mask and the location-label masks (default), ``head`` from the multi-label location head.
GLOBAL_LOCATION_CHOICES: tuple[str, str] = ("mask", "head")


@dataclass(frozen=True)
class BaselineConfig:
    """Architecture, training schedule and loss weights of the baseline (see the module docstring)."""

    size: int = 128
    channels: tuple[int, ...] = (16, 32, 64, 128)
    cond_hidden: int = 64
    head_hidden: int = 64
    anatomy: str = "unet"
    lung_weights: str = ""  # lung U-Net .safetensors for the anatomy channels; empty: the shipped one
    global_location: str = "mask"
    epochs: int = 20
    batch_size: int = 16
    lr: float = 2e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 20
    grad_clip: float = 1.0
    threads: int = 2
    w_bce: float = 5.0
    w_dice: float = 1.0
    w_presence: float = 1.0
    w_lesion: float = 0.5
    w_certainty: float = 0.5
    w_location: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(int(c) for c in self.channels))
        if len(self.channels) < 2 or min(self.channels) < 1:
            raise ConfigError(f"channels needs at least two positive widths, got {self.channels}")
        if self.size % (2 ** (len(self.channels) - 1)):
            raise ConfigError(f"size {self.size} must be divisible by 2**{len(self.channels) - 1}")
        if self.anatomy not in ANATOMY_CHOICES:
            raise ConfigError(f"anatomy must be one of {ANATOMY_CHOICES}, got {self.anatomy!r}")
        if self.global_location not in GLOBAL_LOCATION_CHOICES:
            raise ConfigError(f"global_location must be one of {GLOBAL_LOCATION_CHOICES}, "
                              f"got {self.global_location!r}")
        for name in ("size", "epochs", "batch_size", "threads", "cond_hidden", "head_hidden"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        check_non_negative(self, ("lr", "weight_decay", "grad_clip", "warmup_steps", "w_bce", "w_dice", "w_presence",
                                  "w_lesion", "w_certainty", "w_location"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "channels": list(self.channels)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BaselineConfig:
        """Inverse of :meth:`to_dict`; unknown keys are a :class:`ConfigError`."""
        return cls().with_overrides(data)

    def with_overrides(self, overrides: Mapping[str, Any] | None) -> BaselineConfig:
        """A copy with some fields replaced; string values (``--set key=value``) are parsed by field type."""
        if not overrides:
            return self
        fields = {f.name: f for f in dataclasses.fields(self)}
        values: dict[str, Any] = {}
        for key, value in overrides.items():
            if key not in fields:
                raise ConfigError(f"unknown baseline setting {key!r}; choose from {sorted(fields)}")
            values[key] = _parse(key, value, getattr(self, key))
        return dataclasses.replace(self, **values)


def _parse(key: str, value: Any, default: Any) -> Any:
    if not isinstance(value, str) or isinstance(default, str):
        return tuple(value) if isinstance(default, tuple) else value
    try:
        if isinstance(default, tuple):
            return tuple(int(v) for v in value.replace("(", "").replace(")", "").split(",") if v.strip())
        if isinstance(default, bool):
            return strict_bool(key, value)
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError as exc:
        raise ConfigError(f"bad value {value!r} for {key} ({exc})") from None
    return json.loads(value)
