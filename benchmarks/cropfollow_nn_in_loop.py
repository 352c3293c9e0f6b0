"""CropFollow with its reference NNs in the loop: collision-free share over seeded 100 m runs.

    python benchmarks/cropfollow_nn_in_loop.py [--backbone compact] [--seeds 20] [--device cpu]

Each NN reads the rendered camera frames; the MPC steers from its estimates. Prints
the QoS per configuration (both NNs in the loop, and each alone with the other
perfect) and the NNs' validation L1 errors on the reference dataset.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from qaopt.simulators.cropfollow import CropFollowEvaluator
from qaopt.simulators.cropfollow.dataset import reference_dataset
from qaopt.simulators.cropfollow import reference_nn, torch_perception
from qaopt.simulators.cropfollow.train import predict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", default="compact", choices=["compact", "resnet18"])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--run-length", type=float, default=100.0)
    ap.add_argument("--controller", default="mpc", choices=["mpc", "stanley"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--render-threads", type=int, default=1)
    ap.add_argument("--configs", nargs="*", default=["both"], choices=["both", "heading", "distance"], help="which NNs run in the loop (none: only the validation table)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    nns = {t: reference_nn(t, args.backbone, device=args.device, train_if_missing=False) for t in ("heading", "distance")}
    print(f"torch {torch.__version__}, device {args.device}, {args.threads} torch thread(s), {args.render_threads} render thread(s), backbone {args.backbone}\n")
    print("| NN | validation L1 | unit | val frames |")
    print("|---|---|---|---|")
    for target, unit in (("heading", "deg"), ("distance", "ratio")):
        data = reference_dataset(target)
        l1 = float(np.mean(np.abs(predict(nns[target], data.x_val, device=args.device) - data.y_val.reshape(-1))))
        print(f"| {args.backbone}-{target} | {l1:.4f} | {unit} | {len(data.x_val)} |")
    if not args.configs:
        return
    evaluator = CropFollowEvaluator(run_length_m=args.run_length, controller=args.controller)
    seeds = list(range(args.seeds))
    print(f"\n{args.seeds} seeds, {args.run_length:g} m runs, controller {args.controller}\n")
    print("| NNs in the loop | collision-free runs | mean collisions/100 m | max collisions | interventions | mean distance (m) | wall time (s) |")
    print("|---|---|---|---|---|---|---|")
    for config in args.configs:
        names = ("heading", "distance") if config == "both" else (config,)
        started = time.perf_counter()
        records = evaluator.evaluate_perception({n: torch_perception(nns[n], args.device) for n in names}, seeds, render_threads=args.render_threads)
        wall = time.perf_counter() - started
        free = sum(r["collisions"] == 0 for r in records)
        print(
            f"| {' + '.join(names)} | {free}/{len(records)} | {np.mean([r['collisions_per_100m'] for r in records]):.2f} | "
            f"{max(r['collisions'] for r in records)} | {sum(r['interventions'] for r in records)} | "
            f"{np.mean([r['distance_m'] for r in records]):.1f} | {wall:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
