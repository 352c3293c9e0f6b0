"""Schema versions and migrations of the field store.

A fresh store is created from the latest tables and stamped with
:data:`~qaopt.field.schema.SCHEMA_VERSION` (what alembic recommends for new
databases); an older store is brought forward by the migrations after its version,
each in the transaction that records it, so a crash mid-upgrade changes nothing.

Why not alembic: it would put a migration-script tree, its ``env.py`` and mako on
the robot, where the logging API must run with only SQLAlchemy (issue: a Raspberry
Pi). A migration here is a function of a SQLAlchemy connection; inside it
``alembic.operations.Operations`` may still be used when an upgrade needs SQLite's
batch mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import Connection, Engine, func, insert, inspect, select, text

from .errors import StoreVersionError
from .schema import SCHEMA_VERSION, metadata, schema_versions


@dataclass(frozen=True)
class Migration:
    """Upgrade a store from ``version - 1`` to ``version``."""

    version: int
    description: str
    upgrade: Callable[[Connection], None]


MIGRATIONS: tuple[Migration, ...] = ()
"""Every migration since version 1 of the store, oldest first."""

_PG_LOCK_KEY = 0x7161_6F70_7446  # "qaoptF": serialises schema work across team members


def ensure_schema(
    engine: Engine,
    migrations: Sequence[Migration] = MIGRATIONS,
    latest: int = SCHEMA_VERSION,
) -> int:
    """Create or upgrade the store's tables; returns the store's schema version.

    Safe when several processes open a new store at once: the check and the DDL run
    in one write transaction (``BEGIN IMMEDIATE`` on SQLite, an advisory lock on
    PostgreSQL), so exactly one of them creates or upgrades the tables.
    """
    steps = sorted(migrations, key=lambda m: m.version)
    latest = max([latest, *(m.version for m in steps)])
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
        if not inspect(conn).has_table(schema_versions.name):
            metadata.create_all(conn)
            _stamp(conn, latest, "created at the latest schema")
            return latest
        current = conn.execute(select(func.max(schema_versions.c.version))).scalar_one()
        if current > latest:
            raise StoreVersionError(
                f"{engine.url.render_as_string(hide_password=True)}: the field store is at schema "
                f"version {current}, this qaopt knows versions up to {latest}; upgrade qaopt "
                "(pip install -U qaopt) to read or write it"
            )
        for step in steps:
            if step.version > current:
                if step.version != current + 1:
                    raise StoreVersionError(
                        f"no migration from field-store schema version {current} to {current + 1}"
                    )
                step.upgrade(conn)
                _stamp(conn, step.version, step.description)
                current = step.version
        return current


def _stamp(conn: Connection, version: int, description: str) -> None:
    conn.execute(
        insert(schema_versions).values(
            version=version, description=description, applied_at=datetime.now(timezone.utc)
        )
    )
