"""HybridGNet (Gaggion et al.; the CheXmask lungs + heart model) written in plain torch for its released weights.

The reference code (github.com/ngaggion/CheXmask-Database, ``HybridGNet/models/HybridGNet2IGSC.py``, GPL-3.0)
needs torch_geometric and torchvision. This is an independent implementation of the same computation whose
parameter names match the reference's ``state_dict``, so ``bestMSE.pt`` loads with ``load_state_dict``:

- encoder: six residual blocks (``BN → ReLU → conv3×3 → BN → ReLU → conv3×3`` plus a 1×1 conv + BN shortcut
  when the width changes; batch norm without running statistics, as in the reference) with five 2×2 max-pools;
  widths ``c·(2, 4, 8, 16, 32, 32)``; ``fc_mu`` of the flattened last map is the latent code (``fc_logvar`` is
  kept for the weights but unused at inference);
- graph decoder on the landmark contours: every organ is a closed ring (each node joined to its two
  neighbours); 60 nodes (each ring halved) then 120 nodes. ``dec_lin`` → two Chebyshev convolutions on the
  60-node graph → skip block 1 → one Chebyshev convolution → up-sampling to 120 nodes → one Chebyshev
  convolution → skip block 2 → one Chebyshev convolution → a K=1 Chebyshev convolution to ``(x, y)``.
  Every inner convolution is followed by instance normalisation over a node's features and a ReLU;
- Chebyshev convolution of order K as torch_geometric's ``ChebConv`` with symmetric normalisation and
  ``λ_max = 2``: ``L̂ = −D^{-1/2} A D^{-1/2}``, ``T₀ = x``, ``T₁ = L̂x``, ``T_k = 2L̂T_{k−1} − T_{k−2}``,
  ``out = Σ_k T_k W_kᵀ + b`` (weights ``lins.k.weight``, bias ``bias``);
- up-sampling (COMA pooling): node ``2i`` copies coarse node ``i``, node ``2i+1`` averages coarse nodes ``i`` and
  ``i+1`` (around the ring);
- skip block: a K=1 Chebyshev convolution predicts each node's position in [0, 1]; the encoder map (``conv6``
  for block 1, ``conv5`` for block 2) is averaged over a 3×3 window about it exactly as torchvision's
  ``roi_align(output_size=1, aligned=True, sampling_ratio=-1)`` does (bilinear samples, zero outside the map),
  and ``[features, sampled map, position]`` go on.

Output: ``(B, 120, 2)`` landmark ``(x, y)`` normalised to [0, 1] of the square input (right lung 0–43, left
lung 44–93, heart 94–119). The sizes (``c``, latents, filters, K, input side) are read from the weights by
:meth:`HybridGNet.from_state_dict`, so a tiny random instance (:func:`tiny_hybridgnet`) has the real key layout.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ORGANS", "HybridGNet", "HybridGNetConfig", "ring_adjacency", "tiny_hybridgnet", "upsample_matrix"]

#: Nodes per organ ring, in landmark order: right lung, left lung, heart.
ORGANS: tuple[int, ...] = (44, 50, 26)
WINDOW = 3


def ring_adjacency(sizes: Sequence[int]) -> np.ndarray:
    """Block-diagonal 0/1 adjacency: each organ's nodes form a closed ring."""
    n = sum(sizes)
    a = np.zeros((n, n), dtype=np.float32)
    start = 0
    for size in sizes:
        for i in range(size):
            a[start + i, start + (i - 1) % size] = 1.0
            a[start + i, start + (i + 1) % size] = 1.0
        start += size
    return a


