"""The ``qaopt`` command line: a thin layer over the Python API.

Each command group lives in :mod:`qaopt.commands` and is registered below. Bad
input raises :class:`~qaopt.app_spec.QaoptError`; :func:`main` prints its message
(one line per problem) and exits with status 2, with a traceback only under
``--debug`` (or ``QAOPT_DEBUG=1``). Ctrl-C ends every command with one line and
status 130: finished work is cached, and running the command again resumes.
"""

from __future__ import annotations

import os
import warnings

import typer

from qaopt import __version__
from qaopt.commands import approx, calibrate, field, kernels, optimize, train, validate
from qaopt.commands.runner import run

app = typer.Typer(
    name="qaopt",
    help="Quality-aware optimization of multi-NN edge applications.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_state = {"debug": bool(os.environ.get("QAOPT_DEBUG"))}

def _version(value: bool) -> None:
    if value:
        typer.echo(f"qaopt {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    if debug:
        _state["debug"] = True


# Command registration: one line per command or group (qaopt/commands/<group>.py).
app.command("validate")(validate.validate)
app.add_typer(field.app, name="field")
app.add_typer(approx.app, name="approx")
app.add_typer(kernels.app, name="kernels")
app.command("calibrate")(calibrate.calibrate)
app.command("optimize", epilog=optimize.PROFILE_CAPS)(optimize.optimize)
app.command("train")(train.train)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``qaopt`` script."""
    _state["debug"] = bool(os.environ.get("QAOPT_DEBUG"))  # --debug, if given, sets it again
    # torch's own deepcopy of pruned modules warns about its internals; nothing a user can act on.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
    run(app, argv, "qaopt", debug=lambda: _state["debug"])
