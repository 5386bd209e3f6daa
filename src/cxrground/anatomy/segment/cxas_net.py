"""The CXAS anatomy network (Seibold et al., ``UNet_ResNet50_default``) in plain torch, for its released weights.

The ``cxas`` package (MIT) builds it from torchvision's ResNet-50 and pins ``pydicom<3`` (this project needs
``pydicom>=3``), so it cannot be installed beside cxrground here. This module computes the same network with
the same parameter names (``backbone.backbone.layer0..4``, ``head.up1..4``, ``head.out``), so the package's
checkpoint (``{"model": state_dict}``, keys possibly prefixed ``module.``) loads with ``load_state_dict``:

- backbone: a ResNet-50 (v1.5: stride on the 3×3 conv of a bottleneck) whose stem (conv 7×7/2, BN, ReLU,
  max-pool 3×3/2) is ``layer0``; the maps after ``layer0``..``layer4`` are the five skip levels;
- head (U-Net, bilinear up-sampling with ``align_corners=False``): ``up1`` = conv-BN-ReLU on the deepest map,
  up-sampled to ``layer3``'s size, concatenated after it, double conv-BN-ReLU; ``up2``..``up4`` = up-sample,
  concatenate after the skip map, double conv; then bilinear to the input size and a 1×1 conv to 159 logits;
- inference as the package's ``FileLoader`` + ``CXAS.process_file``: grey image replicated to RGB, scaled to
  [0, 1], ImageNet mean/std, resized to 512×512 with ``F.interpolate`` (nearest), ``sigmoid > 0.5`` per class
  (multi-label), masks resized back to native with nearest.

The class indices come from the package's ``data/paxray_labels.json`` (:data:`CXAS_LABEL_IDS`). Widths and
block counts are read from the weights (:meth:`CXASUNet.from_state_dict`), so a tiny random instance
(:func:`tiny_cxas`) has the real key layout.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CXAS_LABEL_IDS", "CXAS_N_CLASSES", "CXASUNet", "CXASUNetConfig", "checkpoint_state", "tiny_cxas"]

#: PAX-Ray class index of each structure used here (``cxas/data/paxray_labels.json``).
CXAS_LABEL_IDS: dict[str, int] = {"right lung": 135, "left lung": 136, "heart": 121}
CXAS_N_CLASSES = 159
CXAS_INPUT = 512
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class CXASUNetConfig:
    """Sizes: stem width (64 for ResNet-50), bottlenecks per layer, head output width, classes."""

    width: int = 64
    blocks: tuple[int, ...] = (3, 4, 6, 3)
    ngf: int = 128
    classes: int = CXAS_N_CLASSES


class Bottleneck(nn.Module):
    """torchvision's ResNet bottleneck (1×1, 3×3 with the stride, 1×1 ×4) with its parameter names."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = (nn.Sequential(nn.Conv2d(c_in, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
                           if stride != 1 or c_in != out else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


def _resnet(width: int, blocks: Sequence[int]) -> nn.Sequential:
    layers: OrderedDict[str, nn.Module] = OrderedDict(
        layer0=nn.Sequential(nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width),
                             nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1)))
    c_in = width
    for i, n in enumerate(blocks):
        planes = width * 2**i
        stride = 1 if i == 0 else 2
        seq = []
        for j in range(n):
            seq.append(Bottleneck(c_in, planes, stride if j == 0 else 1))
            c_in = planes * Bottleneck.expansion
        layers[f"layer{i + 1}"] = nn.Sequential(*seq)
    return nn.Sequential(layers)


def _conv_bn_relu(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU())


