"""Pruning ladders against one-shot pruning at equal total training cost (issue "The real result").

    python benchmarks/ladders.py --spec examples/cropfollow-resnet18.yaml --out DIR [--device cuda]
                                 [--nn heading distance] [--finetune-steps 160] [--latency-threads 2]

For each NN of the spec it builds

1. the NN's pruning ladder as the spec defines it (``approximations.<nn>.pruning.ladder``: a step of
   the original channels per rung, ``finetune_steps`` distillation steps after each, learning rate
   rewound), every rung down to the spec's top ratio, through ``qaopt.approx.ladder_of``;
2. at every rung's ratio, the one-shot candidate of today's default profile: pruned from scratch in
   2 steps with 160 fine-tuning steps (``--finetune-steps``), through ``qaopt.approx.build``, with the
   spec's fine-tuning recipe (``approximations.<nn>.finetune.lr`` / ``batch_size``) as the ladder.

With a ladder of ``n`` rungs of 160 steps, both cost ``n x 160`` training steps in all: the ladder
spends them on one trajectory, one-shot pruning on ``n`` separate candidates. Each row has both
errors (the spec's error metric on the NN's validation data), MACs and parameters, and, with
``--latency-threads``, each rung's fp32 latency on ONNX Runtime with this process pinned to that
many cores (measured after all training, so nothing else runs). Writes ``DIR/ladders.json`` after
every NN (the rungs are cached under ``QAOPT_CACHE_DIR``, so a re-run resumes mid-ladder) and
prints one markdown table per NN.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from qaopt import kernels
from qaopt.approx import Knobs, KnobSpace, build, ladder_of
from qaopt.approx.passes.pruning import PruningConfig
from qaopt.measuring import untuned_latency
from qaopt.on_policy import target_nns
from qaopt.spec import load_spec
from qaopt.spec_adapter import cache_dir_of

ONE_SHOT_STEPS = 2
"""Pruning steps of a one-shot candidate under the default profile (``max_prune_steps``)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=Path("examples/cropfollow-resnet18.yaml"))
    ap.add_argument("--out", type=Path, default=None, help="folder of ladders.json (required unless --tables)")
    ap.add_argument("--nn", nargs="+", default=None, help="NNs of the spec (default: all)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--finetune-steps", type=int, default=160, help="fine-tuning steps of each one-shot candidate")
    ap.add_argument("--latency-threads", type=int, default=0, help="time each rung on this many pinned cores (0: no)")
    ap.add_argument("--backbone", choices=["compact", "resnet18"], default=None, help="override the NNs' backbone")
    ap.add_argument("--top", type=float, default=None, help="deepest ratio to build (default: the spec's top rung)")
    ap.add_argument("--tables", type=Path, default=None, help="only print the tables of a ladders.json written earlier")
    args = ap.parse_args()
    if args.tables is not None:
        report = json.loads(args.tables.read_text())
        for name, entry in report.items():
            if isinstance(entry, dict) and "rungs" in entry:
                print(table(name, entry))
        return
    if args.out is None:
        ap.error("--out is required")
    spec = load_spec(args.spec, check_entry_points=True)
    if args.backbone is not None:
        spec = spec.model_copy(update={"nns": {n: s.model_copy(update={"args": {**s.args, "backbone": args.backbone}})
                                               for n, s in spec.nns.items()}})
    cache = cache_dir_of(spec)
    args.out.mkdir(parents=True, exist_ok=True)
    out_file = args.out / "ladders.json"
    report = json.loads(out_file.read_text()) if out_file.exists() else {}
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records

    report.update({**provenance(), "torch": torch.__version__, "device": args.device})
    names = args.nn or list(spec.nns)
    nns = target_nns(spec, cache, names)
    ladder_knobs: dict[str, Knobs] = {}
    for name in names:
        space = KnobSpace.from_section(spec.knobs_for(name), nn=name)
        config = space.configs.get("pruning")
        if not isinstance(config, PruningConfig) or config.ladder is None:
            raise SystemExit(f"{args.spec}: approximations.{name}.pruning has no ladder")
        top = config.ratios()[1] if args.top is None else args.top
        knobs = ladder_knobs[name] = space.base(prune_ratio=top, seed=spec.search.seed)
        nn_ = nns[name]
        ladder = ladder_of(nn_, knobs, cache_dir=cache, device=args.device, progress=print)
        n = round(top / knobs.ladder_step)
        for k in range(1, n + 1):
            ladder.model(k)
        # The training time of a first pass; a re-run (e.g. for latency) finds the rungs cached and keeps it.
        ladder_seconds = sum(r.seconds for r in ladder.rungs()[:n])
        reference = build(nn_, Knobs(seed=spec.search.seed), cache_dir=cache, onnx=kernels.onnx)
        rows = []
        started = time.perf_counter()
        for rung in ladder.rungs()[:n]:
            # Today's candidate at this ratio, with the spec's fine-tuning recipe (learning rate, batch size).
            scratch = {**knobs.model_dump(), "prune_ratio": rung.ratio, "prune_steps": ONE_SHOT_STEPS,
                       "finetune_steps": args.finetune_steps, "ladder_step": 0.0, "ladder_finetune_steps": 0}
            one_shot = build(nn_, Knobs(**scratch), cache_dir=cache, onnx=kernels.onnx, device=args.device)
            rows.append({"rung": rung.rung, "ratio": rung.ratio, "ladder_error": rung.error, "one_shot_error": one_shot.error,
                         "macs": rung.macs, "params": rung.params, "ladder_train_steps": rung.train_steps,
                         "one_shot_macs": one_shot.macs})
            print(f"{name} rung {rung.rung} ({rung.ratio:.2f}): ladder {rung.error:.4g}, one-shot {one_shot.error:.4g}")
        one_shot_seconds = time.perf_counter() - started
        if name in report and one_shot_seconds < report[name]["one_shot"]["seconds"]:
            one_shot_seconds = report[name]["one_shot"]["seconds"]  # these candidates came from the cache
        report[name] = {
            "backbone": spec.nns[name].args.get("backbone"),
            "metric": nn_.metric.kind,
            "reference_error": reference.error,
            "reference_macs": reference.macs,
            "reference_params": reference.params,
            "ladder": {"step": knobs.ladder_step, "finetune_steps": knobs.ladder_finetune_steps,
                       "total_steps": n * knobs.ladder_finetune_steps, "seconds": ladder_seconds},
            "one_shot": {"prune_steps": ONE_SHOT_STEPS, "finetune_steps": args.finetune_steps,
                         "total_steps": n * args.finetune_steps, "seconds": one_shot_seconds},
            "rungs": rows,
        }
        out_file.write_text(json.dumps(report, indent=1))
    if args.latency_threads:
        _latencies(report, ladder_knobs, nns, spec, cache, args.latency_threads)
        out_file.write_text(json.dumps(report, indent=1))
    for name in names:
        print(table(name, report[name]))


