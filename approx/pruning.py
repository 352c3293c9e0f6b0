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
    produced: dict[int, tuple[nn.Module, torch.Tensor]] = {}
    order: list[nn.Module] = []

    def record(module: nn.Module, _inputs, output) -> None:
        # The output is kept alive with its module: an intermediate tensor freed during the forward pass would
        # let a later tensor (the model's output, made by a parameter-free op) take its id and pass for its output.
        produced[id(output)] = (module, output)
        order.append(module)

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, _PRUNABLE)]
    try:
        with torch.no_grad():
            out = model(example)
    finally:
        for hook in hooks:
            hook.remove()
    outputs = out if isinstance(out, (tuple, list)) else [out]
    heads = [produced[id(o)][0] for o in outputs if id(o) in produced]
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


def _pruner(model: nn.Module, example: torch.Tensor, importance: str, ratio_dict: dict, steps: int,
            heads: list[nn.Module], nn_name: str, knob: str):
    """torch-pruning's pruner for exact per-layer ratios, its tracing failures turned into an :class:`ApproxError` on ``knob``."""
    scorer = tp.importance.GroupTaylorImportance() if importance == "taylor" else tp.importance.GroupMagnitudeImportance(p=1)
    try:
        return tp.pruner.BasePruner(
            model, example, importance=scorer, pruning_ratio=0.0, pruning_ratio_dict=ratio_dict,
            iterative_steps=steps, ignored_layers=heads,
        )
    except Exception as exc:  # torch-pruning raises whatever the traced forward raises
        raise ApproxError(
            nn_name,
            knob,
            f"torch-pruning cannot trace the model ({type(exc).__name__}: {exc}); "
            "its forward must run on a tensor of input_shape with plain torch ops, or set prune_ratio to 0",
        ) from exc


def _step(pruner, model: nn.Module, importance: str, taylor_loss: Callable[[], torch.Tensor] | None) -> None:
    if taylor_loss is not None and importance == "taylor":
        model.zero_grad()
        taylor_loss().backward()
    pruner.step()
    model.zero_grad(set_to_none=True)


def _check_shape(model: nn.Module, example: torch.Tensor, reference: torch.Tensor, nn_name: str, knob: str) -> None:
    with torch.no_grad():
        shape = model(example).shape
    if shape != reference.shape:
        raise ApproxError(nn_name, knob, f"pruning changed the output shape {tuple(reference.shape)} to {tuple(shape)}")


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
    with torch.no_grad():
        reference = model(example)
    pruner = _pruner(model, example, knobs.importance, ratio_dict, knobs.prune_steps, heads, nn_name, "prune_ratio")
    for step in range(knobs.prune_steps):
        _step(pruner, model, knobs.importance, taylor_loss)
        after_step(step)
    _check_shape(model, example, reference, nn_name, "prune_ratio")
    return model


def channel_counts(model: nn.Module) -> dict[str, int]:
    """Output channels of every prunable layer, by module name: the widths a ladder's rungs are measured against."""
    return {name: _out_channels(m) for name, m in model.named_modules() if isinstance(m, _PRUNABLE)}


def prune_to(
    model: nn.Module,
    example: torch.Tensor,
    widths: dict[str, int],
    importance: str,
    nn_name: str,
    *,
    taylor_loss: Callable[[], torch.Tensor] | None = None,
) -> nn.Module:
    """Prune ``model`` in place, in one step, until each named layer has ``widths[name]`` output channels.

    A ladder's rungs are fractions of the *original* widths, so each rung removes
    exactly what separates it from the next, whatever earlier rungs removed.
    Output heads and layers already at their width are left alone.
    """
    heads = output_heads(model, example)
    modules = dict(model.named_modules())
    ratio_dict = {}
    for name, width in widths.items():
        module = modules[name]
        channels = _out_channels(module)
        if module not in heads and width < channels:
            ratio_dict[module] = 1.0 - (width + 0.5) / channels
    if not ratio_dict:
        return model
    with torch.no_grad():
        reference = model(example)
    _step(_pruner(model, example, importance, ratio_dict, 1, heads, nn_name, "pruning.ladder"), model, importance, taylor_loss)
    _check_shape(model, example, reference, nn_name, "pruning.ladder")
    return model
