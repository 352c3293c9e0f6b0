"""Does work on the *other* cores slow a measurement's pinned cores?

    python benchmarks/neighbour_load.py [--seconds 20] [--measure-cores 0,1] [--out FILE.json]

qaopt keeps a measurement's cores free of its simulator pool, but on the LaneKeep default run
(docs/BENCHMARKS.md, "LaneKeep") the machine-speed check found the device VM 57-67 % slower than
its best since boot. This script separates the candidates: it times qaopt's speed reference
(``qaopt.kernels.measure.matmul_reference_ms``: a fixed float32 matrix product on one BLAS
thread) pinned to the first measurement core, every 0.25 s for ``--seconds`` per phase, while
every other core (all cores but ``--measure-cores``) runs, one pinned process per core:

- ``idle``: nothing;
- ``spin``: a pure-Python busy loop (the scalar work of a simulator step);
- ``matmul``: float32 matrix products (wide vector units, as numba kernels and BLAS use them);
- ``memory``: 64 MiB array copies (memory bandwidth);
- ``idle-again``: nothing, to see whether the machine comes back.

It prints, per phase, the median and quartiles of the reference and its ratio to the first idle
phase's median, and writes them as JSON. It measures; it does not change qaopt.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

LOADS = {
    "spin": "while True: pass",
    "matmul": "import numpy as np\na = np.random.rand(512, 512).astype(np.float32)\nwhile True: a @ a",
    "memory": "import numpy as np\na = np.ones(1 << 24, np.float32)\nb = np.empty_like(a)\nwhile True: np.copyto(b, a)",
}
PHASES = ("idle", "spin", "matmul", "memory", "idle-again")


def _sample(seconds: float) -> list[float]:
    from qaopt.kernels.measure import matmul_reference_ms

    samples, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(matmul_reference_ms())
        time.sleep(0.25)
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--measure-cores", default="0,1")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()
    usable = sorted(os.sched_getaffinity(0))
    measure = [int(c) for c in args.measure_cores.split(",")]
    others = [c for c in usable if c not in measure]
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    os.sched_setaffinity(0, {measure[0]})
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}, "
          f"{len(usable)} cores; reference on core {measure[0]}, load on {len(others)} other cores; load average "
          f"{os.getloadavg()[0]:.2f}")
    rows = {}
    for phase in PHASES:
        procs = []
        if phase in LOADS:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            procs = [subprocess.Popen(["taskset", "-c", str(c), sys.executable, "-c", LOADS[phase]], env=env)
                     for c in others]
            time.sleep(2.0)  # the loads start (numpy imports) before sampling
        try:
            s = _sample(args.seconds)
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
        q = statistics.quantiles(s, n=4)
        rows[phase] = {"median_ms": statistics.median(s), "q1_ms": q[0], "q3_ms": q[2], "samples": len(s)}
    base = rows["idle"]["median_ms"]
    print("\n| phase (other cores) | reference median (ms) | quartiles (ms) | over idle |\n|---|---|---|---|")
    for phase, r in rows.items():
        r["over_idle"] = r["median_ms"] / base
        print(f"| {phase} | {r['median_ms']:.3f} | {r['q1_ms']:.3f}-{r['q3_ms']:.3f} | {r['over_idle']:.2f}x |")
    if args.out is not None:
        args.out.write_text(json.dumps({**prov, "cores": len(usable),
                                        "measure_core": measure[0], "load_cores": others, "phases": rows}, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
