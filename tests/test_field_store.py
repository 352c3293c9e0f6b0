"""The field store and the robot-side Run API: durability, append-only ends, migrations."""

from __future__ import annotations

import os
import sqlite3

import pytest
from sqlalchemy import text

from qaopt.field import FieldError, Run, Store, StoreVersionError
from qaopt.field.migrations import Migration, ensure_schema
from qaopt.field.store import resolve_url


def test_run_records_everything(tmp_path):
    db = tmp_path / "field.db"
    config = {"knobs": {"heading": {"prune": 0.5}}, "nn_errors": {"heading": 3.2, "distance": 0.04}}
    with Run(db, "cropfollow", config=config, error_point={"heading": 10.0},
             conditions={"crop": "corn", "growth_stage": "V6", "soil": "clay"},
             operator="ana", notes="first row") as run:
        run.progress(10.0)
        run.event("collision", distance_m=12.5, position={"x": 1.0, "y": 12.5}, severity="light")
        run.event("intervention", distance_m=30.0)
        run.note("wind picked up")
        run.attach(tmp_path / "cam.mp4", "video")
        run.progress(42.0)
    with Store(db) as store:
        rec = store.run(run.id)
    assert rec.status == "complete" and rec.ended_at >= rec.started_at
    assert rec.distance_m == 42.0  # last odometer reading, no explicit end distance
    assert rec.config.nn_errors == {"heading": 3.2, "distance": 0.04}
    assert rec.config.hash and rec.error_point == {"heading": 10.0}
    assert rec.conditions.crop == "corn" and rec.conditions.model_extra == {"soil": "clay"}
    assert [e.kind for e in rec.events] == ["progress", "collision", "intervention", "note", "progress"]
    hit = rec.events[1]
    assert hit.position == {"x": 1.0, "y": 12.5} and hit.data == {"severity": "light"}
    assert hit.at is not None and hit.t_s >= 0
    assert rec.count("collision") == 1 and rec.count("intervention") == 1
    assert rec.attachments[0].path.endswith("cam.mp4") and rec.attachments[0].kind == "video"
    assert rec.host and rec.pid == os.getpid() and rec.source == "api"


def test_exception_marks_run_aborted_and_keeps_events(tmp_path):
    db = tmp_path / "f.db"
    with pytest.raises(RuntimeError):
        with Run(db, "app") as run:
            run.event("collision", distance_m=3.0)
            raise RuntimeError("motor stalled")
    rec = Store(db).run(run.id)
    assert rec.status == "aborted" and "motor stalled" in rec.end_message
    assert rec.count("collision") == 1 and rec.distance_m == 3.0


def test_explicit_end_and_closed_run(tmp_path):
    db = tmp_path / "f.db"
    with Run(db, "app") as run:
        run.progress(50.0)
        run.end(distance_m=100.0)
        with pytest.raises(FieldError, match="has ended"):
            run.event("collision")
    assert Store(db).run(run.id).distance_m == 100.0
    with pytest.raises(FieldError, match="not started"):
        Run(db, "app").event("collision")


def test_a_run_ends_once_in_the_store(tmp_path):
    store = Store(tmp_path / "f.db")
    run = Run(store, "app").start()
    run.end(10.0)
    with pytest.raises(FieldError, match="already ended"):
        store.end_run(run.id, status="complete", ended_at=store.run(run.id).ended_at, distance_m=5.0)
    assert store.run(run.id).distance_m == 10.0


def test_bad_event_is_refused_before_writing(tmp_path):
    db = tmp_path / "f.db"
    with Run(db, "app") as run:
        with pytest.raises(ValueError, match="kind"):
            run.event("Bad Kind!")
        with pytest.raises(ValueError, match="finite"):
            run.event("collision", distance_m=float("nan"))
        with pytest.raises(ValueError, match="finite"):
            run.event("collision", t=float("inf"), position={"x": float("inf")})
    assert Store(db).run(run.id).events == ()


def test_sqlite_is_wal_with_full_sync(tmp_path):
    store = Store(tmp_path / "f.db")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000