class DoubleConv(nn.Module):
    """``(conv 3×3 → BN → ReLU) × 2`` (parameter names ``double_conv.0/1/3/4``)."""

    def __init__(self, c_in: int, c_out: int, c_mid: int) -> None:
        super().__init__()
        self.double_conv = nn.Sequential(*_conv_bn_relu(c_in, c_mid), *_conv_bn_relu(c_mid, c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.double_conv(x)


class ConvBlock(nn.Module):
    """``conv 3×3 → BN → ReLU`` (parameter names ``conv.0/1``)."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = _conv_bn_relu(c_in, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def _up_cat(x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
    return torch.cat([skip, F.interpolate(x, skip.shape[2:], mode="bilinear")], dim=1)


class UpInit(nn.Module):
    """First decoder step: reduce the deepest map, up-sample, concatenate after the skip map, double conv."""

    def __init__(self, c_temp: int, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv1 = ConvBlock(c_in, c_temp)
        self.conv2 = DoubleConv(c_in, c_out, c_in // 2)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv2(_up_cat(self.conv1(x), skip))


class Up(nn.Module):
    """Decoder step: up-sample, concatenate after the skip map, double conv."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = DoubleConv(c_in, c_out, c_in // 2)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(_up_cat(x, skip))


class OutConv(nn.Module):
    """1×1 convolution to the class logits."""

    def __init__(self, c_in: int, classes: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Head(nn.Module):
    """The U-Net head on a backbone of deepest width ``c`` (2048 for ResNet-50)."""

    def __init__(self, c: int, ngf: int, classes: int) -> None:
        super().__init__()
        self.up1 = UpInit(c // 2, c, c // 4)
        self.up2 = Up(c // 4 * 2, c // 8)
        self.up3 = Up(c // 8 * 2, c // 32)
        self.up4 = Up(c // 32 * 2, ngf)
        self.out = OutConv(ngf, classes)


class Backbone(nn.Module):
    """Holds the ResNet as ``backbone`` (the package's ``Backbone.backbone``)."""

    def __init__(self, width: int, blocks: Sequence[int]) -> None:
        super().__init__()
        self.backbone = _resnet(width, blocks)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = []
        for layer in self.backbone:
            x = layer(x)
            feats.append(x)
        return feats


class CXASUNet(nn.Module):
    """``forward(x) -> logits`` (B, classes, H, W) for an ImageNet-normalised RGB batch (see the module docstring)."""

    def __init__(self, config: CXASUNetConfig | None = None) -> None:
        super().__init__()
        cfg = config or CXASUNetConfig()
        self.config = cfg
        self.backbone = Backbone(cfg.width, cfg.blocks)
        deepest = cfg.width * 2 ** (len(cfg.blocks) - 1) * Bottleneck.expansion
        self.head = Head(deepest, cfg.ngf, cfg.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f1, f2, f3, f4, f5 = self.backbone(x)
        y = self.head.up4(self.head.up3(self.head.up2(self.head.up1(f5, f4), f3), f2), f1)
        return self.head.out(F.interpolate(y, x.shape[2:], mode="bilinear"))

    @torch.no_grad()
    def predict(self, grey: torch.Tensor) -> torch.Tensor:
        """``grey`` (H, W) uint8 → bool masks (classes, H, W) as ``CXAS.process_file`` computes them."""
        p = next(self.parameters())
        rgb = (grey.to(torch.float32) / 255.0)[None].expand(3, -1, -1)
        mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
        x = F.interpolate(((rgb - mean) / std)[None], CXAS_INPUT).to(p.device, p.dtype)
        preds = self(x).sigmoid() > 0.5
        return F.interpolate(preds[0].float()[None], tuple(grey.shape), mode="nearest")[0] > 0.5

    @classmethod
    def config_from_state_dict(cls, state: Mapping[str, torch.Tensor]) -> CXASUNetConfig:
        """Sizes of the network whose weights are ``state`` (``KeyError`` if it is not a CXAS U-Net)."""
        width = int(state["backbone.backbone.layer0.0.weight"].shape[0])
        blocks = []
        for i in range(1, 5):
            found = {int(m.group(1)) for key in state
                     if (m := re.match(rf"backbone\.backbone\.layer{i}\.(\d+)\.conv1\.weight$", key))}
            if not found:
                raise KeyError(f"backbone.backbone.layer{i}")
            blocks.append(max(found) + 1)
        return CXASUNetConfig(width=width, blocks=tuple(blocks),
                              ngf=int(state["head.up4.conv.double_conv.3.weight"].shape[0]),
                              classes=int(state["head.out.conv.weight"].shape[0]))

    @classmethod
    def from_state_dict(cls, state: Mapping[str, torch.Tensor]) -> tuple[CXASUNet, list[str]]:
        """A network sized from ``state`` with it loaded; returns it and the checkpoint keys it does not use.

        Every parameter and buffer of the network must be in ``state`` (a missing one raises ``RuntimeError``);
        extra keys are returned, as the package itself loads with ``strict=False``.
        """
        model = cls(cls.config_from_state_dict(state))
        result = model.load_state_dict(dict(state), strict=False)
        if result.missing_keys:
            raise RuntimeError(f"checkpoint lacks {len(result.missing_keys)} keys, e.g. {result.missing_keys[:3]}")
        return model.eval(), list(result.unexpected_keys)


def checkpoint_state(obj: object) -> dict[str, torch.Tensor]:
    """The state dict inside a CXAS checkpoint (``{"model": ...}`` or a bare dict), ``module.`` prefixes removed."""
    state = obj.get("model", obj) if isinstance(obj, Mapping) else None
    if not isinstance(state, Mapping):
        raise ValueError(f"expected a dict with a 'model' state dict, got {type(obj).__name__}")
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state.items()}


def tiny_cxas(seed: int = 0, classes: int = CXAS_N_CLASSES) -> CXASUNet:
    """A random small CXAS U-Net with the released key layout (stem width 4, one bottleneck per layer, ngf 8).

    Batch-norm running statistics are randomised too, so that a saved checkpoint exercises every buffer.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CXASUNet(CXASUNetConfig(width=4, blocks=(1, 1, 1, 1), ngf=8, classes=classes))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval()
