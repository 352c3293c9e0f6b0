"""The field store's tables (the latest schema version).

Every table is append-only: a run is inserted when it starts, its events as they
happen and its end once, in a table of its own; nothing is ever updated or deleted.
So a process that dies at any instant leaves a consistent store, and a run without
a row in ``field_run_ends`` is incomplete by construction, with no clean-up needed.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.types import TypeDecorator

SCHEMA_VERSION = 1
"""Bump with a migration in :mod:`qaopt.field.migrations` whenever a table changes."""


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes on every backend (SQLite keeps no time zone by itself)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the field store; use an aware (UTC) one")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


metadata = MetaData()

schema_versions = Table(
    "field_schema_versions",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("description", Text, nullable=False),
    Column("applied_at", UTCDateTime, nullable=False),
)

runs = Table(
    "field_runs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("application", String(200), nullable=False, index=True),
    Column("config_hash", String(128), nullable=False, index=True),
    Column("config_knobs", JSON, nullable=False),
    Column("nn_errors", JSON, nullable=False),
    Column("error_point", JSON, nullable=True),
    Column("conditions", JSON, nullable=False),
    Column("operator", String(200), nullable=False),
    Column("notes", Text, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=True),
    Column("source", String(64), nullable=False),
)

run_ends = Table(
    "field_run_ends",
    metadata,
    Column("run_id", String(64), ForeignKey("field_runs.id"), primary_key=True),
    Column("ended_at", UTCDateTime, nullable=False),
    Column("status", String(16), nullable=False),
    Column("distance_m", Float, nullable=True),
    Column("message", Text, nullable=False),
)

events = Table(
    "field_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), ForeignKey("field_runs.id"), nullable=False, index=True),
    Column("seq", Integer, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("at", UTCDateTime, nullable=True),
    Column("t_s", Float, nullable=True),
    Column("distance_m", Float, nullable=True),
    Column("position", JSON, nullable=True),
    Column("data", JSON, nullable=False),
    UniqueConstraint("run_id", "seq", name="uq_field_events_run_seq"),
)

attachments = Table(
    "field_attachments",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), ForeignKey("field_runs.id"), nullable=False, index=True),
    Column("path", Text, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("added_at", UTCDateTime, nullable=True),
)
