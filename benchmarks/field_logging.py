"""What a durable event costs: latency of ``Run.event`` with one writer and with two at once.

Every event is its own committed transaction (SQLite: WAL, ``synchronous=FULL``), so
its latency is what a robot's control loop pays per logged event. Prints a markdown
table; a PostgreSQL row is added when ``QAOPT_TEST_POSTGRES_URL`` is set.

    .venv/bin/python benchmarks/field_logging.py [EVENTS_PER_WRITER]   # default 300
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

WRITER = textwrap.dedent("""
    import sys, time, json
    from pathlib import Path
    from qaopt.field import Run
    store, n, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    while not go.exists():
        time.sleep(0.002)
    lat = []
    with Run(store, "bench", operator=sys.argv[4]) as run:
        for i in range(n):
            t = time.perf_counter()
            run.event("progress", distance_m=float(i))
            lat.append(time.perf_counter() - t)
    print(json.dumps(lat))
""")


def measure(store: str, writers: int, n: int, tmp: Path) -> tuple[list[float], float]:
    """Per-event latencies (s) of all writers, and the wall time of the whole run."""
    import json

    go = tmp / f"go-{writers}-{time.monotonic_ns()}"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, store, str(n), str(go), f"w{i}"],
                              stdout=subprocess.PIPE, text=True) for i in range(writers)]
    time.sleep(1.0)  # let every writer import and wait at the gate
    t0 = time.perf_counter()
    go.touch()
    lat: list[float] = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"writer failed with status {p.returncode}")
        lat += json.loads(out)
    return lat, time.perf_counter() - t0


def main(n: int) -> None:
    print(f"Field logging cost, {n} events per writer, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print("| store | writers | events | median ms/event | p95 ms/event | events/s (all writers) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        stores = [("SQLite (WAL, synchronous=FULL)", str(tmp / "bench.db"))]
        if os.environ.get("QAOPT_TEST_POSTGRES_URL"):
            stores.append(("PostgreSQL (local)", os.environ["QAOPT_TEST_POSTGRES_URL"]))
        for name, store in stores:
            for writers in (1, 2):
                lat, wall = measure(store, writers, n, tmp)
                ms = sorted(x * 1000 for x in lat)
                p95 = ms[int(0.95 * (len(ms) - 1))]
                print(f"| {name} | {writers} | {len(ms)} | {statistics.median(ms):.2f} | {p95:.2f} | "
                      f"{len(ms) / wall:.0f} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
