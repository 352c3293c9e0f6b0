"""The study lock serialises workers in separate processes, on SQLite and on PostgreSQL, and seeding holds it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

import optuna
import pytest

from qaopt.search import OptimizeError, open_storage

# Each process takes the lock at the same moment (argv[3], a wall-clock time) and writes "in"/"out" lines around
# a hold long enough for the other to try; the Optuna storage is opened directly to keep the start light.
HOLDER = textwrap.dedent("""
    import sys, time
    import optuna
    from qaopt.study_lock import study_lock
    storage = optuna.storages.RDBStorage(sys.argv[1])
    time.sleep(max(0.0, float(sys.argv[3]) - time.time()))
    with study_lock(storage, "one-study"):
        with open(sys.argv[2], "a") as log:
            log.write(f"in {sys.argv[4]}\\n")
        time.sleep(0.5)
        with open(sys.argv[2], "a") as log:
            log.write(f"out {sys.argv[4]}\\n")
""")


def _hold_together(url: str, log) -> list[str]:
    start = time.time() + 5.0  # after both interpreters have started
    holders = [subprocess.Popen([sys.executable, "-c", HOLDER, url, str(log), str(start), str(i)]) for i in range(3)]
    assert [h.wait(timeout=120) for h in holders] == [0, 0, 0]
    return log.read_text().split("\n")[:-1]


def _serialised(lines: list[str]) -> bool:
    """Each holder's "out" comes right after its "in": no two held the lock at once."""
    pairs = [lines[i:i + 2] for i in range(0, len(lines), 2)]
    return len(pairs) == 3 and all(a.split()[0] == "in" and b == f"out {a.split()[1]}" for a, b in pairs)


def test_processes_on_one_sqlite_study_hold_the_lock_one_at_a_time(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.storages.RDBStorage(url)  # the tables, before the holders race to create them
    lines = _hold_together(url, tmp_path / "log")
    assert _serialised(lines), lines


@pytest.mark.postgres
@pytest.mark.skipif(not os.environ.get("QAOPT_TEST_POSTGRES_URL"), reason="QAOPT_TEST_POSTGRES_URL is not set")
def test_processes_on_one_postgres_study_hold_the_lock_one_at_a_time(tmp_path):
    url = os.environ["QAOPT_TEST_POSTGRES_URL"]
    optuna.storages.RDBStorage(url)
    lines = _hold_together(url, tmp_path / f"log-{uuid.uuid4().hex[:8]}")
    assert _serialised(lines), lines


def test_a_storage_without_a_lock_is_refused_with_the_ones_that_have_one():
    with pytest.raises(OptimizeError, match=r"search.storage: mysql://qaopt:\*\*\*@db/q is a mysql database; "
                                            r"qaopt shares studies through SQLite .* or PostgreSQL"):
        open_storage("mysql://qaopt:secret@db/q")
    with pytest.raises(OptimizeError, match="is not a database URL; give sqlite:///path/study.db"):
        open_storage("study.db")
