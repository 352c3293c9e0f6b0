"""One table, one run: the CropFollow NavNets on every backend and dtype, on this CPU.

Compact and ResNet-18 NavNets (seeded random weights; timing does not depend on
training) x fp32 / bf16 / int8 x torch eager, torch-compile, ONNX Runtime,
OpenVINO, TVM untuned and TVM tuned, each compiled and measured by qaopt's own
path (``qaopt.kernels.compile`` then ``measure`` under the default protocol), each
cell in a fresh process of its own: measured in one process, a later cell ran on
top of the thread pools every earlier backend had left spinning (ONNX Runtime's
ResNet-18 fp32 took 25 ms there against 13 ms alone, torch 440-1080 ms), so a
cell's figure depended on the order of the columns. A cell holds the median with its
95 % interval (``*`` when the measurement was flagged untrusted), or why the backend
cannot run that dtype. TVM tuned states its trials and tuning seconds.

    .venv/bin/python benchmarks/latency_table.py                 # writes docs/benchmarks/latency_table.json
    .venv/bin/python benchmarks/latency_table.py --quick         # compact only, 8 tuning trials: shows it works

``--quick`` writes to a temporary file unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "latency_table.json"
INPUT_SHAPE = (1, 3, 240, 320)
DTYPES = ("fp32", "bf16", "int8")
COLUMNS = ("torch", "torch-compile", "onnxruntime", "openvino", "tvm untuned", "tvm tuned")


def models_of(backbone: str, folder: Path) -> dict[str, Path]:
    """The backbone's NavNet in each dtype, saved for the cells' processes: fp32 and bf16 torch modules, int8 QDQ ONNX."""
    import numpy as np
    import torch

    from qaopt import kernels
    from qaopt.approx.quantize import quantize_int8
    from qaopt.simulators.cropfollow.nets import NavNet

    torch.manual_seed(0)
    net = NavNet("heading", backbone).eval()
    calibration = np.random.default_rng(0).random((16, *INPUT_SHAPE[1:]), dtype=np.float32)
    int8 = quantize_int8(net, torch.zeros(INPUT_SHAPE), calibration, folder / f"{backbone}.int8.onnx", backbone,
                         kernels.onnx)
    bf16 = NavNet("heading", backbone).eval()
    bf16.load_state_dict(net.state_dict())
    paths = {"fp32": folder / f"{backbone}.fp32.pt", "bf16": folder / f"{backbone}.bf16.pt"}
    torch.save(net, paths["fp32"])
    torch.save(bf16.to(torch.bfloat16), paths["bf16"])
    return {**paths, "int8": Path(int8)}


def cell(model_path: str, column: str, target: Any, cache: Path) -> dict[str, Any]:
    """One backend's figure for one model, or the reason there is none (run in the cell's own process)."""
    import numpy as np
    import torch

    from qaopt import kernels

    model = model_path if model_path.endswith(".onnx") else torch.load(model_path, weights_only=False)
    backend, _, mode = column.partition(" ")
    if mode != "tuned":
        target = replace(target, tuning=kernels.TuningBudget())
    example = np.random.default_rng(0).random(INPUT_SHAPE, dtype=np.float32)
    try:
        compiled = kernels.compile(model, [example], target.with_backend(backend), cache_dir=cache)
        m = compiled.measure()
    except kernels.KernelsError as exc:
        return {"error": str(exc).splitlines()[0]}
    except Exception as exc:  # a crash in one backend is a cell's outcome, not the table's end
        return {"error": f"crashed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    out: dict[str, Any] = {"median_ms": m.median_ms, "ci_ms": m.ci_ms, "trusted": m.trusted, "untrusted": m.untrusted,
                           "compile_s": round(compiled.compile_seconds, 2)}
    tuning = getattr(compiled, "tuning", None)
    if tuning is not None:
        out["tuning"] = {"trials": tuning.trials, "tuning_s": round(tuning.tuning_s, 1), "chosen": tuning.chosen,
                         "stopped": tuning.stopped}
    return out


def cell_in_new_process(model: Path, column: str, args: argparse.Namespace, trials: int, cache: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", str(model), column, str(cache), "--threads", str(args.threads),
               "--tvm-trials", str(trials)] + (["--tvm-seconds", str(args.tvm_seconds)] if args.tvm_seconds else [])
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:  # the process died (a segfault in a runtime, out of memory): the cell says so
        last = out.stderr.strip().splitlines()[-1:] or [f"exit status {out.returncode}"]
        return {"error": f"crashed: the cell's process exited with {out.returncode}: {last[0]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(c: dict[str, Any]) -> str:
    if "error" in c:
        return "n/a"
    text = f"{c['median_ms']:.2f} [{c['ci_ms'][0]:.2f}, {c['ci_ms'][1]:.2f}]" + ("" if c["trusted"] else "*")
    if "tuning" in c:
        text += f" ({c['tuning']['trials']} trials, {c['tuning']['tuning_s']:.0f} s, {c['tuning']['chosen']})"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="compact NavNet only, 8 TVM tuning trials")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tvm-trials", type=int, default=256, help="TVM tuning budget per NN (trials)")
    parser.add_argument("--tvm-seconds", type=float, default=None, help="TVM tuning budget per NN (seconds)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "COLUMN", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    from qaopt import kernels

    backbones = ["compact"] if args.quick else ["compact", "resnet18"]
    trials = 8 if args.quick else args.tvm_trials
    if args.child:
        target = kernels.Target(threads=args.threads, tuning=kernels.TuningBudget(trials, args.tvm_seconds))
        print(json.dumps(cell(args.child[0], args.child[1], target, Path(args.child[2]))))
        return
    out = args.out or (Path(tempfile.gettempdir()) / "latency_table.quick.json" if args.quick else OUT)
    rows = []
    with tempfile.TemporaryDirectory(prefix="qaopt-table-") as tmp:
        for backbone in backbones:
            for dtype, model in models_of(backbone, Path(tmp)).items():
                cells = {}
                for column in COLUMNS:
                    cells[column] = cell_in_new_process(model, column, args, trials, Path(tmp) / "cache")
                    print(f"{backbone} {dtype} {column}: {show(cells[column])}"
                          + (f" ({cells[column]['error']})" if "error" in cells[column] else ""), flush=True)
                rows.append({"model": backbone, "dtype": dtype, "cells": cells})
    cpu = kernels.host_cpu_info()
    print(f"\n{cpu.model}, {args.threads} threads; ms per inference, median [95 % interval], * untrusted; "
          f"TVM tuned: trial budget {trials}" + (f", {args.tvm_seconds:.0f} s" if args.tvm_seconds else "") + "\n")
    print("| NN | dtype | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for row in rows:
        print(f"| {row['model']} | {row['dtype']} | " + " | ".join(show(row["cells"][c]) for c in COLUMNS) + " |")
    reasons = {f"{row['model']} {row['dtype']} {c}": row["cells"][c]["error"] for row in rows for c in COLUMNS
               if "error" in row["cells"][c]}
    if reasons:
        print("\nn/a:\n" + "\n".join(f"- {k}: {v}" for k, v in reasons.items()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**prov, "threads": args.threads, "tvm_trials": trials,
                               "tvm_seconds": args.tvm_seconds,
                               "versions": {c: kernels.backend_version(c.split()[0]) for c in COLUMNS},
                               "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
