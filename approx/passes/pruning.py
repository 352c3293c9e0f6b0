"""Structured channel pruning (torch-pruning): channels really go away (the torch code is :mod:`qaopt.approx.pruning`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveInt, field_validator

from ..errors import ApproxError
from .base import ApproximationPass, PassConfig, PassKnobs, Range, register_pass, span

GRID = 0.05
"""Ratios are sampled on a grid so that trials reuse each other's cached candidates."""


class PruningConfig(PassConfig):
    """``approximations.<nn>.pruning``: the searched global ratio range and the fixed settings."""

    ratio: Range(float, 0, 1, high_open=True) = (0.0, 0.9)
    importance: Literal["l1", "taylor"] = "l1"
    round_to: PositiveInt = 8
    steps: PositiveInt = 1
    per_layer: dict[str, float] = Field(default_factory=dict)

    @field_validator("per_layer")
    @classmethod
    def _per_layer_range(cls, value: dict[str, float]) -> dict[str, float]:
        for layer, ratio in value.items():
            if not 0.0 <= ratio < 1.0:
                raise ValueError(f"ratio of layer {layer!r} must be in [0, 1), got {ratio}")
        return value


class PruningKnobs(PassKnobs):
    """``prune_ratio`` of every prunable layer's channels go (output heads never); ``per_layer`` overrides it
    for named modules (a container's ratio applies to the layers inside it). Pruning runs in
    ``prune_steps`` equal steps, each followed by its share of the fine-tuning, as ApproxCaliper did:
    each step removes less at once, so each round of fine-tuning has less to win back. Kept
    widths are multiples of ``round_to`` (the low-rank pass rounds its ranks to it too)."""

    prune_ratio: float = 0.0
    importance: Literal["l1", "taylor"] = "l1"
    round_to: PositiveInt = 8
    prune_steps: PositiveInt = 1
    per_layer: dict[str, float] = Field(default_factory=dict)


@register_pass
class PruningPass(ApproximationPass):
    name = "pruning"
    Config = PruningConfig
    Knobs = PruningKnobs

    def space(self, config: PruningConfig | None, limits, chosen) -> dict[str, Any]:
        if config is None:
            return {}
        return {
            "prune_ratio": span(*config.ratio, step=GRID),
            "importance": config.importance,
            "round_to": config.round_to,
            "prune_steps": min(config.steps, limits.max_prune_steps or config.steps),
            "per_layer": dict(config.per_layer),
        }

    def settle(self, knobs: dict[str, Any]) -> dict[str, Any]:
        return {**knobs, "prune_steps": knobs.get("prune_steps", 1) if knobs.get("prune_ratio", 0.0) > 0 else 1}

    def active(self, knobs) -> bool:
        return knobs.prune_ratio > 0.0 or any(r > 0.0 for r in knobs.per_layer.values())

    def identity(self, knobs) -> dict[str, Any]:
        # The ratio is always part of the key (as it has been since the first cache entries).
        return self.knob_values(knobs) if self.active(knobs) else {"prune_ratio": knobs.prune_ratio}

    def check(self, knobs, nn: str, backend: str | None) -> None:
        if not 0.0 <= knobs.prune_ratio < 1.0:
            raise ApproxError(nn, "prune_ratio", f"{knobs.prune_ratio} is outside [0, 1); 0.5 removes half the channels")
        for layer, ratio in knobs.per_layer.items():
            if not 0.0 <= ratio < 1.0:
                raise ApproxError(nn, f"per_layer.{layer}", f"{ratio} is outside [0, 1)")

    def describe(self, knobs) -> dict[str, str]:
        return {"prune ratio": f"{knobs.prune_ratio:.2f}"}

    def damage_phases(self, knobs) -> int:
        return knobs.prune_steps if self.active(knobs) else 0

    def apply(self, model, knobs, ctx):
        if not self.active(knobs):
            return model
        from ..pruning import prune

        ctx.progress(f"pruning {knobs.prune_ratio:.0%} of channels in {knobs.prune_steps} step(s)")
        return prune(
            model, ctx.nn.example_input, knobs, ctx.nn.name,
            after_step=lambda step: ctx.recover(model, f"pruning step {step + 1}/{knobs.prune_steps}"),
            taylor_loss=lambda: ctx.training_loss(model),
        )
