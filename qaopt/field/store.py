"""The field store: append-only run records in SQLite (default) or any SQLAlchemy database.

SQLite is set up for a robot and a laptop writing at once: write-ahead logging,
``BEGIN IMMEDIATE`` transactions (a writer waits for the lock up front instead of
failing half-way), a busy timeout, and ``synchronous=FULL`` so a committed event
survives a power cut, not only a crash. Each write is its own transaction: when a
call returns, what it wrote is on disk.
"""

from __future__ import annotations

import sqlite3
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine, create_engine, event, func, insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError

from . import schema as t
from .errors import FieldDataWarning, FieldError, FieldValueError
from .migrations import ensure_schema
from .records import END_STATUSES, EXCLUDED, Attachment, Event, RunRecord, RunStatus, check_metres, describe

DEFAULT_BUSY_TIMEOUT_S = 60.0


def resolve_url(store: str | Path, base_dir: str | Path | None = None) -> str:
    """A store argument as a SQLAlchemy URL.

    A plain path is a SQLite file; ``sqlite:///rel.db`` and plain relative paths resolve
    against ``base_dir`` (the spec's folder) when given; ``postgresql://`` uses psycopg 3.
    """
    text = str(store)
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    if "://" not in text:
        return f"sqlite:///{(base / Path(text).expanduser()).resolve()}"
    try:
        url = make_url(text)
    except ArgumentError as exc:
        raise FieldError(f"field store URL {text!r} is not a SQLAlchemy URL ({exc}); "
                         "use a file path or e.g. postgresql://user@host/db") from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        url = url.set(database=str((base / Path(url.database).expanduser()).resolve()))
    return url.render_as_string(hide_password=False)


