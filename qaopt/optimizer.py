"""``qaopt.optimize``: one spec in, a validated, faster NN configuration and its artifacts out.

The run is a plan and a pipeline of registered stages (:mod:`qaopt.pipeline`): the spec
and the profile become one frozen :class:`~qaopt.plan.RunPlan`, and the runner loads or
runs each stage in the order their inputs give:

1. calibration: the calibrated error region (``region.json``), with the closed-loop
   evidence of earlier runs folded in;
2. reference NNs: the reference NNs, their point in the region and their latency;
3. pruning ladders (when an NN has one);
4. aware and agnostic search: two Optuna studies over per-NN knobs and the schedule,
   application-aware (inside the region, corrected by closed-loop checks as it runs) and
   application-agnostic (each NN within its reference error);
5. closed-loop validation: the aware front's fastest configurations with the real NNs;
6. side-by-side measurement, then artifacts and report: ``artifacts/``, ``result.json``
   and ``report.md``.

What the stages say is a typed event stream (:mod:`qaopt.events`); the console view
(:mod:`qaopt.console`) and the report's stage times subscribe to it.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

import qaopt.stages  # noqa: F401 - registers the built-in stages
from qaopt.app_spec import AppSpec
from qaopt.app_spec.store import ensure_writable
from qaopt.calibrate.app_calls import forget_call_times
from qaopt.console import ConsoleView
from qaopt.events import Events, StageTimes
from qaopt.executor import open_executor
from qaopt.pipeline import StageRun, run_stages
from qaopt.plan import build_plan
from qaopt.profiles import Profile
from qaopt.result import Result
from qaopt.run_log import library_output_logged
from qaopt.search import OptimizeError, open_storage
from qaopt.spec import check_spec, load_spec
from qaopt.spec_adapter import check_nn_shapes, with_time_limit, written_folders
from qaopt.stages.report import STAGE_TIMES_FILE, ReportStage


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
    time_limit: float | None = None,
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
    for any number of workers. ``quiet`` shows no progress bars, only log lines. ``time_limit``
    overrides the spec's ``output.time_limit_s``: the seconds one simulator call may take.
    """
    if region is not None and calibration_budget is not None:
        raise OptimizeError("--calibration-budget sets the budget of a new calibration; with --region nothing is "
                            "calibrated: give one of them")
    spec = check_spec(spec) if isinstance(spec, AppSpec) else load_spec(spec, check_entry_points=True)
    spec = with_time_limit(spec, time_limit)
    console = console or Console(stderr=True, log_path=False)  # where a line was logged means nothing to a user
    forget_call_times()  # a hang is judged by this run's own calls, not by an earlier run's in this process
    run_dir, *others = written_folders(spec, out=out, storage=storage)
    for folder in (run_dir, *others):
        ensure_writable(folder)  # a read-only or full folder is named now, before any work
    with library_output_logged(run_dir):
        # Every NN built from its entry points now, not after calibration has run for minutes.
        check_nn_shapes(spec, progress=console.log)
        plan = build_plan(spec, profile, out=out, storage=storage, trials=trials, region=region,
                          calibration_budget=calibration_budget, say=console.log)
        plan.run_dir.mkdir(parents=True, exist_ok=True)
        storage_ = open_storage(plan.storage_url)  # fail fast on the storage before any expensive work
        events, times = Events(), StageTimes.kept_in(plan.run_dir / STAGE_TIMES_FILE)
        events.subscribe(ConsoleView(console, quiet=quiet))
        events.subscribe(times)
        with open_executor(cluster=cluster, workers=workers, spec=spec) as executor:
            artifacts = run_stages(StageRun(plan, events, times, executor, storage_))
    return artifacts[ReportStage.name]

