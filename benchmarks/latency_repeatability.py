"""Is a latency repeatable across processes, and flagged when a loaded machine disturbs it?

The compact and ResNet-18 NavNets (seeded random weights: every process builds the
same ones), fp32 and int8 (the static QDQ graph qaopt's quantization makes), on
ONNX Runtime and OpenVINO, each measured in ``--processes`` separate processes
through qaopt's own measurement path (``qaopt.kernels.measure_model``, the default
protocol: pinned threads, warm-up until stable, interference probe, retries):

- idle: every median should lie within +-10 % of the median of medians;
- loaded: the same with a CPU-bound process started beside each measurement; each
  measurement should lie within +-15 % of the idle median of medians, or be
  flagged untrusted (never silently off).

Run it on an idle machine (the loaded half starts its own load)::

    .venv/bin/python benchmarks/latency_repeatability.py            # writes docs/benchmarks/latency_repeatability.json
    .venv/bin/python benchmarks/latency_repeatability.py --quick    # compact only, 2 processes: shows it works

``--quick`` writes to a temporary file unless ``--out`` is given, so its figures never
land in the docs.
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
OUT = ROOT / "docs" / "benchmarks" / "latency_repeatability.json"
IDLE_TOLERANCE = 0.10
LOADED_TOLERANCE = 0.15
INPUT_SHAPE = (1, 3, 240, 320)


def build_models(folder: Path, backbones: list[str]) -> dict[tuple[str, str], str]:
    """The fp32 module (saved) and int8 QDQ ONNX of each backbone, written once for every measuring process."""
    import numpy as np
    import torch

    from qaopt import kernels
    from qaopt.approx.quantize import quantize_int8
    from qaopt.simulators.cropfollow.nets import NavNet

    models = {}
    for backbone in backbones:
        torch.manual_seed(0)
        net = NavNet("heading", backbone).eval()
        fp32 = folder / f"{backbone}.pt"
        torch.save(net, fp32)
        calibration = np.random.default_rng(0).random((16, *INPUT_SHAPE[1:]), dtype=np.float32)
        int8 = quantize_int8(net, torch.zeros(INPUT_SHAPE), calibration, folder / f"{backbone}.int8.onnx", backbone,
                             kernels.onnx)
        models[(backbone, "fp32")], models[(backbone, "int8")] = str(fp32), str(int8)
    return models


def measure_in_this_process(model: str, backend: str, threads: int) -> dict:
    """One measurement by qaopt's path, as JSON (the child process's whole job)."""
    import numpy as np
    import torch

    from qaopt import kernels

    loaded = model if model.endswith(".onnx") else torch.load(model, weights_only=False)
    example = np.random.default_rng(0).random(INPUT_SHAPE, dtype=np.float32)
    m = kernels.measure_model(kernels.Workload(loaded, (example,)), kernels.Target(threads=threads, backend=backend))
    return {"median_ms": m.measurement.median_ms, "ci_ms": m.measurement.ci_ms, "trusted": m.measurement.trusted,
            "untrusted": m.measurement.untrusted, "interference": m.measurement.interference}


def measure_in_new_process(model: str, backend: str, threads: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", model, backend, str(threads)], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{backend} on {model} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_bound() -> subprocess.Popen:
    """A process that keeps one core busy (unpinned: the scheduler puts it where it likes, as a real neighbour)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "BACKEND", "THREADS"), help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="compact NavNet only, 2 processes each")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backends", nargs="+", default=["onnxruntime", "openvino"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.child:
        model, backend, threads = args.child
        print(json.dumps(measure_in_this_process(model, backend, int(threads))))
        return
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()
    backbones = ["compact"] if args.quick else ["compact", "resnet18"]
    processes = 2 if args.quick else args.processes
    out = args.out or (Path(tempfile.gettempdir()) / "latency_repeatability.quick.json" if args.quick else OUT)
    result: dict = {**prov, "idle": [], "loaded": []}
    with tempfile.TemporaryDirectory(prefix="qaopt-repeat-") as tmp:
        models = build_models(Path(tmp), backbones)
        for (backbone, dtype), model in models.items():
            for backend in args.backends:
                label = {"model": backbone, "dtype": dtype, "backend": backend, "threads": args.threads}
                idle = [measure_in_new_process(model, backend, args.threads) for _ in range(processes)]
                medians = [r["median_ms"] for r in idle]
                centre = statistics.median(medians)
                result["idle"].append({**label, "medians_ms": medians, "trusted": [r["trusted"] for r in idle],
                                       "untrusted": [r["untrusted"] for r in idle],
                                       "max_rel_dev": max(abs(m - centre) / centre for m in medians),
                                       "within_10pct": all(abs(m - centre) <= IDLE_TOLERANCE * centre for m in medians)})
                loaded = []
                for _ in range(processes):
                    neighbour = cpu_bound()
                    time.sleep(0.5)
                    try:
                        loaded.append(measure_in_new_process(model, backend, args.threads))
                    finally:
                        neighbour.kill()
                        neighbour.wait()
                devs = [abs(r["median_ms"] - centre) / centre for r in loaded]
                result["loaded"].append({
                    **label, "idle_median_ms": centre, "medians_ms": [r["median_ms"] for r in loaded],
                    "trusted": [r["trusted"] for r in loaded], "untrusted": [r["untrusted"] for r in loaded],
                    "max_rel_dev": max(devs), "flagged": any(not r["trusted"] for r in loaded),
                    # the goal: each measurement within 15 % of the idle figure, or flagged untrusted
                    "ok": all(d <= LOADED_TOLERANCE or not r["trusted"] for d, r in zip(devs, loaded, strict=True)),
                })
                shown = ", ".join(f"{r['median_ms']:.3f}" + ("" if r["trusted"] else "*") for r in loaded)
                calm = ", ".join(f"{r['median_ms']:.3f}" + ("" if r["trusted"] else "*") for r in idle)
                print(f"{backbone} {dtype} {backend}: idle {calm} "
                      f"(max dev {result['idle'][-1]['max_rel_dev']:.1%}); loaded {shown} "
                      f"(max dev {max(devs):.1%}, * untrusted)", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
