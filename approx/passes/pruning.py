"""Structured channel pruning (torch-pruning): channels really go away (the torch code is :mod:`qaopt.approx.pruning`)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from ..errors import ApproxError
from .base import ApproximationPass, PassConfig, PassKnobs, Range, register_pass, span

GRID = 0.05
"""Ratios are sampled on a grid so that trials reuse each other's cached candidates."""


class LadderConfig(PassConfig):
    """``approximations.<nn>.pruning.ladder``: prune progressively, keeping a fine-tuned snapshot per rung.

    Without it, every trial prunes the NN from scratch in ``steps`` steps and fine-tunes
    it with the trial's own budget; with it, the NN is pruned once, ``step`` of its
    channels at a time, each rung distilled for ``finetune_steps`` with the learning
    rate rewound, and a trial's ratio picks a rung (:mod:`qaopt.approx.ladder`).
    """

    step: float = Field(0.05, gt=0.0, lt=1.0, description="share of the original channels each rung removes")
    finetune_steps: PositiveInt = Field(160, description="distillation steps after each rung's pruning")


class PruningConfig(PassConfig):
    """``approximations.<nn>.pruning``: the searched global ratio range and the fixed settings."""

    ratio: Range(float, 0, 1, high_open=True) = (0.0, 0.9)
    importance: Literal["l1", "taylor"] = "l1"
    round_to: PositiveInt = 8
    steps: PositiveInt = 1
    per_layer: dict[str, float] = Field(default_factory=dict)
    ladder: LadderConfig | None = None

    @model_validator(mode="after")
    def _ladder_alone(self) -> PruningConfig:
        if self.ladder is not None and self.per_layer:
            raise ValueError("per_layer cannot be combined with ladder: a ladder prunes every layer by the same share "
                             "of its channels; remove one of them")
        return self

    def ratios(self) -> tuple[float, float]:
        """The searched ratio range, on the ladder's rungs when there is a ladder (the top rung within the range)."""
        lo, hi = self.ratio
        if self.ladder is None:
            return lo, hi
        step = self.ladder.step
        return round(math.ceil(lo / step - 1e-9) * step, 6), round(math.floor(hi / step + 1e-9) * step, 6)

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
    ladder_step: float = Field(0.0, ge=0.0, lt=1.0)
    """0: prune from scratch; else the rung spacing of the ladder the ratio is taken from."""
    ladder_finetune_steps: NonNegativeInt = 0


LADDER_KNOBS = ("ladder_step", "ladder_finetune_steps")


def on_ladder(knobs) -> bool:
    return knobs.ladder_step > 0.0


@register_pass
class PruningPass(ApproximationPass):
    name = "pruning"
    Config = PruningConfig
    Knobs = PruningKnobs

    def space(self, config: PruningConfig | None, limits, chosen) -> dict[str, Any]:
        if config is None:
            return {}
        fixed = {"importance": config.importance, "round_to": config.round_to, "per_layer": dict(config.per_layer)}
        if config.ladder is not None:
            # A ladder is built once, whatever the run's profile: its budget is the spec's.
            return {"prune_ratio": span(*config.ratios(), step=config.ladder.step), **fixed, "prune_steps": 1,
                    "ladder_step": config.ladder.step, "ladder_finetune_steps": config.ladder.finetune_steps}
        return {"prune_ratio": span(*config.ratio, step=GRID), **fixed,
                "prune_steps": min(config.steps, limits.max_prune_steps or config.steps)}

    def settle(self, knobs: dict[str, Any]) -> dict[str, Any]:
        if knobs.get("prune_ratio", 0.0) > 0:
            return knobs
        return {**knobs, "prune_steps": 1, "ladder_step": 0.0, "ladder_finetune_steps": 0}

    def active(self, knobs) -> bool:
        return knobs.prune_ratio > 0.0 or any(r > 0.0 for r in knobs.per_layer.values())

    def identity(self, knobs) -> dict[str, Any]:
        # The ratio is always part of the key (as it has been since the first cache entries); the ladder's
        # knobs only on a ladder, so candidates pruned from scratch keep the keys they always had.
        if not self.active(knobs):
            return {"prune_ratio": knobs.prune_ratio}
        values = self.knob_values(knobs)
        return values if on_ladder(knobs) else {k: v for k, v in values.items() if k not in LADDER_KNOBS}

    def check(self, knobs, nn: str, backend: str | None) -> None:
        if not 0.0 <= knobs.prune_ratio < 1.0:
            raise ApproxError(nn, "prune_ratio", f"{knobs.prune_ratio} is outside [0, 1); 0.5 removes half the channels")
        for layer, ratio in knobs.per_layer.items():
            if not 0.0 <= ratio < 1.0:
                raise ApproxError(nn, f"per_layer.{layer}", f"{ratio} is outside [0, 1)")
        if on_ladder(knobs):
            if knobs.per_layer:
                raise ApproxError(nn, "per_layer", "a ladder prunes every layer alike; per_layer cannot be combined with it")
            rung = knobs.prune_ratio / knobs.ladder_step
            if abs(rung - round(rung)) > 1e-6:
                raise ApproxError(nn, "prune_ratio", f"{knobs.prune_ratio} is not a rung of a ladder with step "
                                  f"{knobs.ladder_step}; use a multiple of it")
            if knobs.ladder_finetune_steps <= 0:
                raise ApproxError(nn, "ladder_finetune_steps", "a ladder fine-tunes after every rung: give it steps (e.g. 160)")

    def describe(self, knobs) -> dict[str, str]:
        if on_ladder(knobs) and self.active(knobs):
            return {"prune ratio": f"{knobs.prune_ratio:.2f} (ladder rung {round(knobs.prune_ratio / knobs.ladder_step)})"}
        return {"prune ratio": f"{knobs.prune_ratio:.2f}"}

    def damage_phases(self, knobs) -> int:
        # A rung comes fine-tuned: nothing this build does needs recovering from.
        return knobs.prune_steps if self.active(knobs) and not on_ladder(knobs) else 0

    def apply(self, model, knobs, ctx):
        if not self.active(knobs):
            return model
        if on_ladder(knobs):
            from ..ladder import LadderRecipe

            recipe = LadderRecipe.of(knobs)
            ctx.progress(f"taking rung {recipe.rung_of(knobs.prune_ratio)} of the pruning ladder")
            return ctx.ladder(recipe).model(recipe.rung_of(knobs.prune_ratio))
        from ..pruning import prune

        ctx.progress(f"pruning {knobs.prune_ratio:.0%} of channels in {knobs.prune_steps} step(s)")
        return prune(
            model, ctx.nn.example_input, knobs, ctx.nn.name,
            after_step=lambda step: ctx.recover(model, f"pruning step {step + 1}/{knobs.prune_steps}"),
            taylor_loss=lambda: ctx.training_loss(model),
        )
