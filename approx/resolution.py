"""A lower input resolution inside the NN: the frame is resized in the graph, so the NN still takes full frames.

Every layer of a convolutional NN does work in proportion to the pixels it sees, so
halving each side of the input cuts the work of every layer by four without
narrowing any of them; channel pruning stops paying where small layers hit a
per-layer overhead floor, and resolution keeps paying there. The resize is the
first operation of the candidate's graph (bilinear, exported as ONNX ``Resize``),
so the latency measured for the candidate includes it and the exported artifact
takes the application's full-size frame.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def scaled_size(input_shape: tuple[int, ...], scale: float, align: int) -> tuple[int, int]:
    """The (height, width) an input of ``input_shape`` (N, C, H, W) is resized to: each side times ``scale``,
    rounded to a multiple of ``align`` (at least ``align``)."""
    h, w = input_shape[-2:]
    return tuple(max(align, round(side * scale / align) * align) for side in (h, w))  # type: ignore[return-value]


class InputResize(nn.Module):
    """``model`` fed a bilinear resize of its input to ``size`` (H, W)."""

    def __init__(self, model: nn.Module, size: tuple[int, int]):
        super().__init__()
        self.model = model
        self.size = tuple(int(s) for s in size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(F.interpolate(x, size=self.size, mode="bilinear", align_corners=False))


def check_takes(model: nn.Module, input_shape: tuple[int, ...], size: tuple[int, int]) -> str | None:
    """Why ``model`` cannot take an input resized to ``size`` (``None`` when it can): it raises, or its output's
    shape differs from the one at full size."""
    with torch.no_grad():
        full = model(torch.zeros(input_shape))
        try:
            small = model(torch.zeros((*input_shape[:-2], *size)))
        except Exception as exc:  # noqa: BLE001 - the architecture rejects the size (a fixed-size layer, a stride)
            return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if tuple(small.shape) != tuple(full.shape):
        return f"its output has shape {tuple(small.shape)} there, {tuple(full.shape)} at full size"
    return None
