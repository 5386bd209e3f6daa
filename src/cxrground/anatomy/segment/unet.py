"""The built-in lung U-Net: architecture, pre-processing and the model file format.

Network: a plain U-Net (double 3×3 conv + batch norm + ReLU per level, 2×2 max-pool down, 2×2 transposed
conv up, skip concatenation, 1×1 head). Input: one grey channel on a ``size``² letterboxed canvas
(:meth:`~cxrground.io.transform.Letterbox.fit`, centred, zero padding). Output: one logit per class
(``right_lung``, ``left_lung``; sigmoid, independent channels).

Normalisation (``zscore-valid``): pixels / 255, then minus the mean and over the standard deviation of the
*un-padded* canvas region; the padding is set to 0 after normalisation. It removes most exposure and
windowing differences between sources.

Model file format: ``NAME.safetensors`` (the state dict; float tensors may be stored as float16 and are
loaded as float32) plus the sidecar ``NAME.json``::

    {"format": "cxrground-unet/1", "name": ..., "architecture": UNetConfig.to_dict(),
     "input": {"size": 256, "channels": "grey", "letterbox": "fit-center", "pad_value": 0},
     "normalisation": {"kind": "zscore-valid", "eps": 1e-6}, "classes": [...], "activation": "sigmoid",
     "threshold": 0.5, "storage_dtype": "float16", "training": {...recipe, seconds...},
     "data": {...images used, with licences...}, "metrics": {...}, "heart": "...",
     "sha256": "<sha256 of the .safetensors file>", "software": {...}}

torch and safetensors are imported inside the functions that need them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from cxrground.errors import ConfigError, InputError
from cxrground.io.files import atomic_path, model_paths, read_model_sidecar, sha256_file
from cxrground.io.transform import Letterbox
from cxrground.io.weights import load_safetensors

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "CLASSES",
    "FORMAT",
    "UNetConfig",
    "build_unet",
    "count_parameters",
    "load_model",
    "load_weights_into",
    "normalise_canvas",
    "prepare_input",
    "read_sidecar",
    "save_model",
    "sha256_file",
    "update_sidecar",
]

FORMAT: Final[str] = "cxrground-unet/1"
CLASSES: Final[tuple[str, str]] = ("right_lung", "left_lung")
NORM_EPS: Final[float] = 1e-6


@dataclass(frozen=True)
class UNetConfig:
    """Architecture of the U-Net; ``channels[i]`` is the width of level ``i`` (level 0 at full size)."""

    channels: tuple[int, ...] = (8, 16, 32, 64, 128, 192)
    in_channels: int = 1
    out_channels: int = 2
    input_size: int = 256
    classes: tuple[str, ...] = field(default=CLASSES)

    def __post_init__(self) -> None:
        chans = tuple(int(c) for c in self.channels)
        object.__setattr__(self, "channels", chans)
        object.__setattr__(self, "classes", tuple(self.classes))
        if len(chans) < 2 or min(chans) < 1:
            raise ConfigError(f"channels needs at least two positive widths, got {self.channels}")
        if self.input_size % (2 ** (len(chans) - 1)):
            raise ConfigError(f"input_size {self.input_size} must be divisible by 2**{len(chans) - 1}")
        if len(self.classes) != self.out_channels:
            raise ConfigError(f"{self.out_channels} output channels but {len(self.classes)} class names")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = asdict(self)
        return {**d, "channels": list(self.channels), "classes": list(self.classes)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UNetConfig:
        """Inverse of :meth:`to_dict`."""
        known = {k: data[k] for k in ("channels", "in_channels", "out_channels", "input_size", "classes") if k in data}
        return cls(**known)


@functools.cache
def _unet_class() -> type:
    import torch
    import torch.nn.functional as F
    from torch import nn

    def double_conv(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        )

    class UNet(nn.Module):
        """Plain U-Net; ``forward`` maps ``(N, in, S, S)`` to logits ``(N, out, S, S)``."""

        def __init__(self, config: UNetConfig) -> None:
            super().__init__()
            ch = config.channels
            self.config = config
            self.down = nn.ModuleList(
                [double_conv(config.in_channels if i == 0 else ch[i - 1], c) for i, c in enumerate(ch)]
            )
            self.up = nn.ModuleList([nn.ConvTranspose2d(ch[i + 1], ch[i], 2, stride=2) for i in range(len(ch) - 1)])
            self.dec = nn.ModuleList([double_conv(2 * ch[i], ch[i]) for i in range(len(ch) - 1)])
            self.head = nn.Conv2d(ch[0], config.out_channels, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            skips = []
            for i, block in enumerate(self.down):
                if i:
                    x = F.max_pool2d(x, 2)
                x = block(x)
                skips.append(x)
            for i in reversed(range(len(self.up))):
                x = self.dec[i](torch.cat([self.up[i](x), skips[i]], dim=1))
            return self.head(x)

    return UNet


def build_unet(config: UNetConfig | None = None) -> torch.nn.Module:
    """A freshly initialised U-Net (torch's default initialisation; seed torch first for determinism)."""
    return _unet_class()(config or UNetConfig())


def count_parameters(model: torch.nn.Module) -> int:
    """Number of trainable parameters."""
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))


# --- pre-processing ---------------------------------------------------------------------------------

