"""What the in-graph resize of a scaled int8 candidate costs, op by op, on OpenVINO's or ONNX Runtime's CPU backend.

    python benchmarks/resize_cost.py --cache-dir <a run's cache> --candidate LABEL=KEY ... [--threads 2]
        [--repeats 300] [--backend openvino|onnxruntime] --json docs/benchmarks/resize_cost.json

A scaled candidate resizes the full frame inside its graph (``qaopt.approx.resolution``), so its latency includes
the resize. For each candidate (``LABEL=KEY``: a key under ``<cache>/approx/candidates/``, as ``result.json``'s
``candidate`` fields name them) this compiles its int8 ONNX graph with ``--threads`` inference threads and per-op
profiling, times ``--repeats`` single-frame inferences after a warm-up, and records the median and the five costliest
ops, with the time of all ops together (``ops_ms``; the median's rest is the call itself: handing the frame over,
scheduling, synchronising). OpenVINO: its own profile of the last inference (real time, op type, kernel), the frame
handed over in place as qaopt's backend does (``kernels.openvino_backend.ZERO_COPY``) and, as
``median_copied_ms``, by the Python API's default, which copies the frame in and the outputs out. ONNX Runtime:
its profiler's kernel times over every inference, summed per op type and divided by the inferences (time a frame, op
type, node count).
Writes ``--json``: the machine, the date, the command and one row per candidate.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import numpy as np


WARMUP = 50
FRAME = np.random.default_rng(0).random((1, 3, 240, 320), dtype=np.float32)


def median_ms(infer, repeats: int) -> float:
    """The median of ``repeats`` timed calls of ``infer`` after :data:`WARMUP` untimed ones, in ms."""
    for _ in range(WARMUP):
        infer()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        infer()
        seconds.append(time.perf_counter() - start)
    return round(float(np.median(seconds)) * 1e3, 4)


def profile_openvino(path: Path, threads: int, repeats: int) -> dict:
    import openvino as ov

    from qaopt.kernels.openvino_backend import ZERO_COPY

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU",
                                  {"INFERENCE_NUM_THREADS": threads, "PERF_COUNT": "YES"})
    request = compiled.create_infer_request()
    copied = median_ms(lambda: request.infer({0: FRAME}), repeats)
    median = median_ms(lambda: request.infer({0: FRAME}, **ZERO_COPY), repeats)
    ops = sorted(((p.real_time.total_seconds() * 1e3, p.node_type, p.exec_type) for p in request.profiling_info),
                 reverse=True)
    return {"median_ms": median, "median_copied_ms": copied, "ops_ms": round(sum(ms for ms, _, _ in ops), 4),
            "ops": len(ops),
            "costliest_ops": [{"ms": round(ms, 4), "op": op, "kernel": kernel} for ms, op, kernel in ops[:5]],
            "resize_ms": round(sum(ms for ms, op, _ in ops if op == "Interpolate"), 4)}


def profile_onnxruntime(path: Path, threads: int, repeats: int) -> dict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.enable_profiling = threads, 1, True
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: FRAME}
    median = median_ms(lambda: session.run(None, feed), repeats)
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    us, nodes = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            us[e["args"]["op_name"]] += e["dur"]
            nodes[e["args"]["op_name"]] += 1
    runs = WARMUP + repeats
    ops = [(us[op] / runs / 1e3, op, nodes[op] // runs) for op in us]
    ops.sort(reverse=True)
    return {"median_ms": median, "ops_ms": round(sum(ms for ms, _, _ in ops), 4), "ops": sum(n for _, _, n in ops),
            "costliest_ops": [{"ms": round(ms, 4), "op": op, "nodes": n} for ms, op, n in ops[:5]],
            "resize_ms": round(sum(ms for ms, op, _ in ops if op == "Resize"), 4)}


PROFILERS = {"openvino": profile_openvino, "onnxruntime": profile_onnxruntime}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-dir", type=Path, required=True)
    ap.add_argument("--candidate", nargs="+", required=True, help="LABEL=KEY, e.g. 'merged 0.75 int8=4b463de1fee4e8ad'")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--backend", choices=sorted(PROFILERS), default="openvino")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    record = provenance()

    rows = []
    for item in args.candidate:
        label, _, key = item.rpartition("=")
        path = args.cache_dir / "approx" / "candidates" / key / "model.int8.onnx"
        if not path.is_file():
            sys.exit(f"--candidate {item}: no int8 graph at {path}")
        row = {"label": label, "candidate": key, **PROFILERS[args.backend](path, args.threads, args.repeats)}
        print(f"{label}: {row['median_ms']} ms, its ops {row['ops_ms']} ms, resize {row['resize_ms']} ms", flush=True)
        rows.append(row)
    out = {**record, "backend": args.backend, "threads": args.threads, "repeats": args.repeats, "rows": rows}
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
