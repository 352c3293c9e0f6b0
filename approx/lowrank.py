"""Low-rank factorization of convolutions (ApproxCaliper's other knob).

A k x k convolution from C_in to C_out channels is a matrix of shape
(C_out, C_in*k*k); its truncated SVD of rank r replaces it with a k x k
convolution to r channels followed by a 1 x 1 convolution to C_out. That runs as
two dense convolutions on every backend (unlike sparse weights), and it pays only
where ``r * (C_in*k*k + C_out) < C_out * C_in*k*k``; other layers are left alone.
Ranks are rounded to ``round_to`` like pruned widths.
"""

from __future__ import annotations

import torch
from torch import nn

from .pruning import kept_channels


def factor_conv(conv: nn.Conv2d, rank: int) -> nn.Sequential:
    """The rank-``rank`` pair (k x k conv to ``rank`` channels, 1 x 1 conv back) closest to ``conv`` (truncated SVD)."""
    weight = conv.weight.detach().flatten(1)  # (C_out, C_in*k*k)
    u, s, vt = torch.linalg.svd(weight, full_matrices=False)
    root = s[:rank].sqrt()
    first = nn.Conv2d(conv.in_channels, rank, conv.kernel_size, conv.stride, conv.padding, conv.dilation, bias=False)
    first.weight.data = (root[:, None] * vt[:rank]).reshape(rank, *conv.weight.shape[1:]).contiguous()
    second = nn.Conv2d(rank, conv.out_channels, 1, bias=conv.bias is not None)
    second.weight.data = (u[:, :rank] * root).reshape(conv.out_channels, rank, 1, 1).contiguous()
    if conv.bias is not None:
        second.bias.data = conv.bias.detach().clone()
    return nn.Sequential(first, second)


def factorize(model: nn.Module, rank_ratio: float, round_to: int, keep: list[nn.Module]) -> int:
    """Replace, in place, each dense k x k conv (k > 1) not in ``keep`` whose rank-``rank_ratio`` factorization saves MACs.

    The rank is ``rank_ratio`` of the full rank ``min(C_out, C_in*k*k)``, rounded to
    ``round_to``. Returns how many convolutions were factorized.
    """
    done = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Conv2d) or child in keep or child.groups != 1 or child.kernel_size == (1, 1):
                continue
            fan_in = child.in_channels * child.kernel_size[0] * child.kernel_size[1]
            rank = kept_channels(min(child.out_channels, fan_in), 1.0 - rank_ratio, round_to)
            if rank * (fan_in + child.out_channels) < child.out_channels * fan_in:
                setattr(parent, name, factor_conv(child, rank))
                done += 1
    return done
