"""The cause of a 3x latency swing: intra-op pools as wide as the cores, beside other processes.

The compact NavNet at ``--threads`` threads: ONNX Runtime int8 (the QDQ graph
qaopt makes; spin-waiting off, as qaopt runs it, and on) and torch bf16, each
idle and beside one and two CPU-bound processes. Each is timed twice: by a bare
loop (a plain median, nothing else) and by qaopt's
measurement (pinned threads, interference probe, retries, the trust flag).
What to look for: the bare figure multiplies under load and says nothing; qaopt's
is flagged untrusted whenever the neighbours took the cores.

    .venv/bin/python benchmarks/latency_swing.py            # on an idle machine; prints a table, writes JSON
    .venv/bin/python benchmarks/latency_swing.py --quick    # fewer samples: shows it works
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "latency_swing.json"
INPUT_SHAPE = (1, 3, 240, 320)


def neighbours(count: int) -> list[subprocess.Popen]:
    """``count`` CPU-bound processes, unpinned, as real neighbours are."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    time.sleep(0.5)
    return procs


def bare_median(call, calls: int) -> float:
    """A plain protocol's view: a few warm-up calls, then the median of timed calls."""
    for _ in range(3):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    import numpy as np
    import onnxruntime as ort
    import torch

    from qaopt import kernels
    from qaopt.approx.quantize import quantize_int8
    from qaopt.simulators.cropfollow.nets import NavNet

    calls = 30 if args.quick else 300
    protocol = kernels.Protocol(repeats=7, min_sample_ms=5.0) if args.quick else kernels.Protocol()
    out = args.out or (Path(tempfile.gettempdir()) / "latency_swing.quick.json" if args.quick else OUT)
    x = np.random.default_rng(0).random(INPUT_SHAPE, dtype=np.float32)
    torch.manual_seed(0)
    net = NavNet("heading", "compact").eval()
    tmp = tempfile.TemporaryDirectory(prefix="qaopt-swing-")
    calibration = np.random.default_rng(0).random((16, *INPUT_SHAPE[1:]), dtype=np.float32)
    int8 = quantize_int8(net, torch.zeros(INPUT_SHAPE), calibration, Path(tmp.name) / "int8.onnx", "compact",
                         kernels.onnx)
    bf16 = NavNet("heading", "compact").eval()
    bf16.load_state_dict(net.state_dict())
    bf16 = bf16.to(torch.bfloat16)
    target = kernels.Target(threads=args.threads)

    def ort_call(spinning: bool):
        options = ort.SessionOptions()
        options.inter_op_num_threads, options.intra_op_num_threads = 1, args.threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        session = ort.InferenceSession(str(int8), options, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x}
        return lambda: session.run(None, feed)

    def torch_call():
        torch.set_num_threads(args.threads)
        xb = torch.from_numpy(x).to(torch.bfloat16)

        def call():
            with torch.inference_mode():
                bf16(xb)
        return call

    cases = {
        "onnxruntime int8 (spin off)": (lambda: ort_call(False), kernels.compile(int8, [x], target.with_backend("onnxruntime"))),
        "onnxruntime int8 (spin on)": (lambda: ort_call(True), None),
        "torch bf16": (torch_call, kernels.compile(bf16, [x], target.with_backend("torch"))),
    }
    rows = []
    for load in (0, 1, 2):
        procs = neighbours(load)
        try:
            for name, (bare, compiled) in cases.items():
                row = {"case": name, "neighbours": load, "bare_ms": bare_median(bare(), calls)}
                if compiled is not None:
                    m = compiled.measure(protocol)
                    row.update(qaopt_ms=m.median_ms, ci_ms=m.ci_ms, trusted=m.trusted, untrusted=m.untrusted,
                               interference=m.interference)
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    print(f"\n{kernels.host_cpu_info().model}, {args.threads} threads; ms per inference\n")
    print("| case | CPU-bound neighbours | bare loop (old) | qaopt median [95 % interval] | trusted |")
    print("|---|---|---|---|---|")
    for r in rows:
        qaopt = f"{r['qaopt_ms']:.3f} [{r['ci_ms'][0]:.3f}, {r['ci_ms'][1]:.3f}]" if "qaopt_ms" in r else "-"
        print(f"| {r['case']} | {r['neighbours']} | {r['bare_ms']:.3f} | {qaopt} | {r.get('trusted', '-')} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**prov, "threads": args.threads, "rows": rows},
                              indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
