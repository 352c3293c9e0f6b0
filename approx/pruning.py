"""Structured channel pruning with torch-pruning: channels really go away.

Output heads (the layers whose outputs are the NN's outputs) keep their outputs;
every other conv/linear layer loses ``prune_ratio`` of its output channels, rounded
so that the kept count is a multiple of ``round_to`` (pruned shapes then recur across candidates,
stay SIMD-friendly, and share tuning records).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch_pruning as tp
from torch import nn

from .errors import ApproxError

_PRUNABLE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def output_heads(model: nn.Module, example: torch.Tensor) -> list[nn.Module]:
    """The conv/linear layers whose output tensors are (parts of) the model's output.

    Falls back to the last such layer run when the output passes through a
    parameter-free op (a ``tanh``, a ``squeeze``) after its head.
    """
    produced: dict[int, nn.Module] = {}
    order: list[nn.Module] = []

    def record(module: nn.Module, _inputs, output) -> None:
        produced[id(output)] = module
        order.append(module)

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, _PRUNABLE)]
    try:
        with torch.no_grad():
            out = model(example)
    finally:
        for hook in hooks:
            hook.remove()
    outputs = out if isinstance(out, (tuple, list)) else [out]
    heads = [produced[id(o)] for o in outputs if id(o) in produced]
    return heads or order[-1:]


def _out_channels(module: nn.Module) -> int:
    return module.out_features if isinstance(module, nn.Linear) else module.out_channels


def kept_channels(channels: int, ratio: float, round_to: int) -> int:
    """Channels a layer keeps: ``(1 - ratio)`` of them, to the nearest multiple of ``round_to``, at least ``round_to``.

    torch-pruning's own ``round_to`` rounds the kept count down and skips a layer
    whose count rounds to zero, so a high ratio would leave small layers unpruned.
    """
    if ratio <= 0.0 or channels <= round_to:
        return channels
    kept = math.floor(channels * (1.0 - ratio) / round_to + 0.5) * round_to
    return min(channels, max(round_to, kept))


def _layer_ratios(model: nn.Module, heads: list[nn.Module], knobs, nn_name: str) -> dict[nn.Module, float]:
    """Per-layer ratios for torch-pruning that land exactly on the rounded kept counts."""
    modules = dict(model.named_modules())
    ratios = {m: knobs.prune_ratio for m in modules.values() if isinstance(m, _PRUNABLE)}
    for name, ratio in knobs.per_layer.items():
        if name not in modules or name == "":
            examples = [n for n, m in modules.items() if isinstance(m, _PRUNABLE)][:8]
            raise ApproxError(
                nn_name,
                f"per_layer.{name}",
                f"the model has no module named {name!r}; use a name from model.named_modules(), e.g. {examples}",
            )
        inner = [m for m in modules[name].modules() if isinstance(m, _PRUNABLE)]
        if not inner:
            raise ApproxError(nn_name, f"per_layer.{name}", "the module holds no conv or linear layer to prune")
        ratios.update(dict.fromkeys(inner, ratio))
    exact = {}
    for module, ratio in ratios.items():
        channels = _out_channels(module)
        kept = kept_channels(channels, ratio, knobs.round_to)
        if module not in heads and kept < channels:
            # torch-pruning keeps int(channels * (1 - r)); the half channel absorbs float error.
            exact[module] = 1.0 - (kept + 0.5) / channels
    return exact


def prune(
    model: nn.Module,
    example: torch.Tensor,
    knobs,
    nn_name: str,
    *,
    after_step: Callable[[int], None] = lambda step: None,
    taylor_loss: Callable[[], torch.Tensor] | None = None,
) -> nn.Module:
    """Prune ``model`` in place in ``knobs.prune_steps`` steps; ``after_step(i)`` runs between them (fine-tuning).

    ``taylor_loss`` computes a loss on a batch of training data; Taylor importance
    ranks channels by the gradients it leaves.
    """
    if knobs.importance == "taylor" and taylor_loss is None:
        raise ApproxError(nn_name, "importance", "taylor importance needs training data for gradients")
    heads = output_heads(model, example)
    ratio_dict = _layer_ratios(model, heads, knobs, nn_name)
    importance = tp.importance.GroupTaylorImportance() if knobs.importance == "taylor" else tp.importance.GroupMagnitudeImportance(p=1)
    with torch.no_grad():
        reference = model(example)
    try:
        pruner = tp.pruner.BasePruner(
            model,
            example,
            importance=importance,
            pruning_ratio=0.0,
            pruning_ratio_dict=ratio_dict,
            iterative_steps=knobs.prune_steps,
            ignored_layers=heads,
        )
    except Exception as exc:  # torch-pruning raises whatever the traced forward raises
        raise ApproxError(
            nn_name,
            "prune_ratio",
            f"torch-pruning cannot trace the model ({type(exc).__name__}: {exc}); "
            "its forward must run on a tensor of input_shape with plain torch ops, or set prune_ratio to 0",
        ) from exc
    for step in range(knobs.prune_steps):
        if taylor_loss is not None and knobs.importance == "taylor":
            model.zero_grad()
            taylor_loss().backward()
        pruner.step()
        model.zero_grad(set_to_none=True)
        after_step(step)
    with torch.no_grad():
        shape = model(example).shape
    if shape != reference.shape:
        raise ApproxError(nn_name, "prune_ratio", f"pruning changed the output shape {tuple(reference.shape)} to {tuple(shape)}")
    return model
