"""Fine-tuning by distillation: the budget that wins back what the damaging passes cost (the code is :mod:`qaopt.approx.finetune`).

The budget is shared evenly by the damage phases of the passes before it (each
pruning step, the factorization), so each recovers right after it hurt; with
nothing damaged, the whole budget fine-tunes the NN at the end.
"""

from __future__ import annotations

from typing import Any

from pydantic import NonNegativeInt

from .base import ApproximationPass, PassConfig, PassKnobs, Range, passes, register_pass, span


class FinetuneConfig(PassConfig):
    """``approximations.<nn>.finetune``: fine-tuning (distillation from the unpruned NN) budget range, in optimizer steps."""

    steps: Range(int, 0) = (0, 0)


class FinetuneKnobs(PassKnobs):
    finetune_steps: NonNegativeInt = 0


@register_pass
class FinetunePass(ApproximationPass):
    name = "finetune"
    Config = FinetuneConfig
    Knobs = FinetuneKnobs

    def space(self, config: FinetuneConfig | None, limits, chosen) -> dict[str, Any]:
        # Searched only for an NN that another pass damaged: an intact NN has nothing to win back.
        if config is None or (chosen is not None and not any(p.active(chosen) for p in passes("float") if p is not self)):
            return {}
        lo, hi = config.steps
        if limits.max_finetune_steps is not None:
            lo, hi = min(lo, limits.max_finetune_steps), min(hi, limits.max_finetune_steps)
        return {"finetune_steps": span(lo, hi, step=max(1, (hi - lo) // 4))}

    def identity(self, knobs) -> dict[str, Any]:
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

