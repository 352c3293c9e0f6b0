"""``qaopt validate SPEC``: check a spec before any expensive work starts."""

from __future__ import annotations

from pathlib import Path

import typer

from qaopt.app_spec import load


def validate(
    spec: Path = typer.Argument(..., help="The application spec (YAML)."),
    imports: bool = typer.Option(
        True, "--imports/--no-imports", help="Also import every module:attr entry point the spec names."
    ),
) -> None:
    """Check an application spec: schema, paths, ranges and entry points.

    Exits 0 when the spec is sound; otherwise prints one line per problem
    (file:line:column: field: what is wrong) and exits 2.
    """
    app_spec = load(spec, check_entry_points=imports)
    axes = ", ".join(a.key for a in app_spec.calibration.space)
    typer.echo(
        f"{spec}: ok — app {app_spec.app.name!r}, NNs {', '.join(app_spec.nns)}; "
        f"error space ({axes}); target {app_spec.target.device}/{app_spec.target.backend}"
    )
