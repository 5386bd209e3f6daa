"""The baseline network: a small U-Net conditioned on the instruction by FiLM, with four heads.

Input ``(N, 4, S, S)``: the normalised image, right lung, left lung and the union of the location-label
masks named by the instruction (zero for ``global``). The conditioning vector goes through a 2-layer MLP;
every decoder block (and the bottleneck) is modulated as ``x * (1 + γ) + β`` with ``γ, β`` linear in it.

The convolutional blocks and the 1×1 mask head are those of the lung segmenter's plain U-Net
(:func:`cxrground.anatomy.segment.unet.build_unet`, 4 input channels, 1 output); only FiLM is added.

Heads (``forward`` returns a dict):

- ``mask``: ``(N, S, S)`` logits (1×1 convolution on the last decoder block);
- ``presence``: ``(N,)`` logit that the lesion is there, from the pooled bottleneck, the maximum and mean of
  the mask, the location features below and the conditioning;
- ``lesion``: ``(N, 3)`` lesion-inference type logits (pneumonia / atelectasis / edema) and ``certainty``
  ``(N, 2)`` (definitive / tentative);
- ``location``: ``(N, 10)`` multi-label logits of the ILS labels of a positive answer, fed in addition with
  20 location features: for every label region ``R``, ``Σ p·R / (Σ p + 1)`` and ``Σ p·R / (Σ R + 1)`` with
  ``p`` the predicted mask probability.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cxrground.anatomy.segment.unet import UNetConfig, build_unet
from cxrground.models.baseline.conditioning import CERTAINTIES, COND_DIM, LI_LESIONS
from cxrground.models.baseline.config import BaselineConfig
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.locations import ILS_LOCATION_LABELS

__all__ = ["CondUNet", "build_net", "count_parameters"]

N_LABELS = len(ILS_LOCATION_LABELS)
_LOC_SLICE = slice(len(LESIONS), len(LESIONS) + N_LABELS)


class CondUNet(nn.Module):
    """FiLM-conditioned U-Net with mask, presence, lesion-inference and location heads."""

    def __init__(self, config: BaselineConfig) -> None:
        super().__init__()
        ch = config.channels
        self.config = config
        # the plain U-Net of the lung segmenter provides the blocks (down, up, dec) and the 1x1 mask head
        self.unet = build_unet(UNetConfig(channels=ch, in_channels=4, out_channels=1, input_size=config.size,
                                          classes=("lesion",)))
        h = config.cond_hidden
        self.cond_mlp = nn.Sequential(nn.Linear(COND_DIM, h), nn.ReLU(inplace=True), nn.Linear(h, h),
                                      nn.ReLU(inplace=True))
        self.film_bottom = nn.Linear(h, 2 * ch[-1])
        self.film = nn.ModuleList([nn.Linear(h, 2 * ch[i]) for i in range(len(ch) - 1)])
        self.trunk = nn.Sequential(nn.Linear(ch[-1] + 2 + 2 * N_LABELS + h, config.head_hidden), nn.ReLU(inplace=True))
        self.presence_head = nn.Linear(config.head_hidden, 1)
        self.lesion_head = nn.Linear(config.head_hidden, len(LI_LESIONS))
        self.certainty_head = nn.Linear(config.head_hidden, len(CERTAINTIES))
        self.location_head = nn.Linear(config.head_hidden + 2 * N_LABELS, N_LABELS)

    @staticmethod
    def _modulate(x: torch.Tensor, film: nn.Linear, c: torch.Tensor) -> torch.Tensor:
        gamma, beta = film(c).chunk(2, dim=1)
        return x * (1 + gamma[:, :, None, None]) + beta[:, :, None, None]

    def forward(self, image: torch.Tensor, anatomy: torch.Tensor, cond: torch.Tensor) -> dict[str, torch.Tensor]:
        """``image`` ``(N,1,S,S)``, ``anatomy`` ``(N,12,S,S)`` (lungs + label masks), ``cond`` ``(N,20)``."""
        labels = anatomy[:, 2:]
        wanted = cond[:, _LOC_SLICE][:, :, None, None]
        union = (labels * wanted).amax(dim=1, keepdim=True)
        x = torch.cat([image, anatomy[:, :2], union], dim=1)
        c = self.cond_mlp(cond)
        skips = []
        unet = self.unet
        for i, block in enumerate(unet.down):
            if i:
                x = F.max_pool2d(x, 2)
            x = block(x)
            skips.append(x)
        x = self._modulate(x, self.film_bottom, c)
        pooled = x.mean(dim=(2, 3))
        for i in reversed(range(len(unet.up))):
            x = unet.dec[i](torch.cat([unet.up[i](x), skips[i]], dim=1))
            x = self._modulate(x, self.film[i], c)
        mask = unet.head(x)[:, 0]
        prob = mask.sigmoid()
        inter = (prob[:, None] * labels).sum(dim=(2, 3))
        loc_feats = torch.cat([inter / (prob.sum(dim=(1, 2))[:, None] + 1), inter / (labels.sum(dim=(2, 3)) + 1)], 1)
        stats = torch.stack([mask.amax(dim=(1, 2)), prob.mean(dim=(1, 2))], dim=1)
        t = self.trunk(torch.cat([pooled, stats, loc_feats, c], dim=1))
        return {
            "mask": mask,
            "presence": self.presence_head(t)[:, 0],
            "lesion": self.lesion_head(t),
            "certainty": self.certainty_head(t),
            "location": self.location_head(torch.cat([t, loc_feats], dim=1)),
        }


def build_net(config: BaselineConfig) -> CondUNet:
    """A freshly initialised network (seed torch first for determinism)."""
    return CondUNet(config)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))


