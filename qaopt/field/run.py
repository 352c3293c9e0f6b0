"""The robot-side logging API: ``with Run(...) as run: run.event("collision", ...)``.

Every call writes through to the store before it returns, so the log is exactly
what happened up to the last returned call, whenever the process dies. Only the
standard library, pydantic and SQLAlchemy are imported: it runs on a Raspberry Pi
without torch or TVM.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .errors import FieldError, FieldValueError
from .records import (
    EXCLUDED,
    NOTE,
    PROGRESS,
    Attachment,
    Conditions,
    Configuration,
    Event,
    RunRecord,
    RunStatus,
    check_metres,
    describe,
)
from .store import Store


class Run:
    """One field run, logged live.

    >>> with Run("field.db", "cropfollow", config={"knobs": {"heading": {"prune": 0.5}}},
    ...          conditions={"crop": "corn", "growth_stage": "V6"}) as run:   # doctest: +SKIP
    ...     run.progress(12.0)
    ...     run.event("collision", distance_m=12.4, position={"x": 3.1, "y": 12.4})
    ...     run.end(distance_m=100.0)

    Leaving the ``with`` block ends the run: ``complete`` normally, ``aborted`` (with the
    exception's message) when the block raises. Without an explicit :meth:`end` the run's
    distance is the last odometer reading given to :meth:`progress` or :meth:`event`.
    A process killed inside the block leaves the run ``incomplete`` with every event
    logged before the kill.

    Every value is checked before anything is written: a bad one (a negative or NaN
    distance, a string where a number belongs, NaN inside event data, an unknown status)
    raises :class:`~qaopt.field.FieldValueError` (a ``ValueError``), the store is left as
    it was, and the run stays open for the next call.
    """

    def __init__(
        self,
        store: str | Path | Store,
        application: str,
        *,
        config: Configuration | Mapping[str, Any] | None = None,
        error_point: Mapping[str, float] | None = None,
        conditions: Conditions | Mapping[str, Any] | None = None,
        operator: str = "",
        notes: str = "",
        run_id: str | None = None,
        source: str = "api",
    ):
        self._store_arg = store
        self._store: Store | None = None
        self.id = run_id or uuid.uuid4().hex
        self._record = _valid(RunRecord, "Run", dict(
            id=self.id, application=application,
            config=_valid(Configuration, "Run: config", config or {}),
            error_point=dict(error_point) if error_point is not None else None,
            conditions=_valid(Conditions, "Run: conditions", conditions or {}),
            operator=operator, notes=notes, started_at=datetime.now(timezone.utc),
            host=socket.gethostname(), pid=os.getpid(), source=source,
        ))
        self._t0 = 0.0
        self._seq = 0
        self._distance_m: float | None = None
        self.status: RunStatus | None = None

    @property
    def store(self) -> Store | None:
        """The store written to (None until the run starts)."""
        return self._store

    @property
    def distance_m(self) -> float | None:
        """The distance driven so far: the last odometer reading, or the end distance once ended."""
        return self._distance_m

    def start(self) -> Run:
        """Insert the run (status ``incomplete`` until it ends). Called by ``with``."""
        if self._store is not None:
            raise FieldError(f"run {self.id} has already started")
        store = self._store_arg if isinstance(self._store_arg, Store) else Store(self._store_arg)
        self._record = self._record.model_copy(update={"started_at": datetime.now(timezone.utc)})
        self._t0 = time.monotonic()
        store.start_run(self._record)
        self._store = store
        return self

    def event(
        self,
        kind: str,
        *,
        distance_m: float | None = None,
        position: Mapping[str, float] | None = None,
        **data: Any,
    ) -> Event:
        """Log an event (``"collision"``, ``"intervention"`` or a kind of your own) now.

        ``distance_m`` is the odometer along the row, ``position`` any coordinates; other
        keyword arguments are kept as the event's data (JSON: numbers must be finite).
        Durable when this returns.
        """
        self._check_open()
        if kind == EXCLUDED:
            raise FieldValueError(f"run.event: kind {EXCLUDED!r} is kept for `qaopt field exclude` "
                                  "(Store.exclude); name your event kind otherwise")
        distance_m = check_metres(distance_m, "run.event")
        ev = _valid(Event, "run.event", dict(
            kind=kind, at=datetime.now(timezone.utc), t_s=time.monotonic() - self._t0,
            distance_m=distance_m, position=dict(position) if position else None, data=data))
        self.store.add_event(self.id, self._seq, ev)
        self._seq += 1
        if distance_m is not None:
            self._distance_m = max(self._distance_m or 0.0, distance_m)
        return ev

    def progress(self, distance_m: float, **data: Any) -> Event:
        """Log the odometer, so that a run that dies still has a known distance."""
        return self.event(PROGRESS, distance_m=check_metres(distance_m, "run.progress", required=True), **data)

    def note(self, text: str) -> Event:
        return self.event(NOTE, text=text)

    def attach(self, path: str | Path, kind: str = "") -> Attachment:
        """Record a file (video, bag) that belongs to this run; the file is not copied."""
        self._check_open()
        att = Attachment(path=str(Path(path).expanduser().resolve()), kind=kind,
                         added_at=datetime.now(timezone.utc))
        self.store.add_attachment(self.id, att)
        return att

    def end(self, distance_m: float | None = None, *, status: RunStatus = "complete",
            message: str = "") -> None:
        """End the run with the distance driven (default: the last odometer reading)."""
        self._check_open()
        distance = self._distance_m if distance_m is None else distance_m  # checked by end_run
        self.store.end_run(self.id, status=status, ended_at=datetime.now(timezone.utc),
                           distance_m=distance, message=message)
        self.status, self._distance_m = status, distance

    def __enter__(self) -> Run:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.status is None and self._store is not None:
                if exc_type is None:
                    self.end()
                else:
                    self.end(status="aborted", message=f"{exc_type.__name__}: {exc}")
        finally:
            if self._store is not None and not isinstance(self._store_arg, Store):
                self._store.close()

    def _check_open(self) -> None:
        if self._store is None:
            raise FieldError(f"run {self.id} has not started; use `with Run(...) as run:` or run.start()")
        if self.status is not None:
            raise FieldError(f"run {self.id} has ended ({self.status}); start a new Run to log more")


def _valid(model: type[BaseModel], what: str, data: Any):
    """``model`` validated from ``data``, or :class:`FieldValueError` naming each bad field."""
    if isinstance(data, model):
        return data
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise FieldValueError(f"{what}: {describe(exc)}") from None
