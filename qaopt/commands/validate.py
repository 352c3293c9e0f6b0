"""``qaopt validate SPEC``: check a spec, and the application it names, before any expensive work starts."""

from __future__ import annotations

from pathlib import Path

import typer

from qaopt.spec import load_spec


def validate(
    spec: Path = typer.Argument(..., help="The application spec (YAML)."),
    imports: bool = typer.Option(
        True, "--imports/--no-imports", help="Also import every module:attr entry point the spec names."
    ),
    application: bool = typer.Option(
        True, "--application/--no-application",
        help="Also construct the spec's simulator and check it with qaopt.check_application (a few short runs; "
             "needs --imports).",
    ),
) -> None:
    """Check an application spec: schema, paths, ranges, entry points, and the simulator's protocol.

    The simulator (evaluator.simulator.entry_point called with its params) is checked
    with a few short runs: its methods and their signatures, the types it returns,
    the QoS metric in every record, the same result for the same seeds, and NN names
    that match the spec's. Exits 0 when all is sound; otherwise prints one line per
    problem (file:line:column: field: what is wrong, or the method at fault) and exits 2.
    """
    app_spec = load_spec(spec, check_entry_points=imports)
    axes = ", ".join(a.key for a in app_spec.calibration.space)
    checked = ""
    sim = app_spec.evaluator.simulator
    if imports and application and sim is not None and sim.entry_point is not None:
        from qaopt.spec_adapter import make_evaluator  # imports and runs the simulator: only when asked to

        evaluator = make_evaluator(app_spec, check_runs=True)
        checked = f"; simulator {type(evaluator).__name__} keeps the application protocol"
    typer.echo(
        f"{spec}: ok — app {app_spec.app.name!r}, NNs {', '.join(app_spec.nns)}; "
        f"error space ({axes}); target {app_spec.target.device}/{app_spec.target.backend}{checked}"
    )
