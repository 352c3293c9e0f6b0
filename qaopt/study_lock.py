"""A lock that every worker on one study storage shares, held while a worker seeds a study.

Seeding a study (the reference trial, the informed trials, each precision alone) is check-then-insert:
Optuna's ``enqueue_trial(skip_if_exists=True)`` looks for the trial and then adds it, and says itself that two
processes doing this at once both add it. Workers that start one study together (``qaopt optimize`` on several
machines with one ``--storage``) would then run the reference trial twice and spend a trial of the shared budget
on it. Holding this lock around the whole check-and-enqueue makes seeding happen once, whichever worker comes
first; the others find the seeds in place and add nothing.

The lock lives where the storage lives, so that it spans every machine that can reach the study:

- PostgreSQL: a session advisory lock on a connection of the storage's own engine. A worker that dies while
  holding it drops its connection, and the server releases the lock.
- SQLite: a file lock beside the database (a SQLite database is one machine's). One lock serves all of the
  database's studies; seeding is short.
- Optuna's in-memory storage: one process, nothing to share.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy
from filelock import FileLock
from optuna.storages import BaseStorage

#: The SQL dialects whose studies qaopt can share between workers (``search.storage`` URLs).
DIALECTS = ("sqlite", "postgresql")


@contextmanager
def study_lock(storage: BaseStorage, study_name: str) -> Iterator[None]:
    """Hold the lock for seeding ``study_name`` on ``storage``, for as long as the ``with`` block runs."""
    engine: sqlalchemy.Engine | None = getattr(storage, "engine", None)
    if engine is None:  # in-memory storage
        yield
        return
    dialect = engine.dialect.name
    if dialect == "postgresql":
        with _advisory_lock(engine, _lock_key(study_name)):
            yield
    elif dialect == "sqlite":
        database = engine.url.database
        if not database or database == ":memory:":
            yield
            return
        with FileLock(f"{database}.lock"):
            yield
    else:
        raise ValueError(f"no study lock for a {dialect} storage; qaopt shares studies through {', '.join(DIALECTS)}")


def _lock_key(study_name: str) -> int:
    """The study's advisory lock key: PostgreSQL's lock keys are signed 64-bit integers."""
    return int.from_bytes(hashlib.blake2b(study_name.encode(), digest_size=8).digest(), "big", signed=True)


@contextmanager
def _advisory_lock(engine: sqlalchemy.Engine, key: int) -> Iterator[None]:
    """Hold PostgreSQL's session advisory lock ``key`` on a connection of ``engine``; wait while another holds it.

    A session lock outlives transactions, so it must be released on the same connection before that connection
    goes back to the pool (a pooled connection would otherwise keep it).
    """
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
        connection.commit()
        try:
            yield
        finally:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
            connection.commit()
