"""The search stages: the application-agnostic baseline, then the application-aware study.

Both search the same per-NN knob spaces and share every cached candidate and
measurement (:mod:`qaopt.search`). The agnostic baseline is judged by each NN's tolerance
(:mod:`qaopt.tolerance`), one study per NN or merge group (:mod:`qaopt.agnostic`); the aware
study by the region that the closed-loop checks own (:class:`~qaopt.stages.checks.ClosedLoopChecks`,
which correct it as the study runs). The baseline comes first because its choice is one of the aware
study's trials: what per-NN tolerances find is inside the aware study's space, so the aware side
never ends slower than the baseline for want of proposing it. The studies live in the Optuna
storage (``study.db`` or ``--storage``), under names that hold the spec's hash, so a
resumed run continues them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from qaopt.agnostic import AgnosticSearch, search_agnostic, units_of
from qaopt.pipeline import BaseStage, StageRun, register_stage
from qaopt.result import StudySummary
from qaopt.search import FixedRegion, run_study, summarize
from qaopt.stages.checks import ClosedLoopChecks
from qaopt.stages.reference import Reference
from qaopt.stages.region import CalibratedRegion


@dataclass(frozen=True)
class AwareSearch:
    """The aware study's summary, and the checks that ran during it (their evidence and the region's last version)."""

    summary: StudySummary
    checks: ClosedLoopChecks


@register_stage
class AwareStudyStage(BaseStage):
    """The application-aware study: feasible inside the region, corrected by closed-loop checks as it runs."""

    name = "aware search"
    inputs = ("calibration", "reference NNs", "pruning ladders", "agnostic search")
    artifact = "the Optuna storage; closed_loop.json when a check fails"

    def total(self, run: StageRun, inputs) -> float | None:
        return run.plan.trials

    def run(self, run: StageRun, inputs) -> AwareSearch:
        reference: Reference = inputs["reference NNs"]
        calibrated: CalibratedRegion = inputs["calibration"]
        events = run.emitter(self.name)
        ctx = replace(reference.ctx, say=events.note)
        checks = ClosedLoopChecks(ctx, calibrated, events, executor=run.executor)
        agnostic: AgnosticSearch = inputs["agnostic search"]
        study = run_study(ctx, run.storage, checks, events, on_done=checks,
                          known=[agnostic.chosen] if agnostic.chosen is not None else [])
        checks.absorb(study)  # the checks other workers sharing the study ran, or a run before a kill
        return AwareSearch(summarize(study, run.plan.objectives), checks)


@register_stage
class AgnosticStudyStage(BaseStage):
    """The application-agnostic baseline: each NN (or merge group) searched alone within its tolerance, then combined
    (:mod:`qaopt.agnostic`)."""

    name = "agnostic search"
    inputs = ("calibration", "reference NNs", "pruning ladders")
    artifact = "the Optuna storage (a study per unit)"

    def total(self, run: StageRun, inputs) -> float | None:
        return len(units_of(inputs["reference NNs"].ctx)) * run.plan.trials

    def run(self, run: StageRun, inputs) -> AgnosticSearch:
        reference: Reference = inputs["reference NNs"]
        calibrated: CalibratedRegion = inputs["calibration"]
        # The region with the run folder's closed-loop evidence; the validation stage judges the choice again by
        # the region the aware study's checks leave.
        region = FixedRegion(calibrated.searched())
        events = run.emitter(self.name)
        return search_agnostic(replace(reference.ctx, say=events.note), run.storage, region, events)
