"""Crash safety and concurrency of the field log, and its light import (no torch, no TVM)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from qaopt.field import Store

WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from qaopt.field import Run
    db, name, runs, events, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
    while not go.exists():          # both writers start at the same instant
        time.sleep(0.005)
    for r in range(runs):
        with Run(db, "race", operator=name, run_id=f"{name}-{r}") as run:
            for i in range(events):
                run.event("collision" if i % 2 else "intervention", distance_m=float(i), writer=name)
""")


def _race(store: str, names: tuple[str, ...], runs: int, events: int, go) -> None:
    """Start one WRITER process per name, release them at once, wait for all to succeed."""
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, store, name, str(runs), str(events), str(go)],
                              stderr=subprocess.PIPE, text=True) for name in names]
    time.sleep(0.5)
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err


def test_two_processes_logging_at_once_lose_nothing(tmp_path):
    db = tmp_path / "shared.db"  # the store does not exist yet: both writers create it
    runs, events = 3, 40
    _race(str(db), ("robot", "laptop"), runs, events, tmp_path / "go")
    recs = Store(db).runs()
    assert sorted(r.id for r in recs) == sorted(f"{n}-{r}" for n in ("robot", "laptop") for r in range(runs))
    for rec in recs:
        assert rec.status == "complete"
        assert len(rec.events) == events
        assert [e.distance_m for e in rec.events] == [float(i) for i in range(events)]
        assert {e.data["writer"] for e in rec.events} == {rec.operator}


KILLED = textwrap.dedent("""
    import sys
    from qaopt.field import Run
    with Run(sys.argv[1], "crash", run_id="doomed") as run:
        i = 0
        while True:                 # logs until killed
            run.progress(float(i))
            if i == 25:
                print("ready", flush=True)
            i += 1
""")


def test_killed_process_leaves_a_consistent_store_with_the_run_incomplete(tmp_path):
    db = tmp_path / "f.db"
    p = subprocess.Popen([sys.executable, "-c", KILLED, str(db)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # let it die in the middle of writing
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    rec = Store(db).run("doomed")
    assert rec.status == "incomplete" and rec.ended_at is None
    n = len(rec.events)
    assert n > 25
    # every event written before the kill is there, in order, with none missing in between
    assert [e.distance_m for e in rec.events] == [float(i) for i in range(n)]
    assert rec.known_distance_m == float(n - 1)


BLOCKED = textwrap.dedent("""
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "tvm", "tvm_ffi", "torch_pruning", "onnxruntime", "optuna"):
                raise ImportError(f"{name} is blocked: the field API must not import it")
            return None

    sys.meta_path.insert(0, Block())
    from qaopt.field import Run, Store
    with Run(sys.argv[1], "pi", conditions={"crop": "corn"}) as run:
        run.progress(1.0)
        run.event("collision", distance_m=1.5, position={"x": 0.1, "y": 1.5})
        run.attach(sys.argv[1], "db")
    rec = Store(sys.argv[1]).run(run.id)
    assert rec.status == "complete" and rec.count("collision") == 1, rec
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "tvm", "numpy", "scipy")
                   or m.startswith(("qaopt.calibrate", "qaopt.simulators", "qaopt.approx", "qaopt.kernels")))
    print("heavy:", heavy)
""")


def test_logging_api_runs_with_torch_and_tvm_blocked(tmp_path):
    out = subprocess.run([sys.executable, "-c", BLOCKED, str(tmp_path / "pi.db")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "heavy: []"


def test_blocker_really_blocks(tmp_path):
    """The check above can fail: with the blocker in place, importing torch raises."""
    script = BLOCKED.split("from qaopt.field")[0] + "import torch\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "torch is blocked" in out.stderr


@pytest.mark.postgres
def test_two_processes_on_postgres(tmp_path):
    url = os.environ.get("QAOPT_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("set QAOPT_TEST_POSTGRES_URL (e.g. postgresql://postgres@localhost/qaopt_test)")
    tag = f"pg{os.getpid()}"
    _race(url, (f"{tag}a", f"{tag}b"), 2, 20, tmp_path / "go")
    recs = Store(url).runs(ids=[f"{tag}{n}-{r}" for n in "ab" for r in range(2)])
    assert len(recs) == 4 and all(len(r.events) == 20 and r.status == "complete" for r in recs)
