"""``qaopt.optimize``: one spec in, a validated, faster NN configuration and its artifacts out.

A short sequence of stages (:mod:`qaopt.stages` states each one's artifact and key):

1. region: the calibrated error region (``region.json``), with the closed-loop
   evidence of earlier runs folded in;
2. reference: the reference NNs, their point in the region and their latency;
3. studies: two Optuna studies over per-NN knobs and the schedule, application-aware
   (inside the region) and application-agnostic (each NN within its reference error);
   during the aware one, closed-loop checks of the front correct the region
   (``search.closed_loop``, :mod:`qaopt.stages.checks`);
4. validation: the aware front's fastest configurations closed-loop with the real NNs;
5. export and report: ``artifacts/``, ``result.json`` and ``report.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from qaopt import kernels
from qaopt.app_spec import AppSpec
from qaopt.approx import Knobs
from qaopt.calibrate import ErrorRegion
from qaopt.executor import open_executor
from qaopt.on_policy import target_nns
from qaopt.profiles import Profile, get_profile
from qaopt.report import format_errors, write_report
from qaopt.result import FIDELITY_GUIDE, Configuration, Fidelity, Result, Speedups, StudySummary
from qaopt.search import MODES, OptimizeError, SearchContext, open_storage, run_study, summarize
from qaopt.spec import check_spec, load_spec
from qaopt.spec_adapter import cache_dir_of
from qaopt.stages import StageClock
from qaopt.stages.checks import ClosedLoopChecks
from qaopt.stages.comparison import side_by_side
from qaopt.stages.export import export_configuration
from qaopt.stages.ladders import build_ladders, ladder_tops
from qaopt.stages.region import (
    CLOSED_LOOP_FILE,
    REGION_FILE,
    REGION_PLOT,
    ClosedLoopEvidence,
    application_key,
    calibrated_region,
    fold,
)
from qaopt.training import training_device
from qaopt.stages.validation import validate_configuration, validate_front

AGNOSTIC_TOLERANCE = 0.02
"""Accuracy-preserving compression may lose this much relative NN error (measurement noise)."""


def optimize(
    spec: AppSpec | str | Path,
    *,
    profile: str | Profile = "default",
    out: str | Path | None = None,
    storage: str | None = None,
    trials: int | None = None,
    region: str | Path | None = None,
    calibration_budget: int | None = None,
    console: Console | None = None,
    cluster: str | None = None,
    workers: int | None = None,
    quiet: bool = False,
) -> Result:
    """Optimize the application ``spec`` describes; returns what ``result.json`` holds.

    ``profile`` caps the budgets ("quick" or "default"); ``out`` overrides the
    spec's ``output.dir``; ``storage`` (an SQLAlchemy URL) shares the studies
    between workers; ``trials`` overrides the number of trials per study.
    ``region`` is a calibrated region file to use as given (it must fit the spec);
    without it, the run folder's ``region.json`` is reused when it fits the spec and was
    calibrated with at least the run's budget (``calibration_budget``, else the
    profile's, else the spec's), and is otherwise calibrated, saying what it replaces.
    ``cluster`` (a Dask scheduler's address, else the spec's ``output.cluster``) or a local
    pool of ``workers`` processes (default: this machine's cores) runs calibration's and
    closed-loop validation's simulator runs (:mod:`qaopt.executor`); the result is the same
    for any number of workers. ``quiet`` shows no progress bars, only log lines.
    """
    if region is not None and calibration_budget is not None:
        raise OptimizeError("--calibration-budget sets the budget of a new calibration; with --region nothing is "
                            "calibrated: give one of them")
    spec = check_spec(spec) if isinstance(spec, AppSpec) else load_spec(spec, check_entry_points=True)
    with open_executor(cluster=cluster, workers=workers, spec=spec) as executor:
        return _optimize(spec, profile=profile, out=out, storage=storage, trials=trials, region=region,
                         calibration_budget=calibration_budget, console=console, executor=executor, quiet=quiet)


def _optimize(
    spec: AppSpec, *, profile: str | Profile, out: str | Path | None, storage: str | None, trials: int | None,
    region: str | Path | None, calibration_budget: int | None, console: Console | None,
    executor: Executor | None, quiet: bool,
) -> Result:
    prof = profile if isinstance(profile, Profile) else get_profile(profile)
    prof = prof.model_copy(update={"trials": trials}) if trials is not None else prof
    if calibration_budget is not None:
        prof = prof.model_copy(update={"calibration_budget": calibration_budget})
    clock = StageClock(console or Console(stderr=True), quiet=quiet)
    run_dir = (Path(out) if out is not None else Path(spec.output.dir)).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    # Fail fast on the storage before any expensive work.
    study_storage = open_storage(storage or spec.search.storage or f"sqlite:///{run_dir / 'study.db'}")

    if executor is not None:
        clock.console.log(f"simulator runs on {getattr(executor, 'where', type(executor).__name__)}")
    with clock.stage("calibration", total=prof.calibration_budget or spec.calibration.budget) as bar:
        def calibrating(step) -> None:  # a qaopt.calibrate.Progress
            point = ", ".join(f"{k}={v:.3g}" for k, v in step.errors.items())
            done = step.evaluation if step.observation is not None else step.evaluation - 1
            state = step.observation.verdict.value if step.observation is not None else f"{step.trials} runs"
            bar.update(completed=done, total=step.budget, description=f"{point}: {state}")

        chosen_region = calibrated_region(spec, prof.calibration_budget, run_dir, region, say=clock.console.log,
                                          executor=executor, progress=calibrating)
        calibrated = chosen_region.region
        if chosen_region.path != run_dir / REGION_FILE or not (run_dir / REGION_PLOT).exists():
            calibrated.plot(run_dir / REGION_PLOT)  # the report shows the run folder's plot
    evidence = ClosedLoopEvidence.load(run_dir)
    ctx = search_context(spec, prof, fold(calibrated, evidence.of(application_key(spec))), say=clock.console.log)
    with clock.stage("reference NNs"):
        reference = _reference(ctx, calibrated, run_dir)

    if ladder_tops(ctx):
        with clock.stage("pruning ladders") as bar:
            build_ladders(ctx, run_dir, bar, say=clock.console.log)

    n_trials = prof.trials or spec.search.trials
    checks = ClosedLoopChecks(ctx, calibrated, evidence, run_dir, n_trials, executor=executor, say=clock.console.log)
    studies: dict[str, StudySummary] = {}
    for mode in MODES:
        with clock.stage(f"{mode} search", total=n_trials) as bar:
            started: set[str] = set()

            def on_trial(message: str, _bar=bar, _started=started) -> None:
                clock.console.log(message)
                number = message.split(": ", 1)[0]
                if number not in _started:
                    _started.add(number)
                    _bar.update(completed=max(0, len(_started) - 1), description=message)
                else:
                    _bar.update(description=message)

            if mode == "aware":
                study = run_study(ctx, mode, study_storage, n_trials, on_trial=on_trial, on_done=checks)
                checks.absorb(study)  # the checks other workers sharing the study ran, or a run before a kill
            else:
                study = run_study(ctx, mode, study_storage, n_trials, on_trial=on_trial)
            studies[mode] = summarize(study, spec.search.objectives)

    with clock.stage("closed-loop validation", total=prof.validation_runs) as bar:
        run = dict(executor=executor, bar=bar, say=clock.console.log)
        front = validate_front(ctx, studies["aware"].feasible_configurations(), calibrated, checks.evidence, reference,
                               **run)
        if front.evidence is not checks.evidence:
            front.evidence.save(run_dir)
        agnostic = next(iter(studies["agnostic"].feasible_configurations()), None)
        # Today's practice deploys the agnostic choice unvalidated; its closed-loop runs say whether that was safe
        # (free when the aware study validated the same NNs).
        agnostic_validation = validate_configuration(ctx, agnostic, **run) if agnostic is not None else None

    with clock.stage("side-by-side measurement"):
        measured = side_by_side(ctx, {"reference": reference, "aware": front.chosen, "agnostic": agnostic})
        reference, aware, agnostic = measured["reference"], measured["aware"], measured["agnostic"]

    with clock.stage("artifacts and report"):
        # The report's region.png: the region searched in, with this run's closed-loop evidence and both configurations.
        fold(calibrated, front.evidence.of(application_key(spec))).plot(
            run_dir / REGION_PLOT, reference=reference.errors, chosen=aware.errors if aware is not None else None)
        result = Result(
            app=spec.app.name,
            spec=str(spec.source),
            spec_hash=spec.content_hash(),
            profile=prof.name,
            run_dir=run_dir,
            reference=reference,
            aware=aware,
            agnostic=agnostic,
            agnostic_tolerance=AGNOSTIC_TOLERANCE,
            speedups=Speedups.of(reference, aware, agnostic),
            validations=front.validations,
            agnostic_validation=agnostic_validation,
            fidelity=Fidelity.of(spec.calibration.error_model, front.validations, studies["aware"].closed_loop_checks),
            studies=studies,
            tuning={"trials_per_candidate": ctx.target.tuning.trials, "seconds_per_candidate": ctx.target.tuning.seconds},
            region=chosen_region.path,
            region_note=chosen_region.note,
            report=run_dir / "report.md",
            artifacts=export_configuration(ctx, aware, run_dir / "artifacts") if aware is not None else {},
            seconds=clock.seconds,
        )
        write_report(result, run_dir)
        result.save(run_dir / "result.json")
    return result


def search_context(spec: AppSpec, prof: Profile, region: ErrorRegion, say: Callable[[str], None] = print) -> SearchContext:
    """What every trial, validation and export of a run on ``spec`` under ``prof`` needs, searching in ``region``.

    ``say`` gets the notice when the spec's training device is missing here.
    """
    return SearchContext(
        spec=spec,
        profile=prof,
        nns=target_nns(spec, cache_dir_of(spec)),
        target=_target(spec, prof),
        cache_dir=cache_dir_of(spec),
        region=region,
        reference_knobs={name: Knobs(seed=spec.search.seed) for name in spec.nns},
        agnostic_tolerance=AGNOSTIC_TOLERANCE,
        train_device=training_device(spec.training, say),
    )


def _target(spec: AppSpec, prof: Profile) -> kernels.Target:
    """The spec's target with the profile's cap on kernel tuning."""
    target = kernels.Target.from_spec(spec.target)
    if prof.tuning_trials is None:
        return target
    tuning = target.tuning
    capped = (kernels.TuningBudget(0, None, tuning.database) if prof.tuning_trials == 0 else
              kernels.TuningBudget(min(tuning.trials or prof.tuning_trials, prof.tuning_trials), tuning.seconds,
                                   tuning.database))
    return replace(target, tuning=capped)


def _reference(ctx: SearchContext, calibrated: ErrorRegion, run_dir: Path) -> Configuration:
    """The reference configuration, measured; an error saying why when even it falls outside the region.

    ``calibrated`` is the region before closed-loop evidence was folded in: when it alone
    certifies the reference, the evidence is what moved the boundary, and the message says so.
    """
    point = ctx.errors_of(ctx.reference)
    for i, axis in enumerate(ctx.region.space.axes):
        if point[axis.name] < axis.min:
            raise OptimizeError(
                f"{ctx.spec.source}: calibration.space.{i} ({axis.name}) starts at min = {axis.min:g}, above the "
                f"reference NN's error {point[axis.name]:.4g}: the reference lies outside the calibrated space. "
                f"Set its min to at most {point[axis.name]:.4g} (or leave it out: 0) and calibrate again.")
    if not ctx.region.contains(point):
        ctx.region.plot(run_dir / REGION_PLOT, reference=point)  # the plot the message points to shows where they fall
        empty = ctx.region.empty_reason()
        if calibrated.contains(point):
            why = (f"the closed-loop evidence in {CLOSED_LOOP_FILE} (configurations whose real NNs failed in the loop) "
                   f"leaves the reference NNs' errors {format_errors(point)} outside the region (P(valid) there "
                   f"{ctx.region.probability(point):.2f}), though the calibrated region alone certifies them: the "
                   f"error model '{ctx.spec.calibration.error_model}' misses how these NNs err. Calibrate with one "
                   f"closer to them (see {FIDELITY_GUIDE}); delete {run_dir / CLOSED_LOOP_FILE} only to search the "
                   "injected-error region again")
        elif empty:
            why = f"the region is empty: {empty}"
        else:
            why = (f"the reference NNs' errors {format_errors(point)} lie outside the certified region (P(valid) there "
                   f"{ctx.region.probability(point):.2f}); raise calibration.budget, narrow the axes around the "
                   "reference's errors so that evaluations land near them, or improve the NNs")
        raise OptimizeError(f"{ctx.spec.source}: no approximation can be shown valid: {why}. "
                            f"See the calibration plot {run_dir / REGION_PLOT}.")
    frame = ctx.measure(ctx.reference, "sequential")
    return Configuration(nns={n: m.choice for n, m in frame.nns.items()}, schedule="sequential",
                         latency_ms=frame.latency_ms, memory_bytes=frame.memory_bytes, errors=point, in_region=True,
                         latency=frame.latency)
