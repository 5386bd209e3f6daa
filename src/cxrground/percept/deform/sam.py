"""SAM deformer (CHEXPERCEPT.md §7.3, reference backend) on a LOCAL ``transformers`` SAM checkpoint.

``SamModel`` / ``SamProcessor`` are loaded with ``from_pretrained(path, local_files_only=True)``; torch and
transformers are imported only when the model is first used. Prompts (:func:`build_prompts`):

* points: the refinement points (label 1; default the 64 px lattice of the mask), the expansion points
  (label 1) and the contraction points (label 0); a positive point whose mask-prompt value is ``≤ 0`` is
  dropped unless that would leave no positive point;
* mask prompt on SAM's low-resolution grid (``N = 4 × image_embedding_size``, 256 for SAM ViT; the reference
  SAM 3 used 288) in SAM's frame (longest side resized, padded bottom/right): the previous low-res logits
  (``−18.42`` everywhere when there are none, a documented choice), pixels inside the current mask set to
  ``18.42``; an :func:`organic_kernel` stamped at each expansion point (``value ← max(value, max·kernel)``
  where kernel > 0.1 and inside the lung union when one is given) and at each contraction point
  (``value ← min(value, low + (max − low)(1 − kernel))``, ``low = min − 2(max − min)``; ``min``/``max``
  taken after the expansion stamps). The kernel radius is 15 px of a 288 grid, scaled by ``N/288``.

Prediction keeps the top-scoring of the three multimask outputs and its low-res logits; the up-sampled mask
(logit > 0) gets the §6 clean-up. The caller checks the validity rule (random or weak weights may fail it,
which is then reported as an invalid step).

The model runs on ``device`` (default ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda:1``...) in ``dtype``
(``float32`` default, ``bfloat16``, ``float16``): pixel values, points and the mask prompt are cast to it, and the
logits are read back in float32.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from scipy import ndimage

from cxrground.errors import InputError
from cxrground.hf_offline import model_kwargs
from cxrground.io.masks import as_mask
from cxrground.percept.config import DeformConfig
from cxrground.percept.deform.base import Deformer, DeformRequest, DeformResult
from cxrground.percept.refine import Point, clean_mask, lattice_points

#: Floating-point types the SAM deformer may run in.
SAM_DTYPES = ("float32", "bfloat16", "float16")

__all__ = ["SAM_DTYPES", "SamDeformer", "SamPrompts", "build_prompts", "organic_kernel", "sam_frame", "save_tiny_sam",
           "to_lowres"]


def organic_kernel(radius: float, rng: np.random.Generator, config: DeformConfig | None = None) -> np.ndarray:
    """Return the §7.3 "organic" kernel, a ``(2R+1)²`` array in ``[0, 1]`` (``R = round(radius)`` ≥ 1).

    Noise: for each frequency ``f`` in (1, 2, 4) a ``(f+1)×(f+1)`` uniform grid is up-sampled (cubic spline) to
    the kernel size and divided by ``f``; the sum is normalised to ``[0, 1]``. Envelope:
    ``clip(1 − d/R, 0, 1)`` of an ellipse rotated by ``θ ~ U(0, π)`` with axis scales ``U(0.5, 1.5)`` each
    (``d = sqrt((x'/a)² + (y'/b)²)``). Draw order: the noise grids, θ, then ``a`` and ``b``.
    """
    cfg = config or DeformConfig()
    r = max(1, round(radius))
    size = 2 * r + 1
    noise = np.zeros((size, size))
    for f in cfg.organic_frequencies:
        grid = rng.uniform(size=(f + 1, f + 1))
        up = ndimage.zoom(grid, size / (f + 1), order=3, mode="nearest", grid_mode=False)
        noise += up[:size, :size] / f
    span = noise.max() - noise.min()
    noise = (noise - noise.min()) / span if span > 0 else np.ones_like(noise)
    theta = rng.uniform(0.0, np.pi)
    a, b = rng.uniform(cfg.organic_axis_range[0], cfg.organic_axis_range[1], size=2)
    yy, xx = np.mgrid[-r : r + 1, -r : r + 1].astype(float)
    xr = xx * np.cos(theta) + yy * np.sin(theta)
    yr = -xx * np.sin(theta) + yy * np.cos(theta)
    d = np.sqrt((xr / a) ** 2 + (yr / b) ** 2)
    return noise * np.clip(1.0 - d / r, 0.0, 1.0)


def sam_frame(shape: Sequence[int], image_size: int) -> tuple[int, int]:
    """Return SAM's resized ``(h, w)`` for an image of ``shape`` (longest side → ``image_size``)."""
    h, w = int(shape[0]), int(shape[1])
    s = image_size / max(h, w)
    return int(h * s + 0.5), int(w * s + 0.5)


