"""CPU table for the CropFollow NNs: vendor backends vs TVM untuned vs TVM survey-tuned, and tuning-cost figures.

    .venv/bin/python benchmarks/kernels_cpu.py --rounds 4 --per-task 4

1. Both CropFollow NNs (NavNet, compact backbone, 1x3x240x320, random weights: latency only),
   2 threads: torch eager, torch channels-last, ONNX Runtime fp32, TVM untuned; FLOPs (TVM's
   estimate), GFLOP/s and share of the CPU's fp32 peak (qaopt.kernels.tuning.cpu_peak_gflops).
2. TVM tuned for the heading NN: survey tuning run to the full budget (``--rounds`` rounds of
   ``--per-task`` trials per task) with the early stop disabled, the model measured after every
   round; the figures at round 1 and at the end are the two budgets. Where the early stop
   (min_gain 5 %) would have stopped is read off the same round history (the rule is a pure
   function of it: qaopt.kernels.tuning.stop_reason), so ``--report-only`` re-reads it from the
   recorded JSON after a change of the rule.
3. The distance NN has the same layer shapes: it is compiled against the shared database.
4. Shared-database hit rate over 10 pruned heading candidates (per-layer keep ratios drawn from
   {0.5, 0.75, 1.0}, channels rounded to 8, seed 0), each tuning only its cold tasks, 1 trial each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch
from torch import nn

from qaopt.kernels import Protocol, Target, get_backend
from qaopt.kernels import tuning as tu
from qaopt.kernels.tvm_backend import TvmCompiled
from qaopt.kernels.tvm_build import build, prepare, tvm_target
from qaopt.simulators.cropfollow.nets import NavNet

FINAL = Protocol(warmup=5, repeats=15, min_sample_ms=50.0, max_seconds=30.0)
QUICK = Protocol(warmup=1, repeats=5, min_sample_ms=10.0, max_seconds=10.0)


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def pruned_navnet(seed: int) -> nn.Module:
    """A compact NavNet whose backbone channels are cut per layer (keep 0.5/0.75/1.0, rounded to 8)."""
    rng = random.Random(seed)
    net = NavNet(target="heading", backbone="compact").eval()
    convs = [m for m in net.backbone.modules() if isinstance(m, nn.Conv2d)]
    widths = [max(8, round(c.out_channels * rng.choice((0.5, 0.75, 1.0)) / 8) * 8) for c in convs]
    layers, c_in = [], 3
    for conv, w in zip(convs, widths):
        layers.append(nn.Sequential(nn.Conv2d(c_in, w, 3, conv.stride, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True)))
        c_in = w
    net.backbone = nn.Sequential(*layers)
    net.head[0] = nn.Conv2d(c_in, 512, 3, padding=1, bias=False)
    return net.eval()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--per-task", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache", default=".qaopt-cache/bench-kernels")
    p.add_argument("--json", default=".qaopt-cache/bench-kernels/kernels_cpu.json")
    p.add_argument("--nns", nargs="*", default=["heading", "distance"], help="CropFollow NNs for the table")
    p.add_argument("--pruned", type=int, default=10, help="pruned candidates for the hit rate (0: skip)")
    p.add_argument("--report-only", action="store_true",
                   help="print the tables of the recorded --json again (the early-stop column is recomputed)")
    args = p.parse_args()
    if args.report_only:
        report_markdown(json.loads(Path(args.json).read_text()))
        return
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()
    torch.manual_seed(0)
    x = torch.rand(1, 3, 240, 320)
    target = Target(threads=args.threads)
    peak = tu.cpu_peak_gflops(args.threads)
    db = tu.TuningDatabase.for_target(tvm_target(target), None, Path(args.cache) / "tvm-tuning")
    results: dict = {**prov, "peak_gflops": peak, "threads": args.threads}

    rows = []
    for name in args.nns:
        model = NavNet(target=name, backbone="compact").eval()
        prepared = prepare(model, [x], target)
        flops = tu.model_flops(prepared.mod)
        for backend in ("torch", "torch[channels_last]", "onnxruntime", "tvm"):
            start = time.perf_counter()
            m = get_backend(backend, cache_dir=args.cache).compile(model, [x], target).measure(FINAL)
            rows.append({"nn": name, "route": backend if backend != "tvm" else "tvm untuned", "median_ms": m.median_ms,
                         "iqr_ms": m.spread_ms, "flops": flops, "tuning_s": 0.0, "compile_s": time.perf_counter() - start,
                         "peak_mem_mib": (m.peak_mem_bytes or 0) / 2**20})
            log(rows[-1])

        def evaluate(database, prepared=prepared) -> float:
            return TvmCompiled(build(prepared, database), prepared, [x], target).measure(QUICK).median_ms

        with db.lock:
            database = db.open()
        tasks = __import__("tvm").s_tir.meta_schedule.relax_integration.extract_tasks(prepared.mod, prepared.target)
        cold = [t for t in tasks if not db.known(database, t)]
        if name == "heading" and cold:
            tuner = tu.SurveyTuner(db, round_trials_per_task=args.per_task, min_gain=0.0)
            report, database = tuner.tune(prepared, evaluate, trials=args.rounds * args.per_task * len(cold), seconds=None,
                                          runner=tu.local_runner(target.device_key), threads=args.threads)
            results["survey"] = report.to_dict()
            log(report.to_dict())
            for label, upto in (("round 1", 1), (f"round {len(report.rounds)} (full)", len(report.rounds))):
                rnd = report.rounds[upto - 1]
                best_db = database if upto == len(report.rounds) else None
                # the latency after round k as measured during tuning (QUICK protocol); the full budget is re-measured
                ms = (TvmCompiled(build(prepared, best_db), prepared, [x], target).measure(FINAL).median_ms
                      if best_db is not None else rnd.latency_ms)
                rows.append({"nn": name, "route": f"tvm tuned, {rnd.trials} trials ({label})", "median_ms": ms, "iqr_ms": None,
                             "flops": flops, "tuning_s": rnd.tuning_s, "compile_s": None, "peak_mem_mib": None})
        else:
            hits = len(tasks) - len(cold)
            start = time.perf_counter()
            m = TvmCompiled(build(prepared, database), prepared, [x], target).measure(FINAL)
            rows.append({"nn": name, "route": f"tvm tuned, shared database ({hits}/{len(tasks)} tasks hit)",
                         "median_ms": m.median_ms, "iqr_ms": m.spread_ms, "flops": flops, "tuning_s": 0.0,
                         "compile_s": time.perf_counter() - start, "peak_mem_mib": None})
        log(rows[-1])
    results["rows"] = rows

    pruned = []
    for seed in range(args.pruned):
        model = pruned_navnet(seed)
        prepared = prepare(model, [x], target)

        def evaluate(database, prepared=prepared) -> float:
            return TvmCompiled(build(prepared, database), prepared, [x], target).measure(QUICK).median_ms

        report, _ = tu.SurveyTuner(db, round_trials_per_task=1).tune(
            prepared, evaluate, trials=0, seconds=None, runner=tu.local_runner(target.device_key), threads=args.threads)
        pruned.append({"seed": seed, "tasks": report.tasks, "hits": report.hits, "trials": report.trials,
                       "tuning_s": report.tuning_s, "untuned_ms": report.untuned_ms, "best_ms": report.best_ms})
        log(pruned[-1])
    results["pruned"] = pruned
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    report_markdown(results)


def report_markdown(r: dict) -> None:
    print(f"CPU: {os.cpu_count()} cores, {r['threads']} threads, fp32 peak {r['peak_gflops']:.0f} GFLOP/s "
          f"(cores x clock x 32 FMA lanes x 2), {r['date']}\n")
    print("| NN | route | median ms | IQR ms | GFLOP/s | share of peak | tuning s |")
    print("|---|---|---|---|---|---|---|")
    for row in r["rows"]:
        gflops = row["flops"] / row["median_ms"] / 1e6
        iqr = f"{row['iqr_ms']:.2f}" if row["iqr_ms"] is not None else "-"
        print(f"| {row['nn']} | {row['route']} | {row['median_ms']:.2f} | {iqr} | {gflops:.1f} | "
              f"{gflops / r['peak_gflops']:.1%} | {row['tuning_s']:.0f} |")
    s = r.get("survey")
    if s:
        print("\nSurvey tuning of the heading NN, round by round (early stop disabled; QUICK protocol):\n")
        print("| round | trials | tuning s | latency ms | early stop (min_gain 5 %) would say |")
        print("|---|---|---|---|---|")
        lat = [x["latency_ms"] for x in s["rounds"]]
        for i, rnd in enumerate(s["rounds"]):
            print(f"| {i + 1} | {rnd['trials']} | {rnd['tuning_s']:.0f} | {rnd['latency_ms']:.2f} | "
                  f"{tu.stop_reason(lat[: i + 1], 0.05) or 'go on'} |")
        stop = next((i for i in range(len(lat)) if tu.stop_reason(lat[: i + 1], 0.05)), len(lat) - 1)
        full_best, stop_best = min(lat), min(lat[: stop + 1])
        print(f"\nUntuned {s['untuned_ms']:.1f} ms. Early stop after round {stop + 1}: {stop_best:.2f} ms = "
              f"{full_best / stop_best:.0%} of the full-budget speed ({full_best:.2f} ms) in "
              f"{s['rounds'][stop]['tuning_s'] / s['rounds'][-1]['tuning_s']:.0%} of its tuning time.")
    if r.get("pruned"):
        tasks = sum(p["tasks"] for p in r["pruned"])
        hits = sum(p["hits"] for p in r["pruned"])
        print(f"\nShared database over 10 pruned heading candidates: {hits}/{tasks} tasks hit ({hits / tasks:.0%}); "
              f"per candidate: " + ", ".join(f"{p['hits']}/{p['tasks']}" for p in r["pruned"]))


if __name__ == "__main__":
    main()
