"""Low-rank factorization of convolutions (ApproxCaliper's other knob): the worked example of a pass.

A k x k convolution from C_in to C_out channels is a matrix of shape
(C_out, C_in*k*k); its truncated SVD of rank r replaces it with a k x k
convolution to r channels followed by a 1 x 1 convolution to C_out. That runs as
two dense convolutions on every backend (unlike sparse weights), and it pays only
where ``r * (C_in*k*k + C_out) < C_out * C_in*k*k``; other layers are left alone.
Ranks are rounded to the pruning pass's ``round_to`` like pruned widths.

Everything the pass means is in this file: its spec section (``LowRankConfig``),
its knob (``LowRankKnobs``), its search space, what it adds to a candidate's key,
and the torch code that applies it. torch is imported inside the functions that
use it, so that reading a spec stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ApproxError
from .base import ApproximationPass, PassConfig, PassKnobs, Range, register_pass, span

if TYPE_CHECKING:
    from torch import nn

GRID = 0.05


class LowRankConfig(PassConfig):
    """``approximations.<nn>.lowrank``: the searched share of each layer's full rank (1 = whole)."""

    rank: Range(float, 0, 1, low_open=True) = (0.25, 1.0)


class LowRankKnobs(PassKnobs):
    """``rank_ratio`` below 1 factorizes each k x k convolution into a rank-r pair, r = ``rank_ratio`` of its full rank."""

    rank_ratio: float = 1.0


@register_pass
class LowRankPass(ApproximationPass):
    name = "lowrank"
    Config = LowRankConfig
    Knobs = LowRankKnobs

    def space(self, config: LowRankConfig | None, limits, chosen) -> dict[str, Any]:
        if config is None:
            return {}
        return {"rank_ratio": span(*config.rank, step=GRID)}

    def active(self, knobs) -> bool:
        return knobs.rank_ratio < 1.0

    def identity(self, knobs) -> dict[str, Any]:
        return {"rank_ratio": knobs.rank_ratio, "round_to": knobs.round_to} if self.active(knobs) else {}

    def check(self, knobs, nn: str, backend: str | None) -> None:
        if not 0.0 < knobs.rank_ratio <= 1.0:
            raise ApproxError(nn, "rank_ratio", f"{knobs.rank_ratio} is outside (0, 1]; 1 leaves the convolutions whole")

    def damage_phases(self, knobs) -> int:
        return 1 if self.active(knobs) else 0

    def apply(self, model, knobs, ctx):
        if not self.active(knobs):
            return model
        from ..pruning import output_heads

        count = factorize(model, knobs.rank_ratio, knobs.round_to, keep=output_heads(model, ctx.nn.example_input))
        ctx.recover(model, f"factorized {count} convolutions at rank ratio {knobs.rank_ratio}")
        return model


def factor_conv(conv: nn.Conv2d, rank: int) -> nn.Sequential:
    """The rank-``rank`` pair (k x k conv to ``rank`` channels, 1 x 1 conv back) closest to ``conv`` (truncated SVD)."""
    import torch
    from torch import nn

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
    from torch import nn

    from ..pruning import kept_channels

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