def _sqlite_engine(url: str, busy_timeout_s: float) -> Engine:
    database = make_url(url).database
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": busy_timeout_s})

    @event.listens_for(engine, "connect")
    def _configure(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # transactions are begun below, not by pysqlite
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        _set_wal(cur, busy_timeout_s)
        cur.execute("PRAGMA synchronous = FULL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _set_wal(cur, busy_timeout_s: float) -> None:
    """``PRAGMA journal_mode = WAL``, retried while another connection holds the lock, up to the busy timeout.

    SQLite can answer a journal-mode change with "database is locked" at once, without
    waiting through the busy handler, when another process is creating or converting
    the same file (two robots logging into one new store): retrying is what waiting
    would have done.
    """
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Store:
    """A field store at ``url`` (a SQLAlchemy URL or a SQLite file path).

    Opening creates or migrates the tables. Writes are append-only; reads return
    :class:`~qaopt.field.records.RunRecord` objects. A stored row that does not read back
    as a valid record (written by an older qaopt, or by hand) never stops a read: it is
    left out and reported through ``on_problem`` (default: a
    :class:`~qaopt.field.FieldDataWarning`), and every other run is returned.
    """

    def __init__(self, url: str | Path, *, base_dir: str | Path | None = None,
                 busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
                 on_problem: Callable[[str], None] | None = None):
        self.on_problem = on_problem or _warn
        self.url = resolve_url(url, base_dir)
        try:
            if make_url(self.url).get_backend_name() == "sqlite":
                self.engine = _sqlite_engine(self.url, busy_timeout_s)
            else:
                self.engine = create_engine(self.url, pool_pre_ping=True)
            self.schema_version = ensure_schema(self.engine)
        except (OperationalError, ModuleNotFoundError) as exc:
            raise FieldError(f"cannot open field store {self.display_url}: {exc}".splitlines()[0]
                             + "; check the URL, that the server runs, and for PostgreSQL "
                             "`pip install 'qaopt[postgres]'`") from exc

    @property
    def display_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.display_url!r})"

    # ---- writes (each one transaction, durable when it returns) -------------------------

    def start_run(self, record: RunRecord) -> None:
        """Insert a new run (its events and end come later, through the calls below)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(t.runs).values(_run_row(record)))
        except IntegrityError:
            raise FieldValueError(f"run id {record.id!r} is already in {self.display_url}; give each "
                                  "run its own id (or leave run_id out for a fresh one)") from None

    def add_event(self, run_id: str, seq: int, ev: Event) -> None:
        with self.engine.begin() as conn:
            conn.execute(insert(t.events).values(_event_row(run_id, seq, ev)))

    def add_attachment(self, run_id: str, att: Attachment) -> None:
        with self.engine.begin() as conn:
            conn.execute(insert(t.attachments).values(run_id=run_id, **att.model_dump()))

    def end_run(self, run_id: str, *, status: RunStatus, ended_at, distance_m: float | None,
                message: str = "") -> None:
        """Record a run's end; a second end of the same run is refused.

        ``status`` is ``complete`` or ``aborted`` and ``distance_m`` a finite number of
        metres >= 0 (or None): anything else is refused before it is written.
        """
        if status not in END_STATUSES:
            raise FieldValueError(f"end: status {status!r}: a run ends as 'complete' or 'aborted'"
                                  + ("; an incomplete run is one that never ended"
                                     if status == "incomplete" else ""))
        if not isinstance(message, str):
            raise FieldValueError(f"end: message must be text, got {type(message).__name__}")
        distance_m = check_metres(distance_m, "end")
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(t.run_ends).values(
                    run_id=run_id, ended_at=ended_at, status=status, distance_m=distance_m,
                    message=message))
        except IntegrityError:
            raise FieldError(f"run {run_id} has already ended (or does not exist in "
                             f"{self.display_url}); a run ends once") from None

    def add_records(self, records: Sequence[RunRecord]) -> None:
        """Insert whole runs in ONE transaction: all of them or, on any error, none."""
        try:
            self._add_records(records)
        except IntegrityError:
            raise FieldValueError(f"nothing imported: a run id is already in {self.display_url} (written "
                                  "meanwhile, or a stored run that does not read back); give the "
                                  "new runs their own ids") from None

    def _add_records(self, records: Sequence[RunRecord]) -> None:
        with self.engine.begin() as conn:
            for rec in records:
                conn.execute(insert(t.runs).values(_run_row(rec)))
                if rec.events:
                    conn.execute(insert(t.events),
                                 [_event_row(rec.id, i, ev) for i, ev in enumerate(rec.events)])
                if rec.attachments:
                    conn.execute(insert(t.attachments),
                                 [dict(run_id=rec.id, **a.model_dump()) for a in rec.attachments])
                if rec.status != "incomplete":
                    conn.execute(insert(t.run_ends).values(
                        run_id=rec.id, ended_at=rec.ended_at, status=rec.status,
                        distance_m=rec.distance_m, message=rec.end_message))

    def exclude(self, run_id: str, reason: str) -> Event:
        """Leave a run out of summaries, evidence and plans, keeping it in the store.

        Appends an ``excluded`` event with the reason (records are append-only: nothing is
        deleted, and an export still carries the run and its exclusion). Works on a run
        whose rows no longer read back, so a bad record can always be set aside. Its
        sequence number is negative, so it never collides with the events a live run is
        still writing (0, 1, 2, ...).
        """
        if not isinstance(reason, str) or not reason.strip():
            raise FieldValueError("exclude: give a reason (--reason TEXT), e.g. 'odometer reset mid-run'")
        ev = Event(kind=EXCLUDED, at=datetime.now(timezone.utc), data={"reason": reason.strip()})
        with self.engine.begin() as conn:
            if conn.execute(select(t.runs.c.id).where(t.runs.c.id == run_id)).first() is None:
                raise FieldError(f"no run {run_id!r} in field store {self.display_url}")
            done = conn.execute(select(t.events.c.data).where(
                t.events.c.run_id == run_id, t.events.c.kind == EXCLUDED)).first()
            if done is not None:
                raise FieldError(f"run {run_id} is already excluded ({(done[0] or {}).get('reason', '')})")
            lowest = conn.execute(select(func.min(t.events.c.seq))
                                  .where(t.events.c.run_id == run_id)).scalar()
            conn.execute(insert(t.events).values(_event_row(run_id, min(lowest or 0, 0) - 1, ev)))
        return ev

    # ---- reads ---------------------------------------------------------------------------

    def runs(self, *, application: str | None = None, ids: Iterable[str] | None = None,
             include_excluded: bool = False) -> list[RunRecord]:
        """Runs (oldest first) with their events and attachments.

        Runs excluded with :meth:`exclude` are left out unless ``include_excluded``. A row
        that does not validate is reported through ``on_problem`` and left out: a bad run
        row drops that run, a bad event or attachment row drops that row, a bad end row
        makes the run read as incomplete.
        """
        query = select(t.runs, t.run_ends).join_from(
            t.runs, t.run_ends, t.runs.c.id == t.run_ends.c.run_id, isouter=True
        ).order_by(t.runs.c.started_at, t.runs.c.id)
        if application is not None:
            query = query.where(t.runs.c.application == application)
        if ids is not None:
            query = query.where(t.runs.c.id.in_(list(ids)))
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
            wanted = [r["id"] for r in rows]
            evs: dict[str, list] = defaultdict(list)
            atts: dict[str, list] = defaultdict(list)
            for chunk in _chunks(wanted, 500):
                for e in conn.execute(select(t.events).where(t.events.c.run_id.in_(chunk))
                                      .order_by(t.events.c.run_id, t.events.c.seq)).mappings():
                    evs[e["run_id"]].append(e)
                for a in conn.execute(select(t.attachments).where(t.attachments.c.run_id.in_(chunk))
                                      .order_by(t.attachments.c.id)).mappings():
                    atts[a["run_id"]].append(a)
        out = []
        for r in rows:
            if not include_excluded and any(e["kind"] == EXCLUDED for e in evs[r["id"]]):
                continue
            rec = self._record(r, evs[r["id"]], atts[r["id"]])
            if rec is not None:
                out.append(rec)
        return out

    def run(self, run_id: str) -> RunRecord:
        """One run, excluded or not."""
        found = self.runs(ids=[run_id], include_excluded=True)
        if not found:
            raise FieldError(f"no run {run_id!r} in field store {self.display_url} (or it does not "
                             "read back: see the warning above)")
        return found[0]

    def _record(self, row, events: list, attachments: list) -> RunRecord | None:
        """A run read back from its rows, each validated on its own (see :meth:`runs`)."""
        run_id = row["id"]
        fix = f"; `qaopt field exclude {run_id} --reason ...` sets the run aside"

        def report(what: str, exc: ValidationError, consequence: str) -> None:
            self.on_problem(f"{self.display_url}: run {run_id}: {what}: {describe(exc)}; {consequence}{fix}")

        def valid(model, data: dict[str, Any], what: str, consequence: str):
            try:
                return model.model_validate(data)
            except ValidationError as exc:
                report(what, exc, consequence)
                return None

        base = dict(
            id=run_id, application=row["application"],
            config={"hash": row["config_hash"], "knobs": row["config_knobs"],
                    "nn_errors": row["nn_errors"]},
            error_point=row["error_point"], conditions=row["conditions"], operator=row["operator"],
            notes=row["notes"], started_at=row["started_at"], host=row["host"], pid=row["pid"],
            source=row["source"],
        )
        base["events"] = tuple(ev for e in events if (ev := valid(
            Event, {k: e[k] for k in Event.model_fields}, f"event {e['seq']} ({e['kind']})",
            "that event is left out")) is not None)
        base["attachments"] = tuple(a for x in attachments if (a := valid(
            Attachment, {k: x[k] for k in Attachment.model_fields}, f"attachment {x['path']!r}",
            "that attachment is left out")) is not None)
        if row["run_id"] is not None:  # ended: the whole record in one go, the usual case
            try:
                return RunRecord.model_validate({
                    **base, "ended_at": row["ended_at"], "status": row["status"],
                    "distance_m": row["distance_m"], "end_message": row["message"]})
            except ValidationError as exc:
                bad_end = exc
        started = valid(RunRecord, base, "run", "the run is left out")
        if started is not None and row["run_id"] is not None:
            report("end", bad_end, "the run reads as incomplete")
        return started

def _warn(message: str) -> None:
    warnings.warn(message, FieldDataWarning, stacklevel=5)  # at the caller of runs()


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _run_row(rec: RunRecord) -> dict:
    return dict(
        id=rec.id, application=rec.application, config_hash=rec.config.hash,
        config_knobs=rec.config.knobs, nn_errors=rec.config.nn_errors,
        error_point=rec.error_point, conditions=rec.conditions.model_dump(exclude_none=True),
        operator=rec.operator, notes=rec.notes, started_at=rec.started_at, host=rec.host,
        pid=rec.pid, source=rec.source,
    )


def _event_row(run_id: str, seq: int, ev: Event) -> dict:
    return dict(run_id=run_id, seq=seq, **ev.model_dump())


