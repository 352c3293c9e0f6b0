"""``qaopt optimize SPEC``: calibrate, search, validate and report, resuming where a run stopped."""

from __future__ import annotations

from pathlib import Path

import typer

from qaopt.profiles import PROFILES

PROFILE_CAPS = "Profiles cap the spec's budgets; a cap left out keeps the spec's value. " + " ".join(
    f"{name}: {p.caps()}." for name, p in PROFILES.items())
"""What ``qaopt optimize --help`` says each profile caps (qaopt/profiles.py, read from the profiles themselves)."""


def optimize(
    spec: Path = typer.Argument(..., help="The application spec (YAML)."),
    profile: str = typer.Option("default", "--profile", help=f"Budget profile: {', '.join(PROFILES)} (their caps: "
                                "below)."),
    out: Path | None = typer.Option(None, "--out", help="Run folder (default: the spec's output.dir)."),
    storage: str | None = typer.Option(
        None, "--storage", help="SQLAlchemy URL of the Optuna study storage, shared by workers (default: the spec's, "
        "else a SQLite file in the run folder)."
    ),
    trials: int | None = typer.Option(None, "--trials", min=1, help="Trials per study (overrides spec and profile)."),
    region: Path | None = typer.Option(
        None, "--region", help="A calibrated region.json to use as given (it must fit the spec; nothing is "
        "calibrated). Default: the run folder's region.json when it fits and its budget is at least this run's."
    ),
    calibration_budget: int | None = typer.Option(
        None, "--calibration-budget", min=1, help="QoS evaluations of a new calibration (overrides spec and profile); "
        "a compatible region calibrated with at least this many is reused."
    ),
    cluster: str | None = typer.Option(
        None, "--cluster", help="Dask scheduler address (tcp://host:8786) whose workers run the simulator runs of "
        "calibration and closed-loop validation (default: the spec's output.cluster, else a local process pool)."),
    workers: int | None = typer.Option(
        None, "--workers", min=1, help="Processes of the local pool (default: this machine's cores; 1 runs "
        "everything in this process), or the most runs in flight on --cluster."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars, only log lines (unattended runs; "
                               "redirect stderr to keep them in a file)."),
    time_limit: float | None = typer.Option(
        None, "--time-limit", min=0.001, help="Wall-clock seconds one simulator call (a block of seeded runs) may "
        "take before it counts as hung and the run stops naming its seeds, as given (default: ten times the median "
        "of the run's own calls, at least 60 s, under the spec's output.time_limit_s, 1800)."),
) -> None:
    """Find the fastest NN configuration that keeps the application's QoS, and validate it closed-loop.

    Writes result.json, report.md (with region and Pareto plots) and artifacts/ to the run
    folder. Running it again resumes: finished calibrations, candidates, tunings and trials
    are reused, and a trial interrupted by Ctrl-C is run again. A region.json that `qaopt
    calibrate` wrote for this spec is reused (and never replaced by a smaller calibration).
    """
    from qaopt.optimizer import optimize as run
    from qaopt.report import unchanged_note, verdict

    result = run(spec, profile=profile, out=out, storage=storage, trials=trials, region=region,
                 calibration_budget=calibration_budget, cluster=cluster, workers=workers, quiet=quiet,
                 time_limit=time_limit)
    s = result.speedups
    typer.echo(f"report: {result.report}")
    if result.aware is not None:
        typer.echo(f"application-aware speedup {s.describe('aware')}"
                   + (f", application-agnostic {s.describe('agnostic')}, aware over agnostic "
                      f"{s.describe('aware_over_agnostic')}" if s.aware_over_agnostic else ""))
        note = unchanged_note(result)
        if note:
            typer.echo(note)
    # The verdict leads: the last line says whether the configuration may be deployed before what it would gain.
    typer.echo(verdict(result))