def _latencies(report: dict, ladder_knobs: dict[str, Knobs], nns: dict, spec, cache: Path, threads: int) -> None:
    """fp32 latency of the reference and every rung on ONNX Runtime, this process pinned to ``threads`` cores."""
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:threads]))
    torch.set_num_threads(threads)
    target = kernels.Target.from_spec(spec.target.model_copy(update={"threads": threads, "backend": "onnxruntime"}))
    report["latency"] = {"backend": "onnxruntime", "dtype": "fp32", "threads": threads, "cpu": _cpu_model()}
    for name, knobs in ladder_knobs.items():
        entry = report[name]
        entry["reference_ms"] = untuned_latency(build(nns[name], Knobs(seed=spec.search.seed), cache_dir=cache,
                                                      onnx=kernels.onnx), target, cache)[1]
        for row in entry["rungs"]:
            cand = build(nns[name], Knobs(**{**knobs.model_dump(), "prune_ratio": row["ratio"]}), cache_dir=cache,
                         onnx=kernels.onnx)
            row["ms"] = untuned_latency(cand, target, cache)[1]
            print(f"{name} rung {row['rung']}: {row['ms']:.2f} ms")


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def table(name: str, entry: dict) -> str:
    lad, one = entry["ladder"], entry["one_shot"]
    unit = entry["metric"]
    lines = [
        f"**{name}** ({entry['backbone']}): reference error {entry['reference_error']:.4g} ({unit}), "
        f"{entry['reference_macs'] / 1e6:.0f} MMACs, {entry['reference_params'] / 1e6:.2f} M parameters"
        + (f", {entry['reference_ms']:.2f} ms" if "reference_ms" in entry else "") + ". "
        f"Ladder: {lad['finetune_steps']} steps per rung, {lad['total_steps']} in all ({lad['seconds']:.0f} s); "
        f"one-shot: {one['prune_steps']} pruning steps and {one['finetune_steps']} fine-tuning steps per candidate, "
        f"{one['total_steps']} in all ({one['seconds']:.0f} s).",
        "",
        "| rung | pruned | ladder error | one-shot error | ladder / one-shot | MMACs | M params | steps in the rung | fp32 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in entry["rungs"]:
        ms = f"{r['ms']:.2f}" if "ms" in r else "-"
        lines.append(f"| {r['rung']} | {r['ratio']:.2f} | {r['ladder_error']:.4g} | {r['one_shot_error']:.4g} | "
                     f"{r['ladder_error'] / r['one_shot_error']:.2f} | {r['macs'] / 1e6:.0f} | {r['params'] / 1e6:.3f} | "
                     f"{r['ladder_train_steps']} | {ms} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
