"""The last stage: the chosen configuration's artifacts, ``result.json`` and ``report.md``.

``region.png`` is redrawn with this run's closed-loop evidence and the reference and
chosen points; the :class:`~qaopt.result.Result` is assembled from the earlier stages'
artifacts alone, and the report is a pure function of it (:func:`qaopt.report.write_report`).
"""

from __future__ import annotations

import dataclasses

from qaopt.agnostic import AgnosticSearch
from qaopt.closed_loop import validation_power
from qaopt.pipeline import BaseStage, StageRun, register_stage
from qaopt.report import write_report
from qaopt.result import Fidelity, Result, Speedups
from qaopt.stages.comparison import BY_POINT
from qaopt.stages.export import ARTIFACTS, export_configuration
from qaopt.stages.reference import Reference
from qaopt.stages.region import REGION_PLOT, CalibratedRegion
from qaopt.stages.studies import AwareSearch
from qaopt.stages.validation import Validated

RESULT_FILE = "result.json"
REPORT_FILE = "report.md"
STAGE_TIMES_FILE = "stage_seconds.json"
"""Each stage's wall time when it computed its artifact, kept for the cost table of a resumed run."""


@register_stage
class ReportStage(BaseStage):
    """Export the chosen NNs, then write ``result.json`` and ``report.md``."""

    name = "artifacts and report"
    inputs = ("calibration", "reference NNs", "aware search", "agnostic search", "closed-loop validation",
              "side-by-side measurement")
    artifact = f"{ARTIFACTS}/<nn>/, {RESULT_FILE}, {REPORT_FILE}, pareto.png, {REGION_PLOT} (run folder)"

    def run(self, run: StageRun, inputs) -> Result:
        plan = run.plan
        calibrated: CalibratedRegion = inputs["calibration"]
        reference: Reference = inputs["reference NNs"]
        validated: Validated = inputs["closed-loop validation"]
        aware_study: AwareSearch = inputs["aware search"]
        measured = inputs["side-by-side measurement"]
        ref, aware, agnostic = measured["reference"], measured["aware"], measured["agnostic"]
        by_point = measured[BY_POINT]
        # The report's region.png: the region searched in, with this run's closed-loop evidence and both configurations.
        calibrated.searched(validated.front.evidence).plot(
            plan.run_dir / REGION_PLOT, reference=ref.errors, chosen=aware.errors if aware is not None else None)
        agnostic_search: AgnosticSearch = inputs["agnostic search"]
        studies = {"aware": aware_study.summary, **agnostic_search.studies}
        target = plan.target
        result = Result(
            app=plan.app,
            spec=str(plan.source),
            spec_hash=plan.spec_hash,
            profile=plan.profile.name,
            run_dir=plan.run_dir,
            reference=ref,
            aware=aware,
            agnostic=agnostic,
            agnostic_by_point=by_point,
            agnostic_rule=reference.ctx.agnostic_rule(agnostic, agnostic_search.unresolved,
                                                      agnostic_search.second_looks),
            agnostic_converged=agnostic_search.converged,
            speedups=Speedups.of(ref, aware, agnostic, by_point),
            validations=validated.front.validations,
            agnostic_validation=validated.agnostic_validation,
            acceptance=validated.acceptance,
            fidelity=Fidelity.of(plan.application.error_model, validated.front.validations,
                                 studies["aware"].closed_loop_checks),
            validation_power=validation_power(plan.application.acceptance, plan.validation_runs),
            rebuilt=reference.ctx.rebuilds,
            finetune=dataclasses.asdict(plan.finetune),
            studies=studies,
            tuning={"trials_per_candidate": target.tuning.trials, "seconds_per_candidate": target.tuning.seconds},
            search_backend=plan.search_backend,
            left_out=[str(value) for value in plan.left_out],
            region=calibrated.choice.path,
            region_note=calibrated.choice.note,
            stress_strata={n: reference.ctx.stratum_errors(c) for n, c in reference.ctx.reference.items()}
            if reference.ctx.stress is not None else {},
            report=plan.run_dir / REPORT_FILE,
            artifacts=(export_configuration(reference.ctx, aware, plan.run_dir / ARTIFACTS)
                       if aware is not None else {}),
            seconds=dict(run.times.seconds),
            read_back=list(run.times.read_back),
        )
        write_report(result, plan.run_dir)
        result.save(plan.run_dir / RESULT_FILE)
        return result

