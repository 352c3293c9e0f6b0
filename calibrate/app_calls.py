"""Calling the application: its optional parameters, a wall-clock limit, retries, and a failure that names itself.

Every run qaopt asks of an application (calibration's ``evaluate``, closed-loop validation's
``evaluate_perception``), in this process or on a pool or cluster worker, goes through
:func:`call_application`, so one policy holds for all of them:

- **An exception is the application's, not a measurement.** A call that raises (or returns
  something that is not one record per seed) says nothing about the QoS of the NNs' errors:
  it comes back as an :class:`AppFailure` (the method, the seeds, the exception and its
  traceback), the caller stores nothing of that block and stops the run with
  :class:`ApplicationFault`, one line naming the method, the seeds and the point or NNs.
- **A wall-clock limit learnt from the run.** A call counts as hung once it runs past
  :data:`HANG_MULTIPLE` times the median seconds per seed of this process's earlier calls of
  the same method (:func:`hang_limit`; at least :data:`HANG_FLOOR_S`), or past
  ``RunLimits.time_limit_s``, the hard cap. A limit the user set (``output.time_limit_s``,
  ``--time-limit``) is used as given. A hung call is interrupted (``SIGALRM`` in the thread
  that runs it, the main thread of a pool worker or of the command) and fails the same way,
  with its elapsed time. Where no alarm can be set (a Dask worker's thread), the call runs
  unlimited.
- **Retries.** ``RunLimits.retries`` calls again after a failure before giving up; an
  application whose failures are transient (a simulator's license server, a flaky
  socket) then still gives its deterministic result.
- **Optional parameters.** A parameter added to the protocol after an application was
  written is passed only when the method declares it (:func:`qaopt.calibrate.protocols.declared_options`).
"""

from __future__ import annotations

import math
import signal
import statistics
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qaopt.app_spec.errors import QaoptError
from qaopt.app_spec.schema import DEFAULT_TIME_LIMIT_S
from qaopt.calibrate.protocols import declared_options


HANG_MULTIPLE = 10.0
"""A call counts as hung past this many times the median seconds per seed of the earlier calls of its kind. A
closed-loop run's length varies with its scene and ends early when the robot fails; ten medians leave room for the
longest drives while a hung call is noticed in minutes, not after the 30-minute hard cap."""
HANG_FLOOR_S = 60.0
"""The learnt limit is never below this: a call of a few seconds may take far longer on a loaded machine."""
HANG_LEARN_AFTER = 1
"""Calls of a kind this process must have finished before their times set the limit; until then the hard cap holds."""
_KEPT_TIMES = 256


@dataclass(frozen=True)
class RunLimits:
    """How long one application call may take and how often a failed call is tried again (the spec's ``output``)."""

    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    retries: int = 0
    learnt: bool = True
    """Whether a call counts as hung before ``time_limit_s`` once this process has timed calls of its kind (false
    when the user set the limit: ``output.time_limit_s`` in the spec, ``--time-limit``)."""


class _CallTimes:
    """Seconds per seed of this process's finished calls, per (application class, method): a pool worker's, or the
    command's when it runs the application itself. Shared by the threads of a process; never pickled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: dict[tuple[str, str], deque[float]] = {}

    def add(self, kind: tuple[str, str], per_seed_s: float) -> None:
        with self._lock:
            self._times.setdefault(kind, deque(maxlen=_KEPT_TIMES)).append(per_seed_s)

    def median(self, kind: tuple[str, str]) -> float | None:
        with self._lock:
            times = list(self._times.get(kind, ()))
        return statistics.median(times) if len(times) >= HANG_LEARN_AFTER else None

    def forget(self) -> None:
        with self._lock:
            self._times.clear()


_CALL_TIMES = _CallTimes()


def forget_call_times() -> None:
    """Drop the call times this process has learnt (a new run in the same process starts with the hard cap)."""
    _CALL_TIMES.forget()


def _kind(app: object, method: str) -> tuple[str, str]:
    return f"{type(app).__module__}.{type(app).__qualname__}", method


@dataclass(frozen=True)
class HangLimit:
    """The seconds a call may run, and the words that say where that number comes from."""

    seconds: float
    source: str


def hang_limit(app: object, method: str, seeds: int, limits: RunLimits) -> HangLimit:
    """How long a call of ``app.method`` on ``seeds`` seeds may run before it counts as hung.

    ``max(HANG_FLOOR_S, HANG_MULTIPLE x median seconds per seed x seeds)`` once this process has timed such calls,
    never above ``limits.time_limit_s``; the hard cap alone when it has not, or when the user set the limit.
    """
    hard = HangLimit(limits.time_limit_s, "output.time_limit_s, --time-limit")
    median = _CALL_TIMES.median(_kind(app, method)) if limits.learnt else None
    if median is None:
        return hard
    learnt = max(HANG_FLOOR_S, HANG_MULTIPLE * median * max(1, seeds))
    if learnt >= hard.seconds:
        return hard
    return HangLimit(learnt, f"{HANG_MULTIPLE:g}x the median {median:.3g} s per seed of this run's earlier {method} "
                             f"calls, at least {HANG_FLOOR_S:g} s; output.time_limit_s or --time-limit sets it")


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
    kind = _kind(app, method)
    for attempt in range(1, attempts + 1):
        limit = hang_limit(app, method, len(seeds), limits)
        start = time.monotonic()
        try:
            with _alarm(limit.seconds):
                result = fn(arg, list(seeds), *extra, **kwargs)
        except _TimeUp:
            elapsed = time.monotonic() - start
            error = f"ran past its time limit of {limit.seconds:g} s ({limit.source})"
            failure = AppFailure(type(app).__name__, method, tuple(seeds), error, elapsed, traceback.format_exc(), attempt)
            continue
        except Exception as exc:  # noqa: BLE001 - anything the application raises is its failure, named to the user
            failure = AppFailure(type(app).__name__, method, tuple(seeds), f"raised {type(exc).__name__}: {exc}",
                                 time.monotonic() - start, traceback.format_exc(), attempt)
            continue
        problem = check(result) if check is not None else None
        if problem is None:
            _CALL_TIMES.add(kind, (time.monotonic() - start) / max(1, len(seeds)))
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