def to_lowres(mask: np.ndarray, n: int, image_size: int) -> np.ndarray:
    """Return a native bool mask on the ``n×n`` low-res grid of SAM's padded frame (nearest neighbour)."""
    rh, rw = sam_frame(mask.shape, image_size)
    lh, lw = max(1, round(rh * n / image_size)), max(1, round(rw * n / image_size))
    small = np.asarray(Image.fromarray(mask.astype(np.uint8) * 255).resize((lw, lh), Image.NEAREST)) > 127
    out = np.zeros((n, n), dtype=bool)
    out[: min(lh, n), : min(lw, n)] = small[:n, :n]
    return out


def _lowres_point(p: Point, shape: Sequence[int], n: int, image_size: int) -> tuple[float, float]:
    rh, rw = sam_frame(shape, image_size)
    return (p[0] * rw / shape[1] * n / image_size, p[1] * rh / shape[0] * n / image_size)


def _stamp(value: np.ndarray, kernel: np.ndarray, center: tuple[float, float]):
    """Return ``(value slice, kernel slice)`` of the kernel centred at ``center`` (clipped to the grid)."""
    r = kernel.shape[0] // 2
    cx, cy = round(center[0]), round(center[1])
    n_y, n_x = value.shape
    y0, y1, x0, x1 = cy - r, cy + r + 1, cx - r, cx + r + 1
    vy0, vy1, vx0, vx1 = max(0, y0), min(n_y, y1), max(0, x0), min(n_x, x1)
    if vy0 >= vy1 or vx0 >= vx1:
        return None
    return (slice(vy0, vy1), slice(vx0, vx1)), kernel[vy0 - y0 : vy1 - y0, vx0 - x0 : vx1 - x0]


@dataclass(frozen=True)
class SamPrompts:
    """Point prompts (native ``(x, y)``), their labels and the ``N×N`` mask prompt."""

    points: list[Point]
    labels: list[int]
    mask_prompt: np.ndarray


def build_prompts(
    mask: np.ndarray,
    lung_union: np.ndarray | None,
    expansion_points: Sequence[Point],
    contraction_points: Sequence[Point],
    seed_points: Sequence[Point],
    prev_logits: np.ndarray | None,
    n: int,
    image_size: int,
    rng: np.random.Generator,
    config: DeformConfig | None = None,
) -> SamPrompts:
    """Return the §7.3 SAM prompts (see the module doc); ``lung_union`` None = expansion not confined."""
    cfg = config or DeformConfig()
    shape = mask.shape
    if prev_logits is not None:
        value = np.array(prev_logits, dtype=np.float64).reshape(n, n)
    else:
        value = np.full((n, n), cfg.logit_outside, dtype=np.float64)
    value[to_lowres(mask, n, image_size)] = cfg.logit_fill
    lung = None if lung_union is None else to_lowres(lung_union, n, image_size)
    radius = cfg.organic_radius * n / cfg.organic_reference_grid
    top = float(value.max())

    def stamps(points: Sequence[Point]):
        """Per point, a fresh organic kernel: (window of ``value``, kernel, pixels with kernel > threshold)."""
        for p in points:
            kernel = organic_kernel(radius, rng, cfg)
            hit = _stamp(value, kernel, _lowres_point(p, shape, n, image_size))
            if hit is not None:
                sl, k = hit
                yield sl, k, k > cfg.organic_threshold

    for sl, k, sel in stamps(expansion_points):
        if lung is not None:
            sel &= lung[sl]
        v = value[sl]
        v[sel] = np.maximum(v[sel], top * k[sel])
    lo_v, hi_v = float(value.min()), float(value.max())
    low = lo_v - 2.0 * (hi_v - lo_v)
    for sl, k, sel in stamps(contraction_points):
        v = value[sl]
        v[sel] = np.minimum(v[sel], low + (hi_v - low) * (1.0 - k[sel]))

    def at(p: Point) -> float:
        x, y = _lowres_point(p, shape, n, image_size)
        return float(value[min(n - 1, max(0, int(y))), min(n - 1, max(0, int(x)))])

    positives = [*seed_points, *expansion_points]
    kept = [p for p in positives if at(p) > 0] or list(positives)
    points = [*kept, *contraction_points]
    labels = [1] * len(kept) + [0] * len(contraction_points)
    return SamPrompts([(int(x), int(y)) for x, y in points], labels, value.astype(np.float32))


