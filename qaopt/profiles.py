"""Run profiles: how much work ``qaopt optimize`` spends, from a smoke test to the real result.

A profile caps the budgets the spec asks for; it never loosens the QoS goal or the
acceptance statistics, so a quick run's accepted configuration is as safe as a
default run's, only found with less search.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Profile(BaseModel):
    """Budget caps of one run; ``None`` keeps the spec's own value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    trials: int | None = Field(None, ge=1, description="search trials per study (aware and agnostic)")
    calibration_budget: int | None = Field(None, ge=1, description="QoS evaluations of the calibration")
    max_finetune_steps: int | None = Field(None, ge=0, description="cap on each candidate's fine-tuning steps")
    max_adapt_steps: int | None = Field(None, ge=0, description=(
        "cap on the steps that adapt an NN to an input scale once, shared by the candidates at it (resolution.adapt_steps)"))
    max_merge_end_to_end_steps: int | None = Field(None, ge=0, description=(
        "cap on the end-to-end steps after a merged NN's frozen distillation (search.merge[].end_to_end_steps)"))
    max_prune_steps: int | None = Field(None, ge=1, description="cap on iterative pruning steps")
    tuning_trials: int | None = Field(None, ge=0, description="kernel-tuning trials per candidate")
    validation_runs: int | None = Field(None, ge=1, description=(
        "cap on the closed-loop runs of one validated configuration (None: the spec's qos.acceptance.max_trials)"))
    validate_top: int = Field(3, ge=1, description="Pareto-front configurations validated closed-loop")
    closed_loop_checks: int | None = Field(None, ge=0, description=(
        "at most this many configurations checked closed-loop during the search (search.closed_loop); 0: none"))

    def caps(self) -> str:
        """The caps this profile sets, ``name=value`` each (what ``qaopt optimize --help`` lists); the rest are the spec's."""
        return ", ".join(f"{k}={v}" for k, v in self.model_dump(exclude={"name"}).items() if v is not None)


PROFILES: dict[str, Profile] = {
    # Finishes the shipped example in about 9 minutes on a 2-core CPU with bf16 (a Xeon with AMX, a Zen 5 EPYC) and
    # about 11 on a Zen 4 one (docs/BENCHMARKS.md, "The quick run's CPU work"; about a minute of it distilling its
    # merged NN on a frozen backbone, once per cache): few trials,
    # fine-tuning capped at 160 steps, untuned kernels (so no TVM), and a short closed-loop check of the winner.
    # The cap is what lets a scaled NN keep its accuracy:
    # CropFollow's merged NN at input scale 0.5, int8, erred distance L1 0.043 after 160 distillation steps (the
    # knobs table), against the reference's 0.035 and the region's reach of 0.047 (docs/BENCHMARKS.md, "Knobs"). No closed-loop checks during the search: a CropFollow check costs minutes, and six
    # trials leave no later trial for one to correct (the front's validation runs the same seeds
    # right after). Three front configurations may be validated: the informed cheapest, its milder
    # fallback, and then the fastest plain precision, so a run whose informed trials both fail
    # closed-loop still ends with an application-aware configuration; as six runs cannot accept,
    # validation stops at the first one with no failing run (the slower ones could not be chosen).
    "quick": Profile(
        name="quick",
        trials=6,
        calibration_budget=12,
        max_finetune_steps=160,
        max_adapt_steps=160,
        max_merge_end_to_end_steps=0,
        max_prune_steps=1,
        tuning_trials=0,
        validation_runs=6,
        validate_top=3,
        closed_loop_checks=0,
    ),
    # The real result on a 2-core CPU: the spec's trials, but fine-tuning capped
    # at 160 steps (a CropFollow NN's step costs 0.1-0.4 s there, so 400-step candidates would
    # take the whole budget) and TVM tuning capped (auto skips it where even an optimistic bound
    # loses to a vendor backend, and 32 trials is one short survey round where it does not);
    # closed-loop validation runs the spec's sequential test to its own cap (qos.acceptance.max_trials).
    "default": Profile(
        name="default",
        max_finetune_steps=160,
        max_prune_steps=2,
        tuning_trials=32,
        validate_top=8,
    ),
}


def get_profile(name: str) -> Profile:
    from qaopt.app_spec import QaoptError

    if name not in PROFILES:
        raise QaoptError(f"--profile: no profile named {name!r}; choose one of {', '.join(PROFILES)}")
    return PROFILES[name]
