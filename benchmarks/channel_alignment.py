"""Pruned widths against the CPU's int8 and bf16 kernels: does a pruned NN's channel count decide its latency?

CropFollow's default run on the 2-core Xeon (AVX-512 VNNI, AMX) timed its merged int8 NN
at full input 0.75 ms unpruned and 0.85-0.89 ms pruned 5-35 % (``round_to: 8``,
docs/benchmarks/knobs_default/cropfollow-session49-xeon/report.md): fewer MACs, more
time. Vector and matrix int8 kernels work on blocks of 16 to 64 channels; a layer of 24 or
40 channels pays for the block it fills partly, and may leave the fast path. This script
prunes the compact NavNet (seeded random weights: timing needs shapes, not training) at
each ratio with each ``round_to``, through qaopt's own pruning pass, and times each in
int8 (QDQ ONNX, qaopt's quantizer) and bf16 on OpenVINO and ONNX Runtime, each cell in a
fresh process of its own (``knobs.py``'s cell: ``qaopt.kernels.compile(...).measure()``,
untuned, 2 threads, the full 240x320 frame).

    .venv/bin/python benchmarks/channel_alignment.py            # docs/benchmarks/channel_alignment.json
    .venv/bin/python benchmarks/channel_alignment.py --quick    # two models, int8 on OpenVINO (temp file)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from knobs import cell_in_new_process, show, versions  # noqa: E402 - the cells' own process protocol

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "channel_alignment.json"
INPUT_SHAPE = (1, 3, 240, 320)
RATIOS = (0.0, 0.1, 0.2, 0.35, 0.5)
ROUND_TO = (8, 16, 32)
CELLS = (("int8", "openvino"), ("int8", "onnxruntime"), ("bf16", "openvino"))


def pruned(ratio: float, round_to: int):
    """The compact NavNet pruned by qaopt's pass: the module, its per-layer widths and MACs."""
    import torch
    import torch_pruning as tp

    from qaopt.approx import Knobs
    from qaopt.approx.pruning import channel_counts, prune
    from qaopt.simulators.cropfollow.nets import NavNet

    torch.manual_seed(0)
    net = NavNet("heading", "compact").eval()
    example = torch.zeros(INPUT_SHAPE)
    if ratio > 0:
        prune(net, example, Knobs(prune_ratio=ratio, round_to=round_to, prune_steps=1), "heading")
    macs, _ = tp.utils.count_ops_and_params(net, example)
    return net.eval(), sorted(set(channel_counts(net).values())), int(macs)


def model_file(net, dtype: str, path: Path) -> Path:
    """What a cell loads: the int8 QDQ graph from qaopt's quantizer, or a bf16 copy of the module saved whole."""
    import copy

    import numpy as np
    import torch

    from qaopt import kernels
    from qaopt.approx.quantize import quantize_int8

    if dtype == "int8":
        calibration = np.random.default_rng(0).random((16, *INPUT_SHAPE[1:]), dtype=np.float32)
        return Path(quantize_int8(net, torch.zeros(INPUT_SHAPE), calibration, path.with_suffix(".onnx"), "heading",
                                  kernels.onnx))
    torch.save(copy.deepcopy(net).to(torch.bfloat16), path.with_suffix(".pt"))
    return path.with_suffix(".pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="ratios 0 and 0.35 at round_to 8, int8 on OpenVINO")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    record = provenance()

    out = args.out or (Path(tempfile.gettempdir()) / "channel_alignment.quick.json" if args.quick else OUT)
    ratios, rounds, cells = ((0.0, 0.35), (8,), CELLS[:1]) if args.quick else (RATIOS, ROUND_TO, CELLS)
    load_before, t0 = os.getloadavg(), time.perf_counter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="qaopt-alignment-") as tmp:
        folder, cache = Path(tmp), Path(tmp) / "kernels"
        for round_to in rounds:
            for ratio in ratios:
                if ratio == 0 and round_to != rounds[0]:
                    continue  # unpruned: the same model whatever round_to
                net, widths, macs = pruned(ratio, round_to)
                row: dict[str, Any] = {"prune_ratio": ratio, "round_to": round_to if ratio else None,
                                       "widths": widths, "mmacs": round(macs / 1e6, 1), "latency": {}}
                for dtype, backend in cells:
                    model = model_file(net, dtype, folder / f"r{ratio}-k{round_to}-{dtype}")
                    row["latency"][f"{dtype} {backend}"] = c = cell_in_new_process(
                        model, backend, INPUT_SHAPE, args.threads, cache)
                    print(f"ratio {ratio} round_to {round_to} widths {widths} {dtype} {backend}: {show(c)}",
                          flush=True)
                rows.append(row)
    load = lambda xs: " / ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    result = {
        **record,
        "threads": args.threads,
        "wall_s": round(time.perf_counter() - t0, 1),
        "notes": [f"load average (1 / 5 / 15 min) {load(load_before)} before, {load(os.getloadavg())} after",
                  "widths: the distinct output-channel counts of the pruned layers (the heads' outputs never "
                  "pruned); each cell its own process, untuned, median [95 % interval], * untrusted"],
        "versions": versions(),
        "rows": rows,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
