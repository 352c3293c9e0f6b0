"""Calling the application: its optional parameters, a wall-clock limit, retries, and a failure that names itself.

Every run qaopt asks of an application (calibration's ``evaluate``, closed-loop validation's
``evaluate_perception``), in this process or on a pool or cluster worker, goes through
:func:`call_application`, so one policy holds for all of them:

- **An exception is the application's, not a measurement.** A call that raises (or returns
  something that is not one record per seed) says nothing about the QoS of the NNs' errors:
  it comes back as an :class:`AppFailure` (the method, the seeds, the exception and its
  traceback), the caller stores nothing of that block and stops the run with
  :class:`ApplicationFault`, one line naming the method, the seeds and the point or NNs.
- **A wall-clock limit.** A call that runs past ``RunLimits.time_limit_s`` is interrupted
  (``SIGALRM`` in the thread that runs it, the main thread of a pool worker or of the
  command) and fails the same way, with its elapsed time. Where no alarm can be set (a
  Dask worker's thread), the call runs unlimited.
- **Retries.** ``RunLimits.retries`` calls again after a failure before giving up; an
  application whose failures are transient (a simulator's license server, a flaky
  socket) then still gives its deterministic result.
- **Optional parameters.** A parameter added to the protocol after an application was
  written is passed only when the method declares it (:func:`qaopt.calibrate.protocols.declared_options`).
"""

from __future__ import annotations

import math
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qaopt.app_spec.errors import QaoptError
from qaopt.app_spec.schema import DEFAULT_TIME_LIMIT_S
from qaopt.calibrate.protocols import declared_options


@dataclass(frozen=True)
class RunLimits:
    """How long one application call may take and how often a failed call is tried again (the spec's ``output``)."""

    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    retries: int = 0


@dataclass(frozen=True)
class AppFailure:
    """One application call that raised, ran past its limit or returned garbage: picklable, sent back from a worker."""

    app: str
    method: str
    seeds: tuple[int, ...]
    error: str  # "RuntimeError: boom", "ran past its time limit of 5 s", "returned 7 results for 8 seeds"
    elapsed_s: float
    traceback: str = ""
    attempts: int = 1

    def seeds_text(self) -> str:
        s = self.seeds
        if len(s) > 2 and list(s) == list(range(s[0], s[0] + len(s))):
            return f"seeds {s[0]}..{s[-1]}"
        return f"seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))}"


class ApplicationTraceback(Exception):
    """The application's own traceback (from the worker that ran it), chained under :class:`ApplicationFault`."""

    def __init__(self, text: str):
        super().__init__(text)

    def __str__(self) -> str:
        return "\n" + self.args[0]


class ApplicationFault(QaoptError):
    """The application failed (raised, hung, returned garbage): the run stops and nothing of the block is stored.

    ``--debug`` shows the application's own traceback, chained as :class:`ApplicationTraceback`.
    """

    def __init__(self, failure: AppFailure, where: str):
        self.failure = failure
        tries = f" (after {failure.attempts} attempts)" if failure.attempts > 1 else ""
        super().__init__(
            f"application error: {failure.app}.{failure.method} {failure.error} on {failure.seeds_text()} "
            f"({where}){tries} after {failure.elapsed_s:.1f} s; nothing of these runs was stored: fix the "
            f"application and run again (--debug shows its traceback)")

    @classmethod
    def raised(cls, failure: AppFailure, where: str) -> ApplicationFault:
        """The fault with the application's traceback chained (``raise ApplicationFault.raised(...)``)."""
        fault = cls(failure, where)
        if failure.traceback:
            fault.__cause__ = ApplicationTraceback(failure.traceback)
        return fault


class _TimeUp(BaseException):
    """Raised by the alarm inside a call past its limit; a ``BaseException`` so an application's ``except Exception``
    cannot swallow it."""


@dataclass(frozen=True)
class Outcome:
    """An application call's result, or the failure it ended in."""

    result: Any = None
    failure: AppFailure | None = None


def call_application(app: object, method: str, arg: Any, seeds: Sequence[int], limits: RunLimits,
                     check: Callable[[Any], str | None] | None = None, extra: tuple = (), **options: Any) -> Outcome:
    """``app.method(arg, seeds, *extra, **options)`` within ``limits``; ``check(result)`` says what is wrong with it.

    ``extra`` are further required arguments (``record_perception``'s ``steps``); only the
    ``options`` the method declares are passed. Returns the result, or the failure of the
    last attempt (exception, time limit, or the problem ``check`` found).
    """
    fn = getattr(app, method)
    kwargs = declared_options(fn, **options)
    attempts = max(1, 1 + int(limits.retries))
    failure = None
    for attempt in range(1, attempts + 1):
        start = time.monotonic()
        try:
            with _alarm(limits.time_limit_s):
                result = fn(arg, list(seeds), *extra, **kwargs)
        except _TimeUp:
            elapsed = time.monotonic() - start
            error = f"ran past its time limit of {limits.time_limit_s:g} s (output.time_limit_s, --time-limit)"
            failure = AppFailure(type(app).__name__, method, tuple(seeds), error, elapsed, traceback.format_exc(), attempt)
            continue
        except Exception as exc:  # noqa: BLE001 - anything the application raises is its failure, named to the user
            failure = AppFailure(type(app).__name__, method, tuple(seeds), f"raised {type(exc).__name__}: {exc}",
                                 time.monotonic() - start, traceback.format_exc(), attempt)
            continue
        problem = check(result) if check is not None else None
        if problem is None:
            return Outcome(result)
        failure = AppFailure(type(app).__name__, method, tuple(seeds), f"returned {problem}",
                             time.monotonic() - start, "", attempt)
    return Outcome(failure=failure)


class _alarm:
    """``SIGALRM`` after ``seconds`` raises :class:`_TimeUp` in this thread, when it is the main thread."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.armed = (math.isfinite(seconds) and seconds > 0 and hasattr(signal, "setitimer")
                      and threading.current_thread() is threading.main_thread())

    def __enter__(self) -> None:
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, _time_up)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc: object) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)


def _time_up(signum: int, frame: object) -> None:
    raise _TimeUp
