"""A lower input resolution inside the NN: the frame is resized in the graph, so the NN still takes full frames.

Every layer of a convolutional NN does work in proportion to the pixels it sees, so
halving each side of the input cuts the work of every layer by four without
narrowing any of them; channel pruning stops paying where small layers hit a
per-layer overhead floor, and resolution keeps paying there. The resize is the
first operation of the candidate's graph, so the latency measured for the candidate
includes it and the exported artifact takes the application's full-size frame.

The resize is bilinear (half-pixel centres, no antialiasing: ``F.interpolate``'s). Where
each side shrinks by a ratio ``a/b`` of small blocks (:func:`block_ratio`: 0.75 = 3/4 and
0.5 = 1/2 of CropFollow's 240x320 frame), it is computed exactly as a strided grouped
convolution and a depth-to-space (:class:`BlockResize`), which backends run as ordinary
layers: in CropFollow's int8 NN on OpenVINO the resize took 0.17 ms so at 0.75 where
``Interpolate`` took 0.36, and 0.03 at 0.5 against 0.17 (docs/knobs.md). Other ratios use
``F.interpolate`` (ONNX ``Resize``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

MAX_BLOCK, MAX_OUTPUT_BLOCK = 4, 3
"""The largest block, in input and in output pixels per side, that :class:`BlockResize` computes at once; other
ratios (3/8, 7/8, 240 to 176 = 11/15) are resized by ``F.interpolate``. Measured in CropFollow's int8 NN on
OpenVINO (2 threads, ``benchmarks/block_resize.py``, docs/knobs.md): the block convolution took 0.17 ms against
``Interpolate``'s 0.36 at 3/4 and 0.03 against 0.17 at 1/2, but 0.09 against 0.07 at 3/8, where the 8x8 kernels
cost more than the small output saves."""


def scaled_size(input_shape: tuple[int, ...], scale: float, align: int) -> tuple[int, int]:
    """The (height, width) an input of ``input_shape`` (N, C, H, W) is resized to: each side times ``scale``,
    rounded to a multiple of ``align`` (at least ``align``)."""
    h, w = input_shape[-2:]
    return tuple(max(align, round(side * scale / align) * align) for side in (h, w))  # type: ignore[return-value]


def block_ratio(side: int, size: int) -> tuple[int, int]:
    """``(a, b)``: every ``b`` input pixels of a side of length ``side`` give ``a`` output pixels at length ``size``."""
    g = math.gcd(side, size)
    return size // g, side // g


def block_pays(input_hw: tuple[int, int], size: tuple[int, int]) -> bool:
    """Whether :class:`BlockResize` is the resize to use: each side shrinks by blocks of at most :data:`MAX_BLOCK`
    input and :data:`MAX_OUTPUT_BLOCK` output pixels."""
    return all(a <= min(b, MAX_OUTPUT_BLOCK) and b <= MAX_BLOCK
               for a, b in (block_ratio(int(side), int(out)) for side, out in zip(input_hw, size)))


def bilinear_block(a: int, b: int) -> torch.Tensor:
    """The ``(a, b)`` weights of bilinear downsizing (half-pixel centres) from ``b`` pixels to ``a``.

    Output pixel ``i`` samples the input at ``(i + 0.5) * b / a - 0.5``, which lies in ``[0, b - 1]`` for ``a <= b``:
    each block of ``b`` input pixels alone gives its ``a`` output pixels, with the same weights for every block.
    """
    w = torch.zeros(a, b, dtype=torch.float64)
    for i in range(a):
        src = (i + 0.5) * b / a - 0.5
        lo = math.floor(src)
        frac = src - lo
        w[i, lo] += 1.0 - frac
        if frac > 0:
            w[i, lo + 1] += frac
    return w


class BlockResize(nn.Module):
    """Bilinear downsizing of (N, C, H, W) to ``size`` as a strided grouped convolution and a depth-to-space.

    Each channel's ``b_h x b_w`` input blocks give ``a_h x a_w`` output pixels through fixed weights (the outer
    product of :func:`bilinear_block` per side): ``F.interpolate``'s function, computed from exact sampling
    positions (``F.interpolate`` rounds them to float32: outputs differ by about 1e-5 of the input's range). The
    weights are a buffer, never trained, and left out of the state dict.
    """

    def __init__(self, channels: int, input_hw: tuple[int, int], size: tuple[int, int]):
        super().__init__()
        (ah, bh), (aw, bw) = (block_ratio(side, out) for side, out in zip(input_hw, size))
        if ah > bh or aw > bw:
            raise ValueError(f"a block resize only shrinks; {tuple(input_hw)} to {tuple(size)} enlarges")
        self.channels, self.size = channels, tuple(size)
        self.a, self.b = (ah, aw), (bh, bw)
        kernel = torch.einsum("ik,jl->ijkl", bilinear_block(ah, bh), bilinear_block(aw, bw)).reshape(ah * aw, 1, bh, bw)
        self.register_buffer("weight", kernel.repeat(channels, 1, 1, 1).float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (ah, aw), (bh, bw) = self.a, self.b
        y = F.conv2d(x, self.weight.to(x.dtype), stride=(bh, bw), groups=self.channels)
        if ah * aw == 1:
            return y
        # Shapes as constants (the batch axis as -1): the exported graph needs no Shape/Gather ops to reshape.
        y = y.reshape(-1, self.channels, ah, aw, self.size[0] // ah, self.size[1] // aw).permute(0, 1, 4, 2, 5, 3)
        return y.reshape(-1, self.channels, *self.size)


class InputResize(nn.Module):
    """``model`` fed a bilinear resize of its input (N, C, H, W) to ``size`` (H, W).

    ``input_shape`` (the full frame's) lets the resize be a :class:`BlockResize`: where :func:`block_pays`, or as
    ``block`` says (``benchmarks/block_resize.py`` times both ways); without it, or else, ``F.interpolate``
    resizes (the same function, as ONNX ``Resize``).
    """

    def __init__(self, model: nn.Module, size: tuple[int, int], input_shape: tuple[int, ...] | None = None,
                 block: bool | None = None):
        super().__init__()
        self.model = model
        self.size = tuple(int(s) for s in size)
        if input_shape is None or len(input_shape) != 4:
            self.resize = None
        else:
            hw = (int(input_shape[-2]), int(input_shape[-1]))
            use = block_pays(hw, self.size) if block is None else block
            self.resize = BlockResize(int(input_shape[1]), hw, self.size) if use else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.resize is not None:
            return self.model(self.resize(x))
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