def normalise_canvas(canvas: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """``zscore-valid``: canvas in [0, 1] → zero mean, unit std over ``valid``; 0 outside ``valid``."""
    vals = canvas[valid]
    if vals.size == 0:
        return np.zeros_like(canvas, dtype=np.float32)
    mean, std = float(vals.mean()), float(vals.std())
    out = (canvas - mean) / max(std, NORM_EPS)
    out[~valid] = 0.0
    return out.astype(np.float32)


def prepare_input(pixels: np.ndarray, size: int = 256) -> tuple[np.ndarray, Letterbox]:
    """Grey uint8 ``(H, W)`` → normalised ``(size, size)`` float32 canvas and its :class:`Letterbox`."""
    box = Letterbox.fit(pixels.shape[:2], size)
    canvas = box.image_to_canvas(pixels).astype(np.float32) / 255.0
    valid = np.zeros(box.canvas_hw, dtype=bool)
    valid[box.valid_region()] = True
    return normalise_canvas(canvas, valid), box


# --- model files ------------------------------------------------------------------------------------

def save_model(
    model: torch.nn.Module,
    config: UNetConfig,
    path: str | Path,
    sidecar: dict[str, Any] | None = None,
    storage_dtype: str = "float16",
) -> tuple[Path, Path]:
    """Write ``path.safetensors`` + ``path.json``; returns both paths. The sidecar gets the sha256."""
    import torch
    from safetensors.torch import save_file

    if storage_dtype not in ("float16", "float32"):
        raise ConfigError(f"storage_dtype must be float16 or float32, got {storage_dtype!r}")
    dtype = torch.float16 if storage_dtype == "float16" else torch.float32
    weights_path, json_path = model_paths(path)
    weights_path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in model.state_dict().items():
        t = v.detach().cpu()
        tensors[k] = (t.to(dtype) if t.is_floating_point() else t).contiguous()
    with atomic_path(weights_path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": FORMAT})
    meta = {
        "format": FORMAT,
        "name": weights_path.stem,
        "architecture": config.to_dict(),
        "parameters": count_parameters(model),
        "input": {"size": config.input_size, "channels": "grey", "letterbox": "fit-center", "pad_value": 0},
        "normalisation": {"kind": "zscore-valid", "eps": NORM_EPS,
                          "detail": "pixels/255; (x - mean) / std over the un-padded canvas; padding = 0"},
        "classes": list(config.classes),
        "activation": "sigmoid",
        "threshold": 0.5,
        "storage_dtype": storage_dtype,
        **(sidecar or {}),
        "sha256": sha256_file(weights_path),
    }
    json_path.write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return weights_path, json_path


def read_sidecar(path: str | Path) -> dict[str, Any]:
    """The JSON sidecar of a model file (``path`` may name either file or the stem)."""
    return read_model_sidecar(path, FORMAT)


def update_sidecar(path: str | Path, updates: dict[str, Any]) -> dict[str, Any]:
    """Merge ``updates`` into a model's sidecar (top-level keys; ``sha256`` cannot be changed)."""
    _, json_path = model_paths(path)
    data = read_sidecar(json_path)
    data.update({k: v for k, v in updates.items() if k != "sha256"})
    json_path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return data


def load_model(path: str | Path, verify: bool = True) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Load ``path.safetensors`` + sidecar into an eval-mode float32 U-Net; checks the sha256."""
    weights_path, _ = model_paths(path)
    if not weights_path.is_file():
        raise ConfigError(f"model weights {weights_path} not found")
    meta = read_sidecar(weights_path)
    if verify:
        digest = sha256_file(weights_path)
        if digest != meta.get("sha256"):
            raise ConfigError(f"{weights_path}: sha256 {digest} does not match its sidecar ({meta.get('sha256')})")
    return load_weights_into(build_unet(UNetConfig.from_dict(meta["architecture"])), weights_path), meta


def load_weights_into(model: torch.nn.Module, weights_path: Path) -> torch.nn.Module:
    """``model`` in eval mode with the float32 weights of the safetensors file ``weights_path``; a file that cannot be
    decoded, or weights of another architecture, is a :class:`ConfigError` naming the file."""
    import torch

    try:
        stored = load_safetensors(weights_path)
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    try:
        model.load_state_dict({k: (v.to(torch.float32) if v.is_floating_point() else v) for k, v in stored.items()})
    except RuntimeError as exc:
        raise ConfigError(f"{weights_path}: weights do not fit the sidecar's architecture ({exc})") from exc
    return model.eval()


def predict_logits(
    model: torch.nn.Module, canvases: Sequence[np.ndarray] | np.ndarray, threads: int | None = None
) -> np.ndarray:
    """Logits ``(N, C, S, S)`` float32 for normalised canvases ``(N, S, S)`` (no gradient, eval mode).

    ``threads`` sets torch's intra-op thread count for this call only (restored afterwards). On a CPU
    shared with other busy processes, fewer threads than cores can be much faster (measured: 2 threads
    on 2 contended cores ~1.1 s per 256² image, 1 thread ~45 ms).
    """
    import torch

    batch = torch.from_numpy(np.ascontiguousarray(np.asarray(canvases, dtype=np.float32)))[:, None]
    was_training = model.training
    prev_threads = torch.get_num_threads()
    model.eval()
    try:
        if threads:
            torch.set_num_threads(int(threads))
        with torch.inference_mode():
            out = model(batch)
    finally:
        model.train(was_training)
        torch.set_num_threads(prev_threads)
    return out.numpy()
