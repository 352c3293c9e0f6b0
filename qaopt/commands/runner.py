"""Running a command-line app the qaopt way; light, so the robot's ``qaopt-field`` uses it too.

Bad input raises :class:`~qaopt.app_spec.QaoptError`: its message is printed (one
line per problem) and the exit status is 2, with a traceback only in debug mode; so is a
disk that is full, read-only or not writable (:func:`qaopt.app_spec.store.storage_problem`).
Ctrl-C ends every command with one line and status 130: finished work is cached,
and running the command again resumes.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Sequence

import typer

from qaopt.app_spec.errors import QaoptError

INTERRUPTED = "interrupted; finished work is cached and a re-run resumes from it"


class Interrupted(BaseException):
    """Ctrl-C, raised by :func:`run`'s SIGINT handler in place of ``KeyboardInterrupt``.

    typer turns a ``KeyboardInterrupt`` into a silent exit 130 before :func:`run` sees
    it; this one passes through typer to :func:`run`, and through Optuna without its
    traceback (a study records the interrupted trial itself, see :func:`qaopt.search.run_study`).
    """


def _interrupt(signum, frame) -> None:
    raise Interrupted


def run(app: typer.Typer, argv: Sequence[str] | None, prog_name: str, debug: Callable[[], bool]) -> None:
    """Run ``app``; ``debug()`` (asked when an error arrives) decides whether tracebacks are shown."""
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set signal handlers
    previous = signal.signal(signal.SIGINT, _interrupt) if main_thread else None
    try:
        app(args=argv, prog_name=prog_name)
    except Exception as exc:
        if not isinstance(exc, QaoptError):
            # a full, read-only or locked disk where no store write caught it (a plot, the study database)
            from qaopt.app_spec.store import storage_problem

            problem = storage_problem(exc, getattr(exc, "filename", None) or ".")
            if problem is None:
                raise
            exc = problem
        if debug():
            raise
        for line in str(exc).splitlines() or [type(exc).__name__]:
            typer.echo(f"error: {line}", err=True)
        sys.exit(2)
    except (Interrupted, KeyboardInterrupt):
        if main_thread:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break the one line
        if debug():
            raise
        typer.echo(INTERRUPTED, err=True)
        sys.exit(130)
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
