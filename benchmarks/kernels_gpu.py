"""GPU table: eager cuDNN vs torch.compile (default, max-autotune) for CropFollow NavNets, CUDA-event timing.

Runs on the device machine (PyTorch 2.x with CUDA, no qaopt install), so it is
self-contained: the NavNet below mirrors qaopt.simulators.cropfollow.nets
(backbone -> 3x3 conv 512 -> BN -> ReLU -> GAP -> FC 512->64 -> ReLU -> dropout -> FC->1),
with the backbone's width as a parameter so that pruned candidates (channels
cut uniformly, rounded to 8) can be built too. Weights are random: latency only.

Each model is measured in its own subprocess with a time limit, because one
max-autotune compile can hang (one with every GEMM backend enabled ran 10 minutes
on an H200); a timed-out or crashed
model is recorded as such and the others go on.

    python benchmarks/kernels_gpu.py --out $OUT        # writes kernels_gpu.json and prints a markdown table
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MODELS = {  # name: (backbone, width)
    "compact w16 (reference)": ("compact", 16),
    "compact w8 (50% pruned)": ("compact", 8),
    "compact w24": ("compact", 24),
    "resnet18 w64 (reference)": ("resnet18", 64),
    "resnet18 w32 (50% pruned)": ("resnet18", 32),
}


def build(backbone: str, width: int):
    import torch
    from torch import nn

    def cbr(i, o, s=1):
        return nn.Sequential(nn.Conv2d(i, o, 3, s, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))

    class Block(nn.Module):
        def __init__(self, i, o, s):
            super().__init__()
            self.c1, self.c2 = cbr(i, o, s), nn.Sequential(nn.Conv2d(o, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o))
            self.down = None if s == 1 and i == o else nn.Sequential(nn.Conv2d(i, o, 1, s, bias=False), nn.BatchNorm2d(o))

        def forward(self, x):
            return torch.relu(self.c2(self.c1(x)) + (x if self.down is None else self.down(x)))

    w = width
    if backbone == "compact":
        body = nn.Sequential(cbr(3, w, 2), cbr(w, 2 * w, 2), cbr(2 * w, 2 * w), cbr(2 * w, 4 * w, 2), cbr(4 * w, 4 * w),
                             cbr(4 * w, 8 * w, 2), cbr(8 * w, 8 * w), cbr(8 * w, 8 * w, 2))
        out = 8 * w
    else:
        stem = nn.Sequential(nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        layers, c = [], w
        for k, s in zip((1, 2, 4, 8), (1, 2, 2, 2)):
            layers += [Block(c, k * w, s), Block(k * w, k * w, 1)]
            c = k * w
        body, out = nn.Sequential(stem, *layers), c
    head = nn.Sequential(nn.Conv2d(out, 512, 3, padding=1, bias=False), nn.BatchNorm2d(512), nn.ReLU(inplace=True),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 64), nn.ReLU(inplace=True), nn.Dropout(0.3),
                         nn.Linear(64, 1))
    return nn.Sequential(body, head).eval()


def time_cuda(fn, x, warmup=20, repeats=50, number=20):
    """Median and IQR over ``repeats`` samples, each the mean of ``number`` calls timed with CUDA events."""
    import statistics

    import torch

    with torch.inference_mode():
        for _ in range(warmup):
            fn(x)
        torch.cuda.synchronize()
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(number):
                fn(x)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / number)
    q1, med, q3 = statistics.quantiles(samples, n=4)
    return statistics.median(samples), q3 - q1


MODES = ["default", "max-autotune"]


def one(name: str) -> dict:
    import torch

    backbone, width = MODELS[name]
    torch.manual_seed(0)
    model = build(backbone, width).cuda()
    x = torch.rand(1, 3, 240, 320, device="cuda")
    row = {"model": name, "params": sum(p.numel() for p in model.parameters()),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    torch.cuda.reset_peak_memory_stats()
    row["eager_ms"], row["eager_iqr_ms"] = time_cuda(model, x)
    row["eager_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    for mode in MODES:
        torch._dynamo.reset()
        compiled = torch.compile(model, mode=mode)
        start = time.perf_counter()
        with torch.inference_mode():
            compiled(x)
        torch.cuda.synchronize()
        row[f"{mode}_compile_s"] = time.perf_counter() - start
        row[f"{mode}_ms"], row[f"{mode}_iqr_ms"] = time_cuda(compiled, x)
        with torch.inference_mode():
            err = (compiled(x) - model(x)).abs().max().item()
        row[f"{mode}_max_abs_err"] = err
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--limit-s", type=float, default=150.0, help="time limit per model (all three routes)")
    parser.add_argument("--models", nargs="*", default=list(MODELS), help="names from MODELS")
    parser.add_argument("--modes", nargs="*", default=MODES, help="torch.compile modes to time beside eager")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    MODES[:] = args.modes
    if args.one:
        print(json.dumps(one(args.one)))
        return
    import torch  # noqa: F401 - imported before provenance(), which names the GPU torch sees
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()
    env = {**os.environ, "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS": "ATEN,TRITON",
           "TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS": "ATEN,TRITON"}
    rows = []
    for name in args.models:
        try:
            proc = subprocess.run([sys.executable, __file__, "--one", name, "--modes", *MODES], env=env, capture_output=True, text=True,
                                  timeout=args.limit_s)
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0
                        else {"model": name, "error": proc.stderr.strip().splitlines()[-1][:300]})
        except subprocess.TimeoutExpired:
            rows.append({"model": name, "error": f"timed out after {args.limit_s:.0f} s"})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "kernels_gpu.json").write_text(json.dumps({**prov, "rows": rows}, indent=1))
    print("| model | eager ms (IQR) | compile default ms | max-autotune ms (IQR) | max-autotune compile s | speedup vs eager |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | failed: {r['error']} | | | | |")
            continue
        default = f"{r['default_ms']:.3f}" if "default_ms" in r else "not run"
        print(f"| {r['model']} | {r['eager_ms']:.3f} ({r['eager_iqr_ms']:.3f}) | {default} | "
              f"{r['max-autotune_ms']:.3f} ({r['max-autotune_iqr_ms']:.3f}) | {r['max-autotune_compile_s']:.0f} | "
              f"{r['eager_ms'] / r['max-autotune_ms']:.2f}x |")
    if rows and "gpu" in rows[0]:
        print(f"\n{rows[0]['gpu']}, PyTorch {rows[0]['torch']}, batch 1, 3x240x320 fp32, CUDA events: "
              "median of 50 samples x 20 calls after 20 warm-up calls.")


if __name__ == "__main__":
    main()