def test_resolve_url(tmp_path):
    assert resolve_url("f.db", tmp_path) == f"sqlite:///{tmp_path / 'f.db'}"
    assert resolve_url("sqlite:///sub/f.db", tmp_path) == f"sqlite:///{tmp_path / 'sub' / 'f.db'}"
    assert resolve_url(f"sqlite:///{tmp_path}/a.db") == f"sqlite:///{tmp_path}/a.db"
    assert resolve_url("postgresql://u:pw@h/db").startswith("postgresql+psycopg://u:pw@h/db")
    with pytest.raises(FieldError, match="not a SQLAlchemy URL"):
        resolve_url("::bad::://x")


def test_unreachable_server_is_a_clear_error():
    with pytest.raises(FieldError, match="cannot open field store postgresql"):
        Store("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")


def test_fresh_store_is_stamped_and_reopens(tmp_path):
    db = tmp_path / "f.db"
    assert Store(db).schema_version == 1
    assert Store(db).schema_version == 1
    rows = sqlite3.connect(db).execute("SELECT version FROM field_schema_versions").fetchall()
    assert rows == [(1,)]


def test_migration_upgrades_an_old_store_and_keeps_its_runs(tmp_path):
    db = tmp_path / "f.db"
    with Run(db, "app") as run:
        run.event("collision", distance_m=1.0)
    store = Store(db)

    def add_battery(conn):
        conn.execute(text("ALTER TABLE field_runs ADD COLUMN battery_pct INTEGER"))

    step = Migration(2, "runs record the battery level", add_battery)
    assert ensure_schema(store.engine, [step]) == 2
    assert ensure_schema(store.engine, [step]) == 2  # applied once only
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT battery_pct FROM field_runs")).scalars().all() == [None]
        versions = conn.execute(text("SELECT version, description FROM field_schema_versions "
                                     "ORDER BY version")).all()
    assert versions == [(1, "created at the latest schema"), (2, "runs record the battery level")]
    assert store.run(run.id).count("collision") == 1


def test_failed_migration_changes_nothing(tmp_path):
    store = Store(tmp_path / "f.db")

    def broken(conn):
        conn.execute(text("ALTER TABLE field_runs ADD COLUMN x INTEGER"))
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        ensure_schema(store.engine, [Migration(2, "broken", broken)])
    with store.engine.connect() as conn:
        cols = [r[1] for r in conn.exec_driver_sql("PRAGMA table_info(field_runs)")]
        assert "x" not in cols
        assert conn.exec_driver_sql("SELECT max(version) FROM field_schema_versions").scalar() == 1


def test_newer_store_is_refused_with_the_fix(tmp_path):
    db = tmp_path / "f.db"
    store = Store(db)
    ensure_schema(store.engine, [Migration(2, "from the future", lambda conn: None)])
    with pytest.raises(StoreVersionError, match="schema version 2.*upgrade qaopt"):
        Store(db)


@pytest.mark.postgres
def test_postgres_store_round_trip():
    url = os.environ.get("QAOPT_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("set QAOPT_TEST_POSTGRES_URL (e.g. postgresql://postgres@localhost/qaopt_test)")
    store = Store(url)
    with Run(store, "pg-app", conditions={"crop": "soy"}) as run:
        run.progress(5.0)
        run.event("collision", distance_m=6.0, position={"x": 0.5, "y": 6.0})
    rec = store.run(run.id)
    assert rec.status == "complete" and rec.distance_m == 6.0
    assert rec.events[1].position == {"x": 0.5, "y": 6.0}
    assert rec.started_at.tzinfo is not None
    assert Store(url).schema_version == 1  # a second open finds the schema in place
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM field_schema_versions")).scalar() >= 1
    store.close()



def test_bad_configuration_is_refused_before_the_run_starts(tmp_path):
    with pytest.raises(ValueError, match="nn_errors.heading"):
        Run(tmp_path / "f.db", "app", config={"nn_errors": {"heading": -1.0}})
    with pytest.raises(ValueError, match="soil|extra|crop"):
        Run(tmp_path / "f.db", "app", conditions={"crop": ["not", "a", "string"]})
    assert not (tmp_path / "f.db").exists()  # nothing was written
