"""Input resolution: the NN sees its frame resized to a searched share of each side (the code is :mod:`qaopt.approx.resolution`).

The resize runs inside the candidate's graph, so the candidate still takes the
application's full-size frame and its measured latency includes the resize. The NN
adapts to the new scale by distillation from its reference at full resolution: by
default each candidate with the fine-tuning budget its trial samples (one damage
phase), or, with ``adapt_steps``, once per NN and scale with that budget, stored and
shared by every candidate at that scale (:meth:`ResolutionPass.shared`), so that a long
adaptation costs a run once. A trial's budget caps what adapting costs it, and a
scaled NN's closed-loop robustness grows with adaptation long after its mean error
settles: CropFollow's merged NN at input 0.5, adapted 160 steps, failed 14 of 48 runs,
480 steps 2, 1000 steps 1; adapted 1000 steps at 0.75 it failed none of 56 (docs/BENCHMARKS.md, "Adapting a
scale once").
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import CategoricalDistribution
from pydantic import Field, NonNegativeInt, PositiveInt, field_validator

from ..errors import ApproxError
from .base import ApproximationPass, PassConfig, PassKnobs, register_pass

DEFAULT_SCALES = (1.0, 0.75, 0.5, 0.375)


class ResolutionConfig(PassConfig):
    """``approximations.<nn>.resolution``: the input scales searched (share of each side; 1 keeps the NN as it is),
    and the multiple each resized side is rounded to."""

    scales: list[float] = Field(default_factory=lambda: list(DEFAULT_SCALES), min_length=1, description=(
        "shares of each side of the input, each in (0, 1]; 0.5 resizes a 240x320 frame to 120x160"))
    align: PositiveInt = Field(8, le=256, description="each resized side is a multiple of this (at least this)")
    adapt_steps: NonNegativeInt = Field(0, le=100_000, description=(
        "distillation steps that adapt the NN to each scale once, stored and shared by every candidate at that scale "
        "(its pruning and fine-tuning start from it); 0: each candidate adapts with its own fine-tuning budget"))

    @field_validator("scales")
    @classmethod
    def _scales(cls, value: list[float]) -> list[float]:
        for s in value:
            if not 0.0 < s <= 1.0:
                raise ValueError(f"every scale must be in (0, 1], got {s}; 0.5 halves each side of the input")
        return sorted(set(value), reverse=True)


def _resize_rule() -> str:
    """How a candidate's graph resizes, in its cache key: a strided convolution where the ratio's blocks are at
    most ``MAX_BLOCK`` input pixels (:class:`~qaopt.approx.resolution.BlockResize`), so that a change of the rule
    rebuilds the candidates it changes; keys without it are of graphs that always used ONNX ``Resize``."""
    from ..resolution import MAX_BLOCK, MAX_OUTPUT_BLOCK

    return f"block {MAX_OUTPUT_BLOCK}/{MAX_BLOCK}"


class ResolutionKnobs(PassKnobs):
    """``input_scale`` of each side of the input is what the NN sees (1.0: the full frame); sides are rounded to
    multiples of ``input_align``; ``input_adapt_steps`` > 0 adapts the NN to the scale once, shared by every
    candidate at it."""

    input_scale: float = Field(1.0, gt=0.0, le=1.0)
    input_align: PositiveInt = 8
    input_adapt_steps: NonNegativeInt = 0


@register_pass
class ResolutionPass(ApproximationPass):
    name = "resolution"
    Config = ResolutionConfig
    Knobs = ResolutionKnobs

    def space(self, config: ResolutionConfig | None, limits, chosen) -> dict[str, Any]:
        if config is None:
            return {}
        adapt = config.adapt_steps if limits.max_adapt_steps is None else min(config.adapt_steps, limits.max_adapt_steps)
        return {"input_scale": CategoricalDistribution(config.scales), "input_align": config.align,
                "input_adapt_steps": adapt}

    def probes(self, config: ResolutionConfig | None, limits) -> list[dict[str, Any]]:
        return [] if config is None else [{"input_scale": s} for s in config.scales if s < 1.0]

    def settle(self, knobs: dict[str, Any]) -> dict[str, Any]:
        return knobs if knobs.get("input_scale", 1.0) < 1.0 else {**knobs, "input_adapt_steps": 0}

    def active(self, knobs) -> bool:
        return knobs.input_scale < 1.0

    def identity(self, knobs) -> dict[str, Any]:
        values = super().identity(knobs)
        return {**values, "resize": _resize_rule()} if values else values

    def shared(self, knobs) -> bool:
        return self.active(knobs) and knobs.input_adapt_steps > 0

    def describe(self, knobs) -> dict[str, str]:
        adapted = f", adapted {knobs.input_adapt_steps} steps" if self.shared(knobs) else ""
        return {"input scale": f"{knobs.input_scale:g}{adapted}"}

    def check(self, knobs, nn: str, backend: str | None) -> None:
        if not 0.0 < knobs.input_scale <= 1.0:
            raise ApproxError(nn, "input_scale", f"{knobs.input_scale} is outside (0, 1]; 0.5 halves each side")

    def model_problems(self, config: ResolutionConfig, target) -> list[tuple[tuple, str]]:
        from ..resolution import check_takes, scaled_size

        shape = tuple(target.input_shape)
        if len(shape) != 4:
            return [((), f"resolution resizes images (N, C, H, W); this NN's input_shape is {list(shape)}")]
        problems = []
        for i, scale in enumerate(config.scales):
            size = scaled_size(shape, scale, config.align)
            why = check_takes(target.model, shape, size)
            if why is not None:
                problems.append((("scales", i), f"scale {scale:g} resizes the input to {size[0]}x{size[1]}, which "
                                                 f"the architecture cannot take ({why}); drop it or choose another"))
        return problems

    def damage_phases(self, knobs) -> int:
        return 1 if self.active(knobs) and not self.shared(knobs) else 0

    def apply(self, model, knobs, ctx):
        if not self.active(knobs):
            return model
        from ..resolution import InputResize, check_takes, scaled_size

        shape = tuple(ctx.nn.input_shape)
        if len(shape) != 4:
            raise ApproxError(ctx.nn.name, "input_scale", f"resolution resizes images (N, C, H, W); the input is {list(shape)}")
        size = scaled_size(shape, knobs.input_scale, knobs.input_align)
        why = check_takes(model, shape, size)
        if why is not None:
            raise ApproxError(ctx.nn.name, "input_scale", f"{knobs.input_scale:g} gives {size[0]}x{size[1]}, which the "
                                                          f"architecture cannot take: {why}")
        model = InputResize(model, size, shape)
        if self.shared(knobs):
            adapting = f"input resized to {size[0]}x{size[1]}: adapting {knobs.input_adapt_steps} steps"
            ctx.progress(f"{adapting} (once per scale)")
            ctx.distiller.run(model, knobs.input_adapt_steps, lambda done, steps, seconds: ctx.progress(
                f"{adapting}: {done} done in {seconds / 60:.1f} min, about {seconds / done * (steps - done) / 60:.0f} "
                "min left"))
        else:
            ctx.recover(model, f"input resized to {size[0]}x{size[1]}")
        return model
