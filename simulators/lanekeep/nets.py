"""LaneKeep's perception NNs: one small CNN per NN, in plain torch.

Six 3x3 conv-BatchNorm-ReLU blocks (16-64 channels, five of stride 2: 120x160 ->
4x5), a flattened linear head (64 hidden units) and one output: about 21 MMACs a
frame, so three of them run in a few milliseconds on a small CPU. The head flattens
instead of averaging over the image because where a lane marking, a sign or a car
is in the image is what each NN measures; torch-pruning follows the flatten, so the
NNs prune like any conv stack.

The model takes what the renderer produces, float32 RGB in [0, 1] of shape
(B, 3, 120, 160), normalises it itself, and outputs (B, 1) in the target's unit
(lane offset in m, lead distance in m, or the stop probability through a final
sigmoid): every consumer (pruning, quantisation, compilers, the simulator) sees
one plain tensor-to-tensor function.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import check_nn

TARGET_SCALE: dict[str, tuple[float, float]] = {"lane": (0.0, 0.6), "stop": (0.0, 1.0), "lead": (25.0, 12.0)}
"""(offset, scale) of the regression targets: the head predicts (y - offset) / scale, of order 1."""
IMAGE_MEAN = (0.45, 0.47, 0.48)
IMAGE_STD = (0.22, 0.22, 0.25)
CHANNELS = (16, 32, 48, 48, 64, 64)
STRIDES = (2, 2, 2, 1, 2, 2)


def _conv_bn_relu(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class LaneKeepNet(nn.Module):
    """Conv stack + flatten + MLP head; a sigmoid on the output for ``stop``."""

    def __init__(self, target: str = "lane", height: int = 120, width: int = 160, dropout: float = 0.2):
        super().__init__()
        check_nn(target)
        self.target = target
        layers, c = [], 3
        for c_out, stride in zip(CHANNELS, STRIDES):
            layers.append(_conv_bn_relu(c, c_out, stride))
            c = c_out
        self.features = nn.Sequential(*layers)
        h, w = height, width
        for stride in STRIDES:
            h, w = (h + 2 - 3) // stride + 1, (w + 2 - 3) // stride + 1
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 64), nn.ReLU(inplace=True), nn.Dropout(dropout), nn.Linear(64, 1))
        offset, scale = TARGET_SCALE[target]
        self.register_buffer("image_mean", torch.tensor(IMAGE_MEAN).view(1, 3, 1, 1))
        self.register_buffer("image_std", torch.tensor(IMAGE_STD).view(1, 3, 1, 1))
        self.register_buffer("out_offset", torch.tensor(offset))
        self.register_buffer("out_scale", torch.tensor(scale))
        self.probability = target == "stop"

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """The head's output before the unit conversion: normalised target, or the stop logit."""
        return self.head(self.features((x - self.image_mean) / self.image_std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.raw(x)
        if self.probability:
            return torch.sigmoid(y)
        return y * self.out_scale + self.out_offset


def macs(model: nn.Module, height: int = 120, width: int = 160) -> int:
    """Multiply-accumulates of one frame through ``model``'s convolutions and linear layers."""
    total = 0

    def hook(module, inputs, output):
        nonlocal total
        if isinstance(module, nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1] * module.in_channels // module.groups
            total += output.numel() * k
        elif isinstance(module, nn.Linear):
            total += module.in_features * module.out_features

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, height, width))
    for h in handles:
        h.remove()
    return total