def _default_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SamDeformer(Deformer):
    """§7.3 deformer on a local SAM checkpoint folder (``config.json``, weights, ``processor_config.json``)."""

    name = "sam"

    def __init__(self, model_path: str | Path, device: str | None = None, config: DeformConfig | None = None,
                 dtype: str = "float32") -> None:
        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").is_file():
            raise InputError("not a SAM checkpoint folder (config.json missing)", self.model_path)
        if dtype not in SAM_DTYPES:
            raise InputError(f"SAM dtype must be one of {', '.join(SAM_DTYPES)}, got {dtype!r}", self.model_path)
        self.device = device or _default_device()
        self.dtype = dtype
        self.config = config or DeformConfig()
        self._model: Any = None
        self._processor: Any = None
        self._cached: tuple[bytes, Any, Any] | None = None

    def _load(self) -> None:
        if self._model is not None:
            return
        from transformers import SamModel, SamProcessor

        self._processor = SamProcessor.from_pretrained(str(self.model_path), local_files_only=True)
        import torch

        model = SamModel.from_pretrained(str(self.model_path), **model_kwargs())
        self._model = model.to(self.device, getattr(torch, self.dtype)).eval()

    @property
    def image_size(self) -> int:
        """Return SAM's input side (the padded frame)."""
        self._load()
        return int(self._model.config.prompt_encoder_config.image_size)

    @property
    def lowres_size(self) -> int:
        """Return ``N``, the side of the low-res logits and mask prompt."""
        self._load()
        return 4 * int(self._model.config.prompt_encoder_config.image_embedding_size)

    def _embed(self, image: np.ndarray):
        import torch

        img = np.asarray(image)
        key = hashlib.sha1(img.tobytes() + str(img.shape).encode()).digest()
        if self._cached is None or self._cached[0] != key:
            rgb = np.repeat(img[..., None], 3, axis=2) if img.ndim == 2 else img
            inputs = self._processor(images=rgb.astype(np.uint8), return_tensors="pt")
            with torch.no_grad():
                emb = self._model.get_image_embeddings(inputs["pixel_values"].to(self.device, self._model.dtype))
            self._cached = (key, emb, inputs)
        return self._cached[1], self._cached[2]

    def apply(self, request: DeformRequest) -> DeformResult:
        """Return SAM's top-scoring mask for the §7.3 prompts (§6-cleaned) and its low-res logits."""
        import torch

        self._load()
        m = as_mask(request.mask, "mask to deform")
        scale = self.config.scaled(m.shape)
        seeds = list(request.seed_points) if request.seed_points is not None else lattice_points(m, scale.grid_step)
        union = request.lung_union
        lung = None if union is None or np.asarray(union).all() else as_mask(union)
        n, size = self.lowres_size, self.image_size
        prompts = build_prompts(
            m, lung, request.expansion_points, request.contraction_points, seeds, request.prev_logits, n, size,
            request.rng, self.config,
        )
        emb, inputs = self._embed(request.image)
        rh, rw = sam_frame(m.shape, size)
        pts = [[x * rw / m.shape[1], y * rh / m.shape[0]] for x, y in prompts.points]
        dtype = self._model.dtype
        with torch.no_grad():
            out = self._model(
                image_embeddings=emb,
                input_points=torch.tensor([[pts]], dtype=torch.float32, device=self.device).to(dtype),
                input_labels=torch.tensor([[prompts.labels]], dtype=torch.long, device=self.device),
                input_masks=torch.from_numpy(prompts.mask_prompt)[None, None].to(self.device, dtype),
                multimask_output=True,
            )
        best = int(torch.argmax(out.iou_scores[0, 0].float()).item())
        low = out.pred_masks[:, :, best : best + 1].float()
        full = self._processor.post_process_masks(
            low.cpu(), inputs["original_sizes"], inputs["reshaped_input_sizes"], binarize=False
        )[0][0, 0]
        deformed = clean_mask(full.numpy() > 0, scale)
        return DeformResult(mask=deformed, logits=low[0, 0, 0].cpu().numpy().astype(np.float32))


def save_tiny_sam(folder: str | Path, seed: int = 0) -> Path:
    """Save a random tiny transformers SAM (64-px input, 16-px low-res masks) with its processor in ``folder``.

    The real ``SamModel`` / ``SamProcessor`` classes at a few thousand parameters, for tests and smoke checks.
    """
    import torch
    import transformers
    from transformers.models.sam import SamMaskDecoderConfig, SamPromptEncoderConfig, SamVisionConfig

    vc = SamVisionConfig(hidden_size=32, output_channels=16, num_hidden_layers=1, num_attention_heads=2,
                         image_size=64, patch_size=8, mlp_dim=32, global_attn_indexes=[0], num_pos_feats=8,
                         window_size=0)
    pc = SamPromptEncoderConfig(hidden_size=16, image_size=64, patch_size=8, mask_input_channels=4)
    mc = SamMaskDecoderConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, mlp_dim=32,
                              iou_head_hidden_dim=16)
    cfg = transformers.SamConfig(vision_config=vc.to_dict(), prompt_encoder_config=pc.to_dict(),
                                 mask_decoder_config=mc.to_dict())
    torch.manual_seed(seed)
    transformers.SamModel(cfg).save_pretrained(folder)
    image_processor = transformers.SamImageProcessor(
        size={"longest_edge": 64}, pad_size={"height": 64, "width": 64},
        mask_size={"longest_edge": 16}, mask_pad_size={"height": 16, "width": 16},
    )
    transformers.SamProcessor(image_processor=image_processor).save_pretrained(folder)
    return Path(folder)
