"""Does a sub-millisecond NN's latency depend on the process it is measured in, and does ONNX Runtime's spinning matter? (issue #16)

    .venv/bin/python benchmarks/latency_modes.py [--processes 12] [--model compact] [--out FILE.json]

The repeatability benchmark (``latency_repeatability.py``) found the compact NavNet's
per-process medians split into two modes 10-20 % apart, in different rows from run to run,
while each process's own interval is tight. qaopt's ONNX Runtime sessions do not spin
(``session.intra_op.allow_spinning = 0``, see ``qaopt.kernels.onnx.ort_session``): a sleeping
pool thread must be woken for every parallel operator, which costs most when the operators are
short. This script measures the same ONNX files in ``--processes`` fresh processes each, with
spinning off (qaopt's setting) and on, by a plain timing loop (2 threads, the process pinned to
the first 2 cores, 50 warm-up runs, median of 300), so that the per-process spread of the two
settings can be compared directly. It measures; it does not change qaopt.
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


def child(onnx: str, spinning: bool) -> float:
    """One process's median latency in ms."""
    import numpy as np
    import onnxruntime as ort

    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:THREADS])
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
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, metavar=("ONNX", "SPINNING"), help=argparse.SUPPRESS)
    ap.add_argument("--processes", type=int, default=12)
    ap.add_argument("--model", default="compact", choices=["compact", "resnet18"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.child:
        print(child(args.child[0], args.child[1] == "1"))
        return
    import torch

    from qaopt import kernels

    result: dict = {"machine": f"{os.cpu_count()} cores", "load_average_at_start": round(os.getloadavg()[0], 2),
                    "threads": THREADS, "rows": []}
    with tempfile.TemporaryDirectory(prefix="qaopt-modes-") as tmp:
        models = build_models(Path(tmp), [args.model])
        fp32_onnx = Path(tmp) / f"{args.model}.onnx"
        kernels.export_onnx(torch.load(models[(args.model, "fp32")], weights_only=False), (torch.zeros(INPUT_SHAPE),),
                            fp32_onnx)
        files = {"fp32": str(fp32_onnx), "int8": models[(args.model, "int8")]}
        for dtype, onnx in files.items():
            for spinning in (False, True):
                medians = []
                for _ in range(args.processes):
                    out = subprocess.run([sys.executable, __file__, "--child", onnx, "1" if spinning else "0"],
                                         capture_output=True, text=True, check=True)
                    medians.append(round(float(out.stdout.strip().splitlines()[-1]), 4))
                centre = statistics.median(medians)
                row = {"model": args.model, "dtype": dtype, "spinning": spinning, "medians_ms": medians,
                       "median_of_medians_ms": centre, "max_rel_dev": max(abs(m - centre) / centre for m in medians)}
                result["rows"].append(row)
                print(f"{args.model} {dtype} spinning {'on ' if spinning else 'off'}: "
                      f"{', '.join(f'{m:.3f}' for m in medians)} (median {centre:.3f} ms, max dev {row['max_rel_dev']:.1%})",
                      flush=True)
    result["load_average_at_end"] = round(os.getloadavg()[0], 2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
