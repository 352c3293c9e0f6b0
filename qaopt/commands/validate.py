"""``qaopt validate SPEC``: check a spec, and the application it names, before any expensive work starts."""

from __future__ import annotations

from pathlib import Path

import typer

from qaopt.spec import load_spec


def validate(
    spec: Path = typer.Argument(..., help="The application spec (YAML)."),
    imports: bool = typer.Option(
        True, "--imports/--no-imports", help="Also import every module:attr entry point the spec names, and construct "
                                             "its simulator with its params (nothing is run). The spec's plugins "
                                             "are always imported: the approximations and backend need them."
    ),
    application: bool = typer.Option(
        True, "--application/--no-application",
        help="Also check the spec's simulator with qaopt.check_application (a few short runs; needs --imports).",
    ),
    shapes: bool = typer.Option(
        True, "--shapes/--no-shapes",
        help="Also load each NN and its data and run one sample through it, checking input_shape and outputs "
             "(needs --imports; a data entry point may generate its data the first time).",
    ),
) -> None:
    """Check an application spec: schema, paths, ranges, plugins, backend, entry points, the simulator, the NNs.

    The simulator (evaluator.simulator.entry_point called with its params) is
    constructed, which checks its params, then checked with a few short runs: its
    methods and their signatures, the types it returns, the QoS metric in every
    record, the same result for the same seeds, and NN names that match the spec's.
    Each NN is loaded with its data and one sample is run through it. The target is
    held against this machine and the registered backends: a CUDA target without a GPU
    here, or an NN's dtype list with nothing the target runs, is refused; a dtype the
    target cannot run is named in a note (the search leaves it out). Exits 0 when
    all is sound; otherwise prints one line per problem (file:line:column: field:
    what is wrong) and exits 2.
    """
    app_spec = load_spec(spec, check_entry_points=imports)
    from qaopt.target_fit import fit_target  # qaopt.kernels: the backends' declarations

    for value in fit_target(app_spec):
        typer.echo(f"note: {value}", err=True)
    axes = ", ".join(a.key for a in app_spec.calibration.space)
    checked = ""
    sim = app_spec.evaluator.simulator
    if imports and sim is not None and sim.entry_point is not None:
        from qaopt.spec_adapter import make_evaluator  # imports the simulator (and runs it): only when asked to

        evaluator = make_evaluator(app_spec, check_runs=application)
        if application:
            from qaopt.application import older_signatures

            checked = f"; simulator {type(evaluator).__name__} keeps the application protocol"
            for note in older_signatures(evaluator):
                typer.echo(f"note: {note}")
        from qaopt.stress import stratum_simulators

        strata = [stratum.name for stratum, _, _ in stratum_simulators(app_spec)]
        if strata:
            checked += f"; stress strata {', '.join(strata)} make recording simulators"
    if imports and shapes:
        from qaopt.spec_adapter import check_nn_shapes  # torch: only when asked to

        check_nn_shapes(app_spec, progress=lambda message: typer.echo(f"{message}; --no-shapes skips this"))
        checked += "; each NN runs a sample of its data"
    typer.echo(
        f"{spec}: ok — app {app_spec.app.name!r}, NNs {', '.join(app_spec.nns)}; "
        f"error space ({axes}); target {app_spec.target.device}/{app_spec.target.backend}{checked}"
    )
