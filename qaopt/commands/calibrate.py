"""``qaopt calibrate SPEC``: chart which NN-error vectors keep the application's QoS."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import typer
from rich.console import Console

from qaopt.spec import load_spec


def calibrate(
    spec: Path = typer.Argument(..., help="The application spec (YAML)."),
    strategy: str | None = typer.Option(None, "--strategy", "-s",
                                        help="A registered region strategy: boundary, bisect, monotone, active, or "
                                             "one a plugin of the spec adds (default: the spec's)."),
    budget: int | None = typer.Option(None, "--budget", "-b",
                                      help="QoS evaluations to spend; a point's trials count as one (default: the spec's)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Folder for region.json and region.png (default: the spec's output.dir)."),
    plot: bool = typer.Option(False, "--plot",
                              help="Only redraw region.png from the folder's region.json; runs no simulator."),
    axes: str | None = typer.Option(None, "--axes", help="Axes to plot, comma-separated, named as in region.json "
                                    "(e.g. heading,distance or heading.sigma); default: all, pairwise."),
    at: list[str] | None = typer.Option(None, "--at", help="NAME=VALUE: hold an axis that is not plotted at VALUE "
                                        "(default: its min); repeatable."),
    cluster: str | None = typer.Option(
        None, "--cluster", help="Dask scheduler address (tcp://host:8786) whose workers run the simulator runs "
        "(default: the spec's output.cluster, else a local process pool)."),
    workers: int | None = typer.Option(
        None, "--workers", min=1, help="Processes of the local pool (default: this machine's cores; 1 runs "
        "everything in this process), or the most seed blocks in flight on --cluster."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar, only one line per point."),
    time_limit: float | None = typer.Option(
        None, "--time-limit", min=0.001, help="Wall-clock seconds one simulator call (a block of seeded runs) may "
        "take before it counts as hung and the run stops naming its seeds, as given (default: ten times the median "
        "of the run's own calls, at least 60 s, under the spec's output.time_limit_s, 1800)."),
) -> None:
    """Inject errors into the NNs of the simulated application and map the valid error region.

    Every point is judged by a sequential statistical test over seeded runs; runs
    are cached, so an interrupted calibration resumes when run again. The whole spec
    is validated first, every entry point imported and the simulator constructed,
    so a typo is reported (file:line:column: field: ...) before any run. With
    --plot, only region.png is redrawn (e.g. with other --axes or --at levels).
    A point's seed blocks run in parallel (--workers, --cluster); the region is the
    same for any number of workers.
    """
    from qaopt.calibrate import Verdict  # scipy/sklearn: only when a calibration runs
    from qaopt.calibrate.calibration import point_text
    from qaopt.executor import open_executor
    from qaopt.field.evidence import spec_evidence
    from qaopt.region_calibration import build_calibration, calibrate_spec, plot_spec_region
    from qaopt.console import stage_progress
    from qaopt.app_spec.store import ensure_writable
    from qaopt.calibrate.app_calls import forget_call_times
    from qaopt.run_log import library_output_logged
    from qaopt.spec_adapter import with_time_limit, written_folders

    plot_axes, plot_at = _axis_names(axes), _levels(at or [])
    if plot:
        if strategy is not None or budget is not None:
            raise typer.BadParameter("--plot redraws the existing region and runs nothing; drop --strategy and "
                                     "--budget, or drop --plot to calibrate", param_hint="'--plot'")
        path = plot_spec_region(load_spec(spec), out, plot_axes, plot_at)  # no entry point: nothing runs
        Console().print(f"wrote {path}")
        return
    app_spec = with_time_limit(load_spec(spec, check_entry_points=True), time_limit)
    forget_call_times()  # a hang is judged by this run's own calls, not by an earlier run's in this process
    run_dir, cache = written_folders(app_spec, out=out, study=False)
    for folder in (run_dir, cache):
        ensure_writable(folder)  # a read-only or full folder is named now, before any run
    with library_output_logged(run_dir):
        console = Console()
        cal = build_calibration(app_spec)
        field = spec_evidence(app_spec)  # runs logged in evaluator.field.store, if the spec names one
        total = app_spec.calibration.budget if budget is None else budget
        with open_executor(cluster=cluster, workers=workers, spec=app_spec) as executor, \
                stage_progress("calibrating", console, disable=quiet) as bar:
            cal.use(executor)
            if executor is not None:
                console.print(f"simulator runs on {getattr(executor, 'where', type(executor).__name__)}")
            task = bar.add_task("", total=max(total, 1))

            def show(step) -> None:  # a qaopt.calibrate.Progress
                point = point_text(step.errors)
                if step.observation is None:
                    bar.update(task, description=f"{point}: {step.trials} runs")
                    return
                ob = step.observation
                bar.update(task, completed=step.evaluation, description=f"{point}: {ob.verdict.value}")
                mark = {Verdict.VALID: "[green]valid", Verdict.INVALID: "[red]invalid",
                        Verdict.UNDECIDED: "[yellow]undecided"}[ob.verdict]
                if cal.certifier == "pooled" and step.evaluation > 1:
                    # the pooled model judges the region from all runs: a point's own verdict would mislead
                    console.print(f"{step.evaluation:>3}. {point}: {ob.failures} of {ob.trials} runs failed")
                    return
                console.print(f"{step.evaluation:>3}. {point}: {mark}[/] after {ob.trials} runs, "
                              f"{ob.failures} failed")

            region, folder = calibrate_spec(app_spec, strategy, budget, out, evidence=field.evidence, progress=show,
                                            calibration=cal, plot_axes=plot_axes, plot_at=plot_at)
    labelled = region.labelled()
    if field.evidence:
        console.print(f"field evidence: {len(field.evidence)} point(s) from {sum(map(len, field.runs.values()))} run(s)")
    for p in labelled:
        if p.overturned:
            point = point_text(p.errors)
            console.print(f"[blue]field overturned the simulator[/] at {point}: now {'valid' if p.valid else 'invalid'}")
    empty = region.empty_reason()
    if empty:
        console.print(f"[red]no region:[/] {empty}")
    else:
        console.print(f"certified ({region.certifier}): {region.certified_share():.0%} of the error space")
    console.print(f"{region.evaluations} evaluations, {region.trials} runs.\n"
                  f"wrote {folder / 'region.json'} and {folder / 'region.png'}")


def _axis_names(text: str | None) -> list[str] | None:
    """``--axes heading,distance`` as a list of names; ``None`` (all axes) when not given."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise typer.BadParameter(f"'{text}' has an empty axis name; give comma-separated names as in region.json, "
                                 "e.g. --axes heading,distance", param_hint="'--axes'")
    return names


def _levels(items: Sequence[str]) -> dict[str, float]:
    """``--at heading=2.5 --at speed=0.1`` as ``{"heading": 2.5, "speed": 0.1}``."""
    levels: dict[str, float] = {}
    for item in items:
        name, sep, text = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise typer.BadParameter(f"'{item}' is not NAME=VALUE; hold an axis at a level with e.g. --at heading=2.5",
                                     param_hint="'--at'")
        try:
            level = float(text)
        except ValueError:
            level = math.nan
        if not math.isfinite(level):
            raise typer.BadParameter(f"'{item}': '{text}' is not a finite number; e.g. --at {name}=2.5",
                                     param_hint="'--at'")
        if name in levels:
            raise typer.BadParameter(f"axis '{name}' is given twice; give each axis one level", param_hint="'--at'")
        levels[name] = level
    return levels
