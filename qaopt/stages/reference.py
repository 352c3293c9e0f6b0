"""The reference stage: the spec's NNs as candidates, their point in the region, and their latency.

Its artifact is the run's :class:`~qaopt.search.SearchContext` (the NNs with their
error data, on-policy and stress recordings included, and the memo of measurements that every
later stage shares) and the reference :class:`~qaopt.result.Configuration`. It fails
with the reason when even the reference NNs lie outside the region, since then no
approximation can be shown valid.
"""

from __future__ import annotations

from dataclasses import dataclass

from qaopt.pipeline import BaseStage, StageRun, register_stage
from qaopt.report import format_errors
from qaopt.result import FIDELITY_GUIDE, Configuration
from qaopt.search import OptimizeError, SearchContext
from qaopt.stages.region import CLOSED_LOOP_FILE, REGION_PLOT, CalibratedRegion


@dataclass(frozen=True)
class Reference:
    """The reference stage's artifact: the run's workbench and the reference configuration, measured."""

    ctx: SearchContext
    configuration: Configuration


@register_stage
class ReferenceStage(BaseStage):
    """Build the reference NNs, place them in the region, measure their frame."""

    name = "reference NNs"
    inputs = ("calibration",)
    artifact = "the on-policy recording and the reference candidates (cache)"

    def run(self, run: StageRun, inputs) -> Reference:
        plan = run.plan
        calibrated: CalibratedRegion = inputs["calibration"]
        nns = plan.application.target_nns(plan.cache_dir)
        ctx = SearchContext(plan, nns, calibrated.region, plan.application.stress_set(plan.cache_dir, nns))
        return Reference(ctx, reference_configuration(ctx, calibrated))


def reference_configuration(ctx: SearchContext, calibrated: CalibratedRegion) -> Configuration:
    """The reference configuration, measured; an error saying why when even it falls outside the region.

    When the calibrated region alone certifies the reference, the closed-loop evidence is what
    moved the boundary, and the message says so.
    """
    plan = ctx.plan
    region = calibrated.searched()
    point = ctx.errors_of(ctx.reference)
    for i, axis in enumerate(region.space.axes):
        if point[axis.name] < axis.min:
            raise OptimizeError(
                f"{plan.source}: calibration.space.{i} ({axis.name}) starts at min = {axis.min:g}, above the "
                f"reference NN's error {point[axis.name]:.4g}: the reference lies outside the calibrated space. "
                f"Set its min to at most {point[axis.name]:.4g} (or leave it out: 0) and calibrate again.")
    if not region.contains(point):
        region.plot(plan.run_dir / REGION_PLOT, reference=point)  # the plot the message points to shows where they fall
        empty = region.empty_reason()
        if calibrated.region.contains(point):
            why = (f"the closed-loop evidence in {CLOSED_LOOP_FILE} (configurations whose real NNs failed in the loop) "
                   f"leaves the reference NNs' errors {format_errors(point)} outside the region (P(valid) there "
                   f"{region.probability(point):.2f}), though the calibrated region alone certifies them: the "
                   f"error model '{plan.application.error_model}' misses how these NNs err. Calibrate with one "
                   f"closer to them (see {FIDELITY_GUIDE}); delete {plan.run_dir / CLOSED_LOOP_FILE} only to search "
                   "the injected-error region again")
        elif empty:
            why = f"the region is empty: {empty}"
        else:
            why = (f"the reference NNs' errors {format_errors(point)} lie outside the certified region (P(valid) there "
                   f"{region.probability(point):.2f}); raise calibration.budget, narrow the axes around the "
                   "reference's errors so that evaluations land near them, or improve the NNs")
        raise OptimizeError(f"{plan.source}: no approximation can be shown valid: {why}. "
                            f"See the calibration plot {plan.run_dir / REGION_PLOT}.")
    frame = ctx.measure(ctx.reference, "sequential")
    return Configuration(nns={n: m.choice for n, m in frame.nns.items()}, schedule="sequential",
                         latency_ms=frame.latency_ms, memory_bytes=frame.memory_bytes, errors=point, in_region=True,
                         latency=frame.latency)
