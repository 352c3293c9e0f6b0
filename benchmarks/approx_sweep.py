"""Pruning ratio x dtype for each CropFollow NN: error, MACs, parameters and real latency on this CPU.

    .venv/bin/python benchmarks/approx_sweep.py --spec examples/cropfollow.yaml

Every candidate is built with qaopt.approx.build (pruned in steps with distillation
between them, then quantized) and cached; latency is batch 1, 2 threads, median of
repeated runs after warm-up, all candidates of an NN timed in interleaved rounds so
that load from other jobs on this shared machine hits them alike. torch eager runs
fp32 and bf16 under ``inference_mode``; int8 runs on ONNX Runtime (the route with
integer kernels here, docs/quantization.md), beside ONNX Runtime fp32 for reference.
``--stand-in`` (or a spec whose NNs do not load) uses a NavNet-shaped model trained
on synthetic images instead, and says so.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from qaopt.app_spec import content_hash, load
from qaopt.app_spec.errors import QaoptError
from qaopt.approx import FinetuneRecipe, Knobs, TargetNN, build
from qaopt.kernels import Protocol, measure_interleaved, torch_threads
from qaopt.kernels.onnx import INPUT_NAME as INPUT, export_onnx, ort_session
from qaopt.kernels import onnx as onnx_toolchain

from approx_navnet import stand_in


def spec_target(spec, name: str) -> TargetNN:
    """The spec's NN. A dataset that carries the recipe it was generated from (CropFollow's
    ``meta``) is keyed by that recipe, so that candidates fine-tuned on a GPU machine
    (which renders its own copy of the images) are found in the cache here.
    """
    target = TargetNN.from_spec(name, spec.nns[name])
    meta = getattr(target.data, "meta", None)
    if meta is not None and not hasattr(target.data, "fingerprint"):
        target.data.fingerprint = content_hash("dataset recipe", meta)
    return target


def targets(args: argparse.Namespace) -> tuple[list[TargetNN], str]:
    if not args.stand_in:
        try:
            spec = load(args.spec)
            return [spec_target(spec, name) for name in args.nns], f"{args.spec} (trained reference NNs)"
        except (QaoptError, ImportError, AttributeError) as exc:
            print(f"<!-- the spec's NNs did not load ({exc}); using the stand-in -->")
    return [stand_in(name, args.cache_dir) for name in args.nns], "stand-in NavNet-shaped NNs trained on synthetic row images (NOT the CropFollow NNs)"


def timings(cands: dict[tuple[float, str], object], shape: tuple[int, ...], threads: int, repeat: int, rounds: int, folder: Path) -> dict[tuple[float, str], float]:
    """Median ms per (ratio, route): torch fp32, torch bf16, ORT fp32, ORT int8."""
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    runs = {}
    for (ratio, dtype), cand in cands.items():
        if dtype == "int8":
            session = ort_session(cand.onnx_path, threads)
            runs[(ratio, "ORT int8")] = lambda s=session: s.run(None, {INPUT: x})
            fp32 = export_onnx(cands[(ratio, "fp32")].module, [torch.zeros(shape)], folder / f"{ratio}.onnx")
            session32 = ort_session(fp32, threads)
            runs[(ratio, "ORT fp32")] = lambda s=session32: s.run(None, {INPUT: x})
        else:
            xt = torch.from_numpy(x).to(next(cand.module.parameters()).dtype)
            runs[(ratio, f"torch {dtype}")] = lambda m=cand.module, xt=xt: m(xt)
    with torch_threads(threads), torch.inference_mode():
        measured = measure_interleaved(runs, rounds=rounds, protocol=Protocol(warmup=2, repeats=max(3, repeat // rounds)),
                                       threads=threads)
        return {key: m.median_ms for key, m in measured.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=Path("examples/cropfollow.yaml"))
    ap.add_argument("--nns", nargs="+", default=["heading", "distance"])
    ap.add_argument("--ratios", default="0,0.25,0.5,0.75,0.9,0.95")
    ap.add_argument("--dtypes", default="fp32,bf16,int8")
    ap.add_argument("--prune-steps", type=int, default=2)
    ap.add_argument("--finetune-steps", type=int, default=120)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--threads", default="1,2", help="thread counts to time with (comma-separated; the first is plotted)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--cache-dir", type=Path, default=Path(".qaopt-cache"))
    ap.add_argument("--plot", type=Path, default=Path("docs/benchmarks/approx_sweep.png"))
    ap.add_argument("--stand-in", action="store_true")
    ap.add_argument("--device", default="cpu", help="where fine-tuning runs (cuda on a GPU machine)")
    ap.add_argument("--build-only", action="store_true", help="build and cache the candidates, print their errors, time nothing")
    args = ap.parse_args()
    ratios = [float(r) for r in args.ratios.split(",")]
    dtypes = args.dtypes.split(",")
    recipe = FinetuneRecipe(batch_size=args.batch_size, lr=args.lr)
    threads = [int(t) for t in args.threads.split(",")]
    torch.set_num_threads(threads[0])

    nns, source = targets(args)
    print(f"# approx sweep: pruning ratio x dtype — {source}\n")
    print(f"Pruning in {args.prune_steps} steps, {args.finetune_steps} distillation steps in all (batch {recipe.batch_size}, "
          f"lr {recipe.lr}); int8 = ONNX Runtime static QDQ. Latency: batch 1, threads {args.threads}, median of "
          f"~{args.repeat} runs per route in {args.rounds} interleaved rounds after warm-up.\n")
    results = {}
    for target in nns:
        cands, built = {}, 0.0
        for ratio in ratios:
            for dtype in ["fp32", *[d for d in dtypes if d != "fp32"]]:
                knobs = Knobs(prune_ratio=ratio, prune_steps=args.prune_steps if ratio else 1, finetune_steps=args.finetune_steps if ratio else 0, dtype=dtype)
                t0 = time.perf_counter()
                cand = build(target, knobs, cache_dir=args.cache_dir, recipe=recipe, device=args.device, onnx=onnx_toolchain, progress=lambda m, n=target.name, r=ratio, d=dtype: print(f"<!-- {n} {r} {d}: {m} -->", flush=True))
                built += time.perf_counter() - t0
                cands[(ratio, dtype)] = cand
        if args.build_only:
            print(f"\n{target.name}: built in {built:.0f} s; " + ", ".join(f"{r:g}/{d}: {c.error:.4g}" for (r, d), c in cands.items()))
            continue
        with tempfile.TemporaryDirectory() as tmp:
            ms = {t: timings(cands, target.input_shape, t, args.repeat, args.rounds, Path(tmp)) for t in threads}
        results[target.name] = (cands, ms[threads[0]])
        report(target, ratios, dtypes, cands, ms)
        cache_check(target, max(cands.values(), key=lambda c: c.build_seconds), args, recipe)
    if results:
        plot(results, ratios, threads[0], args.plot)


def report(target: TargetNN, ratios: list[float], dtypes: list[str], cands: dict, ms_by_threads: dict) -> None:
    base = cands[(ratios[0], "fp32")]
    print(f"\n## {target.name} ({base.metric} error on {len(target.data.x_val)} validation images; unpruned fp32 error {base.error:.4g})\n")
    others = [d for d in dtypes if d != "fp32"]
    head = ["ratio", "MMACs", "kparams", "ideal speedup (MACs)", "fp32 error", "x err", *[f"{d} error" for d in others]]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for ratio in ratios:
        fp32 = cands[(ratio, "fp32")]
        row = [f"{ratio:g}", f"{fp32.macs / 1e6:.0f}", f"{fp32.params / 1e3:.0f}", f"{base.macs / fp32.macs:.2f}x", f"{fp32.error:.4g}", f"{fp32.error / base.error:.2f}"]
        print("| " + " | ".join(row + [f"{cands[(ratio, d)].error:.4g}" for d in others]) + " |")
    routes = ["torch fp32", *(["torch bf16"] if "bf16" in dtypes else []), *(["ORT fp32", "ORT int8"] if "int8" in dtypes else [])]
    for threads, ms in ms_by_threads.items():
        base_ms = ms[(ratios[0], "torch fp32")]
        print(f"\n{target.name}, latency with {threads} thread(s), ms (speedups against ratio {ratios[0]:g} in torch eager fp32):\n")
        head = ["ratio", *routes, "torch fp32 speedup", "% of ideal", "best route", "best speedup"]
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for ratio in ratios:
            ideal = base.macs / cands[(ratio, "fp32")].macs
            speed = base_ms / ms[(ratio, "torch fp32")]
            best = min(routes, key=lambda r: ms[(ratio, r)])
            row = [f"{ratio:g}", *[f"{ms[(ratio, r)]:.2f}" for r in routes], f"{speed:.2f}x",
                   f"{100 * (speed - 1) / (ideal - 1):.0f} %" if ideal > 1.01 else "-", best, f"{base_ms / ms[(ratio, best)]:.2f}x"]
            print("| " + " | ".join(row) + " |")
    print("\n`% of ideal` = (speedup - 1) / (MACs ratio - 1): how much of the MACs reduction torch eager fp32 turns into time.")


def cache_check(target: TargetNN, cand, args: argparse.Namespace, recipe: FinetuneRecipe) -> None:
    t0 = time.perf_counter()
    again = build(target, cand.knobs, cache_dir=args.cache_dir, recipe=recipe, onnx=onnx_toolchain)
    cached = time.perf_counter() - t0
    print(f"\nCache: rebuilding {target.name} {cand.knobs.dtype} at ratio {cand.knobs.prune_ratio:g} took "
          f"{cached * 1e3:.0f} ms from the cache (from_cache={again.from_cache}) against {cand.build_seconds:.1f} s "
          f"to build it: {cand.build_seconds / cached:.0f}x faster.")


def plot(results: dict, ratios: list[float], threads: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(6 * len(results), 8), squeeze=False)
    for col, (name, (cands, ms)) in enumerate(results.items()):
        base = cands[(ratios[0], "fp32")]
        ax = axes[0][col]
        for route in sorted({r for (_, r) in ms}):
            ax.plot(ratios, [ms[(r, route)] for r in ratios], "o-", label=route)
        base_ms = ms[(ratios[0], "torch fp32")]
        ax.plot(ratios, [base_ms * cands[(r, "fp32")].macs / base.macs for r in ratios], "k--", label="torch fp32 ideal (MACs)")
        ax.set(title=f"{name}: latency", xlabel="pruning ratio", ylabel=f"ms (batch 1, {threads} threads)", yscale="log")
        ax.legend(fontsize=8)
        ax = axes[1][col]
        for dtype in sorted({d for (_, d) in cands}):
            ax.plot(ratios, [cands[(r, dtype)].error for r in ratios], "o-", label=dtype)
        ax.set(title=f"{name}: validation error", xlabel="pruning ratio", ylabel=f"{base.metric} error")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"\nPlot: {path}")


if __name__ == "__main__":
    main()
