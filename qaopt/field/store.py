"""The field store: append-only run records in SQLite (default) or any SQLAlchemy database.

SQLite is set up for a robot and a laptop writing at once: write-ahead logging,
``BEGIN IMMEDIATE`` transactions (a writer waits for the lock up front instead of
failing half-way), a busy timeout, and ``synchronous=FULL`` so a committed event
survives a power cut, not only a crash. Each write is its own transaction: when a
call returns, what it wrote is on disk.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError

from . import schema as t
from .errors import FieldError
from .migrations import ensure_schema
from .records import Attachment, Event, RunRecord, RunStatus

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
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = FULL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


class Store:
    """A field store at ``url`` (a SQLAlchemy URL or a SQLite file path).

    Opening creates or migrates the tables. Writes are append-only; reads return
    :class:`~qaopt.field.records.RunRecord` objects.
    """

    def __init__(self, url: str | Path, *, base_dir: str | Path | None = None,
                 busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S):
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
        with self.engine.begin() as conn:
            conn.execute(insert(t.runs).values(_run_row(record)))

    def add_event(self, run_id: str, seq: int, ev: Event) -> None:
        with self.engine.begin() as conn:
            conn.execute(insert(t.events).values(_event_row(run_id, seq, ev)))

    def add_attachment(self, run_id: str, att: Attachment) -> None:
        with self.engine.begin() as conn:
            conn.execute(insert(t.attachments).values(run_id=run_id, **att.model_dump()))

    def end_run(self, run_id: str, *, status: RunStatus, ended_at, distance_m: float | None,
                message: str = "") -> None:
        """Record a run's end; a second end of the same run is refused."""
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

    # ---- reads ---------------------------------------------------------------------------

    def runs(self, *, application: str | None = None,
             ids: Iterable[str] | None = None) -> list[RunRecord]:
        """Runs (oldest first) with their events and attachments."""
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
            evs: dict[str, list[Event]] = defaultdict(list)
            atts: dict[str, list[Attachment]] = defaultdict(list)
            for chunk in _chunks(wanted, 500):
                for e in conn.execute(select(t.events).where(t.events.c.run_id.in_(chunk))
                                      .order_by(t.events.c.run_id, t.events.c.seq)).mappings():
                    evs[e["run_id"]].append(Event(
                        kind=e["kind"], at=e["at"], t_s=e["t_s"], distance_m=e["distance_m"],
                        position=e["position"], data=e["data"]))
                for a in conn.execute(select(t.attachments).where(t.attachments.c.run_id.in_(chunk))
                                      .order_by(t.attachments.c.id)).mappings():
                    atts[a["run_id"]].append(Attachment(path=a["path"], kind=a["kind"],
                                                        added_at=a["added_at"]))
        return [_record(r, evs[r["id"]], atts[r["id"]]) for r in rows]

    def run(self, run_id: str) -> RunRecord:
        found = self.runs(ids=[run_id])
        if not found:
            raise FieldError(f"no run {run_id!r} in field store {self.display_url}")
        return found[0]


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


def _record(row, events: list[Event], attachments: list[Attachment]) -> RunRecord:
    ended = row["run_id"] is not None
    return RunRecord(
        id=row["id"], application=row["application"],
        config={"hash": row["config_hash"], "knobs": row["config_knobs"],
                "nn_errors": row["nn_errors"]},
        error_point=row["error_point"], conditions=row["conditions"], operator=row["operator"],
        notes=row["notes"], started_at=row["started_at"], host=row["host"], pid=row["pid"],
        source=row["source"],
        ended_at=row["ended_at"] if ended else None,
        status=row["status"] if ended else "incomplete",
        distance_m=row["distance_m"] if ended else None,
        end_message=row["message"] if ended else "",
        events=tuple(events), attachments=tuple(attachments),
    )
