"""Does a sub-millisecond NN's latency depend on the process it is measured in, and does ONNX Runtime's spinning matter?

    .venv/bin/python benchmarks/latency_modes.py [--processes 12] [--model compact] [--out FILE.json]

The repeatability benchmark (``latency_repeatability.py``) found the compact NavNet's
per-process medians split into two modes 10-20 % apart, in different rows from run to run,
while each process's own interval is tight. qaopt's ONNX Runtime sessions do not spin
(``session.intra_op.allow_spinning = 0``, see ``qaopt.kernels.onnx.ort_session``): a sleeping
pool thread must be woken for every parallel operator, which costs most when the operators are
short. This script measures the same ONNX files in ``--processes`` fresh processes each, with
spinning off (qaopt's setting) and on, by a plain timing loop (2 threads, the process pinned to
the first 2 cores, 50 warm-up runs, median of 300), so that the per-process spread of the two
settings can be compared directly. Each process also times two reference kernels just before the
model, whose work never changes: a 256x256 float32 matrix product (compute) and a copy of 32 MiB
(memory). If the model's slow processes are the ones where the references are slow too, the
machine itself was slower then, and a reference timed beside each measurement could say so. It
measures; it does not change qaopt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency_repeatability import INPUT_SHAPE, build_models  # noqa: E402

THREADS = 2
WARMUP, RUNS = 50, 300


def references() -> dict[str, float]:
    """Median ms of the reference kernels: a 256x256 float32 matrix product and a 32 MiB copy."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.random((256, 256), dtype=np.float32), rng.random((256, 256), dtype=np.float32)
    big, out = rng.random(8 * 2**20, dtype=np.float32), np.empty(8 * 2**20, dtype=np.float32)
    kernels = {"matmul": lambda: np.matmul(a, b), "copy": lambda: np.copyto(out, big)}
    figures = {}
    for name, kernel in kernels.items():
        for _ in range(20):
            kernel()
        times = []
        for _ in range(200):
            start = time.perf_counter()
            kernel()
            times.append(time.perf_counter() - start)
        figures[name] = statistics.median(times) * 1e3
    return figures


def child(onnx: str, spinning: bool) -> dict[str, float]:
    """One process's median latency in ms, and its reference kernels'."""
    import numpy as np
    import onnxruntime as ort

    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:THREADS])
    refs = references()
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    session = ort.InferenceSession(onnx, options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: np.random.default_rng(0).random(INPUT_SHAPE, dtype=np.float32)}
    for _ in range(WARMUP):
        session.run(None, feed)
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    return {"model": statistics.median(times) * 1e3, **refs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, metavar=("ONNX", "SPINNING"), help=argparse.SUPPRESS)
    ap.add_argument("--processes", type=int, default=12)
    ap.add_argument("--model", default="compact", choices=["compact", "resnet18"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1] == "1")))
        return
    import torch
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    from qaopt import kernels

    result: dict = {**prov, "threads": THREADS, "rows": []}
    with tempfile.TemporaryDirectory(prefix="qaopt-modes-") as tmp:
        models = build_models(Path(tmp), [args.model])
        fp32_onnx = Path(tmp) / f"{args.model}.onnx"
        kernels.export_onnx(torch.load(models[(args.model, "fp32")], weights_only=False), (torch.zeros(INPUT_SHAPE),),
                            fp32_onnx)
        files = {"fp32": str(fp32_onnx), "int8": models[(args.model, "int8")]}
        for dtype, onnx in files.items():
            for spinning in (False, True):
                runs = []
                for _ in range(args.processes):
                    out = subprocess.run([sys.executable, __file__, "--child", onnx, "1" if spinning else "0"],
                                         capture_output=True, text=True, check=True)
                    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                medians = [round(r["model"], 4) for r in runs]
                centre = statistics.median(medians)
                row = {"model": args.model, "dtype": dtype, "spinning": spinning, "medians_ms": medians,
                       "median_of_medians_ms": centre, "max_rel_dev": max(abs(m - centre) / centre for m in medians),
                       "references_ms": {k: [round(r[k], 4) for r in runs] for k in ("matmul", "copy")},
                       # does the model run slow in the processes where the fixed references run slow?
                       "correlation": {k: round(statistics.correlation([r[k] for r in runs], medians), 3)
                                       for k in ("matmul", "copy")}}
                result["rows"].append(row)
                print(f"{args.model} {dtype} spinning {'on ' if spinning else 'off'}: "
                      f"{', '.join(f'{m:.3f}' for m in medians)} (median {centre:.3f} ms, max dev {row['max_rel_dev']:.1%}); "
                      f"correlation with the matmul reference {row['correlation']['matmul']:+.2f}, "
                      f"with the copy {row['correlation']['copy']:+.2f}", flush=True)
    result["load_average_at_end"] = round(os.getloadavg()[0], 2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
