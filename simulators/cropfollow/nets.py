"""CropFollow's perception NNs: a backbone and the NavNet regression head.

As CropFollow built them: backbone -> 3x3 conv to 512 channels -> batch-norm ->
ReLU -> global average pooling -> FC 512->64 -> ReLU -> dropout -> FC->1; one NN
estimates the heading, another the lateral distance ratio. Two backbones, both in
plain torch (torchvision does not import beside torch 2.13 here): ResNet-18, and a
compact stride-2 conv stack that trains on two CPU cores in minutes.

The model takes what the renderer produces, float32 RGB in [0, 1] of shape
(B, 3, 240, 320), normalises it itself, and outputs (B, 1) in the target's unit
(degrees, or the d_left / (d_left + d_right) ratio): the normalisation of inputs and
outputs is part of the model, so every consumer (pruning, quantisation, compilers,
the simulator) sees one plain tensor-to-tensor function.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from .config import check_nn

Backbone = Literal["compact", "resnet18"]
Target = Literal["heading", "distance"]

TARGET_SCALE: dict[str, tuple[float, float]] = {"heading": (0.0, 15.0), "distance": (0.5, 0.15)}
"""(offset, scale) of each target: the head predicts (y - offset) / scale, of order 1."""

IMAGE_MEAN = (0.45, 0.45, 0.40)
IMAGE_STD = (0.25, 0.25, 0.25)


def _conv_bn_relu(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class CompactBackbone(nn.Sequential):
    """Eight 3x3 conv-BN-ReLU blocks, /32 overall: (B,3,240,320) -> (B, 8*width, 8, 10)."""

    def __init__(self, width: int = 16):
        w = width
        super().__init__(
            _conv_bn_relu(3, w, 2),
            _conv_bn_relu(w, 2 * w, 2),
            _conv_bn_relu(2 * w, 2 * w),
            _conv_bn_relu(2 * w, 4 * w, 2),
            _conv_bn_relu(4 * w, 4 * w),
            _conv_bn_relu(4 * w, 8 * w, 2),
            _conv_bn_relu(8 * w, 8 * w),
            _conv_bn_relu(8 * w, 8 * w, 2),
        )
        self.out_channels = 8 * w


class BasicBlock(nn.Module):
    """ResNet's two-conv residual block (He et al. 2016)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18Backbone(nn.Sequential):
    """ResNet-18 without its classifier: (B,3,240,320) -> (B, 512, 8, 10)."""

    def __init__(self):
        layers: list[nn.Module] = [
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]
        c = 64
        for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(c, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c = c_out
        super().__init__(*layers)
        self.out_channels = 512


class NavNet(nn.Module):
    """CropFollow's perception NN: backbone + conv-BN-ReLU-GAP-FC-ReLU-dropout-FC head."""

    def __init__(self, target: Target = "heading", backbone: Backbone = "compact", dropout: float = 0.3, width: int = 16):
        super().__init__()
        check_nn(target, backbone)
        self.target = target
        self.backbone_name = backbone
        self.backbone: nn.Module = CompactBackbone(width) if backbone == "compact" else ResNet18Backbone()
        self.head = nn.Sequential(
            nn.Conv2d(self.backbone.out_channels, 512, 3, padding=1, bias=False),
            nn.BatchNorm2d(512),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(512, 64),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(64, 1),
        )
        offset, scale = TARGET_SCALE[target]
        self.register_buffer("image_mean", torch.tensor(IMAGE_MEAN).view(1, 3, 1, 1))
        self.register_buffer("image_std", torch.tensor(IMAGE_STD).view(1, 3, 1, 1))
        self.register_buffer("out_offset", torch.tensor(offset))
        self.register_buffer("out_scale", torch.tensor(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.image_mean) / self.image_std
        return self.head(self.backbone(x)) * self.out_scale + self.out_offset
