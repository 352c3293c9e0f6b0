"""Fine-tuning by distillation: the budget that wins back what the damaging passes cost (the code is :mod:`qaopt.approx.finetune`).

The budget is shared evenly by the damage phases of the passes before it (each
pruning step, the factorization), so each recovers right after it hurt; with
nothing damaged, the whole budget fine-tunes the NN at the end.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt

from .base import ApproximationPass, PassConfig, PassKnobs, Range, passes, register_pass, span


class FinetuneConfig(PassConfig):
    """``approximations.<nn>.finetune``: fine-tuning (distillation from the unpruned NN) budget range, in optimizer
    steps, and the optimizer's learning rate and batch size when the defaults do not suit the NN (a large NN that
    a high rate knocks off its optimum, a GPU that takes larger batches); pruning ladders fine-tune with them too."""

    steps: Range(int, 0) = (0, 0)
    lr: float | None = Field(None, gt=0.0, lt=1.0, description="peak learning rate (default 5e-4)")
    batch_size: PositiveInt | None = Field(None, le=4096, description="images per step (default 16)")


class FinetuneKnobs(PassKnobs):
    finetune_steps: NonNegativeInt = 0
    finetune_lr: NonNegativeFloat = 0.0
    """0: the recipe's learning rate."""
    finetune_batch_size: NonNegativeInt = 0
    """0: the recipe's batch size."""


@register_pass
class FinetunePass(ApproximationPass):
    name = "finetune"
    Config = FinetuneConfig
    Knobs = FinetuneKnobs

    def space(self, config: FinetuneConfig | None, limits, chosen) -> dict[str, Any]:
        # Searched only for an NN that another pass damaged in the candidate: an intact NN, or one whose only change
        # was adapted once and shared (a scaled NN's adaptation), has nothing to win back.
        if config is None or (chosen is not None and not any(p.active(chosen) and not p.shared(chosen)
                                                              for p in passes("float") if p is not self)):
            return {}
        lo, hi = config.steps
        if limits.max_finetune_steps is not None:
            lo, hi = min(lo, limits.max_finetune_steps), min(hi, limits.max_finetune_steps)
        return {"finetune_steps": span(lo, hi, step=max(1, (hi - lo) // 4)),
                "finetune_lr": config.lr or 0.0, "finetune_batch_size": config.batch_size or 0}

    def identity(self, knobs) -> dict[str, Any]:
        # The learning rate and batch size key a candidate through its recipe (:func:`qaopt.approx.finetune.tuned`), as the defaults do.
        return {"finetune_steps": knobs.finetune_steps}

    def describe(self, knobs) -> dict[str, str]:
        return {"fine-tune steps": str(knobs.finetune_steps)}

    def prepare(self, knobs, ctx) -> None:
        total, phases = knobs.finetune_steps, max(ctx.phases, 1)
        ctx.recovery = iter([total * (i + 1) // phases - total * i // phases for i in range(phases)])

    def apply(self, model, knobs, ctx):
        if not ctx.phases and knobs.finetune_steps:
            ctx.progress(f"fine-tuning {knobs.finetune_steps} steps")
            ctx.distiller.run(model, knobs.finetune_steps)
        return model