def upsample_matrix(sizes: Sequence[int]) -> np.ndarray:
    """``(Σn, Σ⌈n/2⌉)``: fine node ``2i`` ← coarse ``i``; ``2i+1`` ← half of coarse ``i`` and ``i+1`` (ring)."""
    coarse = [math.ceil(s / 2) for s in sizes]
    u = np.zeros((sum(sizes), sum(coarse)), dtype=np.float32)
    r0 = c0 = 0
    for size, half in zip(sizes, coarse, strict=True):
        for i in range(size):
            if i % 2 == 0:
                u[r0 + i, c0 + i // 2] = 1.0
            else:
                u[r0 + i, c0 + i // 2] = 0.5
                u[r0 + i, c0 + (i // 2 + 1) % half] = 0.5
        r0 += size
        c0 += half
    return u


def scaled_laplacian(adjacency: np.ndarray) -> torch.Tensor:
    """``−D^{-1/2} A D^{-1/2}`` (torch_geometric's sym-normalised Laplacian with λ_max = 2, diagonal removed)."""
    deg = adjacency.sum(axis=1)
    inv = np.where(deg > 0, 1.0 / np.sqrt(np.maximum(deg, 1e-12)), 0.0)
    return torch.from_numpy((-(inv[:, None] * adjacency * inv[None, :])).astype(np.float32))


@dataclass(frozen=True)
class HybridGNetConfig:
    """Sizes of a HybridGNet (the released CheXmask model: ``c=4``, 64 latents, filters ``[2, 32, 32, 32, 16, 16,
    16]``, K 6, input 1024)."""

    c: int = 4
    latents: int = 64
    filters: tuple[int, ...] = (2, 32, 32, 32, 16, 16, 16)
    K: int = 6
    input_size: int = 1024
    organs: tuple[int, ...] = ORGANS

    @property
    def widths(self) -> tuple[int, ...]:
        """Encoder widths of the six residual blocks."""
        return tuple(self.c * m for m in (2, 4, 8, 16, 32, 32))


class ChebConv(nn.Module):
    """Chebyshev graph convolution of order ``K`` (torch_geometric's parameter names: ``lins.k.weight``, ``bias``)."""

    def __init__(self, c_in: int, c_out: int, K: int, bias: bool = True) -> None:
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(c_in, c_out, bias=False) for _ in range(K))
        self.bias = nn.Parameter(torch.zeros(c_out)) if bias else None

    def forward(self, x: torch.Tensor, lap: torch.Tensor) -> torch.Tensor:
        """``x``: ``(B, N, c_in)``; ``lap``: ``(N, N)`` scaled Laplacian."""
        t0 = x
        out = self.lins[0](t0)
        if len(self.lins) > 1:
            t1 = torch.matmul(lap, x)
            out = out + self.lins[1](t1)
            for lin in self.lins[2:]:
                t2 = 2.0 * torch.matmul(lap, t1) - t0
                out = out + lin(t2)
                t0, t1 = t1, t2
        return out + self.bias if self.bias is not None else out


class ResidualBlock(nn.Module):
    """``BN → ReLU → conv → BN → ReLU → conv`` + shortcut, then ReLU (batch norm without running statistics)."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.skip = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, bias=False),
                                   nn.BatchNorm2d(c_out, track_running_stats=False)) if c_in != c_out else None)
        self.block = nn.Sequential(
            nn.BatchNorm2d(c_in, track_running_stats=False), nn.ReLU(), nn.Conv2d(c_in, c_out, 3, padding=1),
            nn.BatchNorm2d(c_out, track_running_stats=False), nn.ReLU(), nn.Conv2d(c_out, c_out, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.skip(x) if self.skip is not None else x
        return F.relu(self.block(x) + identity)


class Encoder(nn.Module):
    """Six residual blocks, five max-pools; returns the latent mean and the last two maps."""

    def __init__(self, config: HybridGNetConfig) -> None:
        super().__init__()
        w = config.widths
        ins = (1, *w[:-1])
        for i, (a, b) in enumerate(zip(ins, w, strict=True), start=1):
            self.add_module(f"dconv_down{i}", ResidualBlock(a, b))
        hw = config.input_size // 32
        self.fc_mu = nn.Linear(w[-1] * hw * hw, config.latents)
        self.fc_logvar = nn.Linear(w[-1] * hw * hw, config.latents)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        for i in range(1, 5):
            x = F.max_pool2d(getattr(self, f"dconv_down{i}")(x), 2)
        conv5 = self.dconv_down5(x)
        conv6 = self.dconv_down6(F.max_pool2d(conv5, 2))
        return self.fc_mu(conv6.flatten(1)), conv6, conv5


def roi_window_mean(feature: torch.Tensor, centres: torch.Tensor, window: int = WINDOW) -> torch.Tensor:
    """Mean of ``feature`` (B, C, H, W) over a ``window`` box about each centre (B, N, 2) in map pixels ``(x, y)``.

    Same samples, weights and zeroing as torchvision's ``roi_align(output_size=1, spatial_scale=1,
    sampling_ratio=-1, aligned=True)`` on the boxes ``[c − w//2, c + w//2 + 1]``. Returns ``(B, N, C)``.
    """
    b, _, h, w = feature.shape
    half = float(window // 2)
    axes = []
    for k, size in ((1, h), (0, w)):  # rows from y, columns from x
        lo = centres[..., k] - half - 0.5
        hi = centres[..., k] + (half + 1.0) - 0.5
        extent = hi - lo
        grid = torch.ceil(extent).clamp(min=1).to(torch.int64)
        g = int(grid.max())
        steps = torch.arange(g, device=feature.device, dtype=feature.dtype) + 0.5
        pos = lo[..., None] + steps * extent[..., None] / grid[..., None].to(feature.dtype)  # (B, N, G)
        used = torch.arange(g, device=feature.device) < grid[..., None]
        inside = used & (pos >= -1.0) & (pos <= size)
        pos = pos.clamp(min=0.0)
        low = pos.floor().to(torch.int64)
        top = low >= size - 1
        low = torch.where(top, torch.full_like(low, size - 1), low)
        pos = torch.where(top, low.to(pos.dtype), pos)
        high = torch.where(top, low, low + 1)
        frac = pos - low.to(pos.dtype)
        weight = inside.to(pos.dtype)
        idx = torch.cat([low, high], dim=-1)  # (B, N, 2G)
        wts = torch.cat([(1.0 - frac) * weight, frac * weight], dim=-1)
        axes.append((idx, wts, grid))
    (ri, rw, gy), (ci, cw, gx) = axes
    out = []
    for i in range(b):
        vals = feature[i][:, ri[i][:, :, None], ci[i][:, None, :]]  # (C, N, 2Gy, 2Gx)
        out.append(torch.einsum("cnij,ni,nj->nc", vals, rw[i], cw[i]))
    return torch.stack(out) / (gy * gx).to(feature.dtype)[..., None]


class SkipBlock(nn.Module):
    """Predict node positions (K=1 Chebyshev) and append the encoder map sampled there."""

    def __init__(self, c_in: int) -> None:
        super().__init__()
        self.graphConv_pre = ChebConv(c_in, 2, 1, bias=False)

    def forward(self, x: torch.Tensor, lap: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        pos = self.graphConv_pre(x, lap)
        skip = roi_window_mean(feature, pos * feature.shape[-1])
        return torch.cat([x, skip, pos], dim=2)


class HybridGNet(nn.Module):
    """The CheXmask HybridGNet (see the module docstring); ``forward(image) -> (B, 120, 2)`` in [0, 1]."""

    def __init__(self, config: HybridGNetConfig | None = None) -> None:
        super().__init__()
        cfg = config or HybridGNetConfig()
        self.config = cfg
        f, k = cfg.filters, cfg.K
        coarse = [math.ceil(s / 2) for s in cfg.organs]
        self.encoder = Encoder(cfg)
        self.dec_lin = nn.Linear(cfg.latents, f[6] * sum(coarse))
        skip = cfg.widths[-1]
        self.graphConv_up6 = ChebConv(f[6], f[5], k)
        self.graphConv_up5 = ChebConv(f[5], f[4], k)
        self.SC_1 = SkipBlock(f[4])
        self.graphConv_up4 = ChebConv(f[4] + skip + 2, f[3], k)
        self.graphConv_up3 = ChebConv(f[3], f[2], k)
        self.SC_2 = SkipBlock(f[2])
        self.graphConv_up2 = ChebConv(f[2] + skip + 2, f[1], k)
        self.graphConv_up1 = ChebConv(f[1], f[0], 1, bias=False)
        self.register_buffer("lap_fine", scaled_laplacian(ring_adjacency(cfg.organs)), persistent=False)
        self.register_buffer("lap_coarse", scaled_laplacian(ring_adjacency(coarse)), persistent=False)
        self.register_buffer("upsample", torch.from_numpy(upsample_matrix(cfg.organs)), persistent=False)

    @staticmethod
    def _block(conv: ChebConv, x: torch.Tensor, lap: torch.Tensor) -> torch.Tensor:
        return F.relu(F.instance_norm(conv(x, lap)))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """``image``: ``(B, 1, S, S)`` in [0, 1] → landmarks ``(B, Σ organs, 2)`` normalised to [0, 1]."""
        mu, conv6, conv5 = self.encoder(image)
        x = F.relu(self.dec_lin(mu)).reshape(mu.shape[0], -1, self.config.filters[6])
        x = self._block(self.graphConv_up6, x, self.lap_coarse)
        x = self._block(self.graphConv_up5, x, self.lap_coarse)
        x = self.SC_1(x, self.lap_coarse, conv6)
        x = self._block(self.graphConv_up4, x, self.lap_coarse)
        x = torch.matmul(self.upsample.to(x.dtype), x)
        x = self._block(self.graphConv_up3, x, self.lap_fine)
        x = self.SC_2(x, self.lap_fine, conv5)
        x = self._block(self.graphConv_up2, x, self.lap_fine)
        return self.graphConv_up1(x, self.lap_fine)

    @classmethod
    def config_from_state_dict(cls, state: Mapping[str, torch.Tensor]) -> HybridGNetConfig:
        """The sizes of the network whose weights are ``state`` (``KeyError``/``ValueError`` if not a HybridGNet)."""
        size0 = int(state["encoder.dconv_down1.block.2.weight"].shape[0])
        if size0 % 2:
            raise ValueError(f"first encoder width {size0} is odd")
        c = size0 // 2
        latents = int(state["dec_lin.weight"].shape[1])
        k = len({m.group(1) for key in state if (m := re.fullmatch(r"graphConv_up6\.lins\.(\d+)\.weight", key))})
        outs = [int(state[f"graphConv_up{i}.lins.0.weight"].shape[0]) for i in range(1, 7)]
        f6 = int(state["graphConv_up6.lins.0.weight"].shape[1])
        nodes = int(state["dec_lin.weight"].shape[0]) // f6
        coarse = sum(math.ceil(s / 2) for s in ORGANS)
        if nodes != coarse:
            raise ValueError(f"the decoder starts on {nodes} nodes; the lungs + heart model starts on {coarse}")
        hw2 = int(state["encoder.fc_mu.weight"].shape[1]) // (32 * c)
        hw = math.isqrt(hw2)
        if hw * hw != hw2:
            raise ValueError(f"encoder.fc_mu input {state['encoder.fc_mu.weight'].shape[1]} is not width·side²")
        return HybridGNetConfig(c=c, latents=latents, filters=(*outs, f6), K=k, input_size=32 * hw)

    @classmethod
    def from_state_dict(cls, state: Mapping[str, torch.Tensor]) -> HybridGNet:
        """A network sized from ``state`` with ``state`` loaded (strict: every key must match)."""
        model = cls(cls.config_from_state_dict(state))
        model.load_state_dict(dict(state), strict=True)
        return model.eval()


def tiny_hybridgnet(seed: int = 0, input_size: int = 64) -> HybridGNet:
    """A random small HybridGNet with the released key layout (``c=1``, 8 latents, filters 2/8/8/8/4/4/4, K 3)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = HybridGNet(HybridGNetConfig(c=1, latents=8, filters=(2, 8, 8, 8, 4, 4, 4), K=3,
                                           input_size=input_size))
        with torch.no_grad():  # the reference draws dec_lin from N(0, 0.1) and the Chebyshev weights likewise
            for name, p in model.named_parameters():
                if "graphConv" in name or name.startswith("dec_lin.weight"):
                    p.normal_(0.0, 0.1)
    return model.eval()
