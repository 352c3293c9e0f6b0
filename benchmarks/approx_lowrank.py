"""Low-rank factorization x pruning for the CropFollow NNs: error, MACs and latency (docs/BENCHMARKS.md, Approximation).

    .venv/bin/python benchmarks/approx_lowrank.py --nns heading distance

Candidates are built with qaopt.approx.build like those of approx_sweep.py (and
cached, so ``--build-only --device cuda`` on a GPU machine can do the fine-tuning);
latency as there: batch 1, median of repeated runs in interleaved rounds.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from qaopt.app_spec import load
from qaopt import kernels
from qaopt.approx import FinetuneRecipe, Knobs, build

from approx_sweep import spec_target, timings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=Path("examples/cropfollow.yaml"))
    ap.add_argument("--nns", nargs="+", default=["heading", "distance"])
    ap.add_argument("--ranks", default="1,0.5,0.25")
    ap.add_argument("--ratios", default="0,0.5")
    ap.add_argument("--prune-steps", type=int, default=4)
    ap.add_argument("--finetune-steps", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--cache-dir", type=Path, default=Path(".qaopt-cache"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    recipe = FinetuneRecipe(batch_size=args.batch_size, lr=args.lr)
    spec = load(args.spec)
    print(f"# low-rank x pruning — {args.spec}; {args.finetune_steps} distillation steps (batch {recipe.batch_size}, lr {recipe.lr}), "
          f"latency batch 1, {args.threads} thread(s), median of ~{args.repeat} runs in {args.rounds} interleaved rounds\n")
    for name in args.nns:
        target = spec_target(spec, name)
        cands = {}
        for ratio in (float(r) for r in args.ratios.split(",")):
            for rank in (float(r) for r in args.ranks.split(",")):
                damaged = ratio > 0 or rank < 1
                knobs = Knobs(prune_ratio=ratio, rank_ratio=rank, prune_steps=args.prune_steps if ratio else 1,
                              finetune_steps=args.finetune_steps if damaged else 0)
                cands[(ratio, rank)] = build(target, knobs, cache_dir=args.cache_dir, recipe=recipe, device=args.device,
                                             onnx=kernels.onnx)
        if args.build_only:
            print(name, {k: round(c.error, 4) for k, c in cands.items()})
            continue
        with tempfile.TemporaryDirectory() as tmp:
            # timings() keys candidates by (label, dtype); a label per (ratio, rank) pair.
            ms = timings({(f"{r:g}/{k:g}", "fp32"): c for (r, k), c in cands.items()}, target.input_shape, args.threads, args.repeat, args.rounds, Path(tmp))
        ratio0, rank1 = min(r for r, _ in cands), max(k for _, k in cands)
        base = cands[(ratio0, rank1)]
        base_ms = ms[(f"{ratio0:g}/{rank1:g}", "torch fp32")]
        print(f"\n## {name} (unpruned, unfactorized fp32 error {base.error:.4g} {base.metric})\n")
        print("| prune ratio | rank ratio | MMACs | kparams | error | x err | torch fp32 ms | speedup | ideal (MACs) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for (ratio, rank), c in sorted(cands.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
            t = ms[(f"{ratio:g}/{rank:g}", "torch fp32")]
            print(f"| {ratio:g} | {rank:g} | {c.macs / 1e6:.0f} | {c.params / 1e3:.0f} | {c.error:.4g} | {c.error / base.error:.2f} | "
                  f"{t:.2f} | {base_ms / t:.2f}x | {base.macs / c.macs:.2f}x |")


if __name__ == "__main__":
    main()
