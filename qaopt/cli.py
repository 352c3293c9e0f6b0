"""The ``qaopt`` command line: a thin layer over the Python API.

Each command group lives in :mod:`qaopt.commands` and is registered below. Bad
input raises :class:`~qaopt.app_spec.QaoptError`; :func:`main` prints its message
(one line per problem) and exits with status 2, with a traceback only under
``--debug`` (or ``QAOPT_DEBUG=1``). Ctrl-C ends every command with one line and
status 130: finished work is cached, and running the command again resumes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings

import typer

from qaopt import __version__
from qaopt.app_spec.errors import QaoptError
from qaopt.commands import approx, calibrate, field, kernels, optimize, train, validate

app = typer.Typer(
    name="qaopt",
    help="Quality-aware optimization of multi-NN edge applications.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_state = {"debug": bool(os.environ.get("QAOPT_DEBUG"))}

INTERRUPTED = "interrupted; finished work is cached and a re-run resumes from it"


class Interrupted(BaseException):
    """Ctrl-C, raised by :func:`main`'s SIGINT handler in place of ``KeyboardInterrupt``.

    typer turns a ``KeyboardInterrupt`` into a silent exit 130 before :func:`main` sees
    it; this one passes through typer to :func:`main`, and through Optuna without its
    traceback (a study records the interrupted trial itself, see :func:`qaopt.search.run_study`).
    """


def _interrupt(signum, frame) -> None:
    raise Interrupted


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
app.command("optimize")(optimize.optimize)
app.command("train")(train.train)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``qaopt`` script."""
    _state["debug"] = bool(os.environ.get("QAOPT_DEBUG"))  # --debug, if given, sets it again
    # torch's own deepcopy of pruned modules warns about its internals; nothing a user can act on.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set signal handlers
    previous = signal.signal(signal.SIGINT, _interrupt) if main_thread else None
    try:
        app(args=argv, prog_name="qaopt")
    except QaoptError as exc:
        if _state["debug"]:
            raise
        for line in str(exc).splitlines() or [type(exc).__name__]:
            typer.echo(f"error: {line}", err=True)
        sys.exit(2)
    except (Interrupted, KeyboardInterrupt):
        if main_thread:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break the one line
        if _state["debug"]:
            raise
        typer.echo(INTERRUPTED, err=True)
        sys.exit(130)
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
