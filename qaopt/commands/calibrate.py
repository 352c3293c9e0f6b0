"""``qaopt calibrate SPEC``: chart which NN-error vectors keep the application's QoS."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from qaopt.spec import load_spec


def calibrate(
    spec: Path = typer.Argument(..., help="The application spec (YAML)."),
    strategy: str | None = typer.Option(None, "--strategy", "-s",
                                        help="bisect | monotone | active (default: the spec's)."),
    budget: int | None = typer.Option(None, "--budget", "-b",
                                      help="QoS evaluations to spend; a point's trials count as one (default: the spec's)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Folder for region.json and region.png (default: the spec's output.dir)."),
) -> None:
    """Inject errors into the NNs of the simulated application and map the valid error region.

    Every point is judged by a sequential statistical test over seeded runs; runs
    are cached, so an interrupted calibration resumes when run again. The whole spec
    is validated first, every entry point imported and the simulator constructed,
    so a typo is reported (file:line:column: field: ...) before any run.
    """
    from qaopt.calibrate import Verdict  # scipy/sklearn: only when a calibration runs
    from qaopt.field.evidence import spec_evidence
    from qaopt.region_calibration import build_calibration, calibrate_spec

    app_spec = load_spec(spec, check_entry_points=True)
    console = Console()
    cal = build_calibration(app_spec)
    field = spec_evidence(app_spec)  # runs logged in evaluator.field.store, if the spec names one
    total = app_spec.calibration.budget if budget is None else budget
    with Progress(
        TextColumn("[bold]calibrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=console, transient=True,
    ) as bar:
        task = bar.add_task("", total=max(total, 1))

        def show(step) -> None:  # a qaopt.calibrate.Progress
            point = ", ".join(f"{k}={v:.3g}" for k, v in step.errors.items())
            if step.observation is None:
                bar.update(task, description=f"{point}: {step.trials} runs")
                return
            ob = step.observation
            bar.update(task, completed=step.evaluation, description=f"{point}: {ob.verdict.value}")
            mark = {Verdict.VALID: "[green]valid", Verdict.INVALID: "[red]invalid",
                    Verdict.UNDECIDED: "[yellow]undecided", Verdict.FAILED: "[magenta]failed"}[ob.verdict]
            detail = f" ({ob.message})" if ob.message else ""
            console.print(f"{step.evaluation:>3}. {point}: {mark}[/] after {ob.trials} runs, "
                          f"{ob.failures} failed{detail}")

        region, folder = calibrate_spec(app_spec, strategy, budget, out, evidence=field.evidence, progress=show,
                                        calibration=cal)
    labelled = region.labelled()
    certified = sum(p.valid for p in labelled)
    if field.evidence:
        console.print(f"field evidence: {len(field.evidence)} point(s) from {sum(map(len, field.runs.values()))} run(s)")
    for p in labelled:
        if p.overturned:
            point = ", ".join(f"{k}={v:.3g}" for k, v in p.errors.items())
            console.print(f"[blue]field overturned the simulator[/] at {point}: now {'valid' if p.valid else 'invalid'}")
    console.print(
        f"{region.evaluations} evaluations, {region.trials} runs; {certified} valid points certify the region.\n"
        f"wrote {folder / 'region.json'} and {folder / 'region.png'}"
    )
