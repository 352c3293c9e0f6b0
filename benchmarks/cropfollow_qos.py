"""CropFollow QoS under injected perception errors: the trend calibration relies on.

    python benchmarks/cropfollow_qos.py [--seeds 20] [--controller mpc]

White Gaussian errors of growing sigma on one NN (the other perfect), 100 m runs,
one per seed. Prints the share of collision-free runs and the mean collisions per
100 m for each sigma.
"""

from __future__ import annotations

import argparse

import numpy as np

from qaopt.simulators.cropfollow import CropFollowEvaluator

SIGMAS = {"heading": [0, 5, 10, 15, 20, 25, 30, 40], "distance": [0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4]}
UNITS = {"heading": "deg", "distance": "ratio"}


def gaussian(sigma: float):
    def inject(truth, rng, t):
        return truth + rng.normal(0.0, sigma, truth.shape)

    return inject


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--controller", default="mpc", choices=["mpc", "stanley"])
    args = ap.parse_args()
    evaluator = CropFollowEvaluator(run_length_m=100.0, controller=args.controller)
    seeds = list(range(args.seeds))
    print(f"controller {args.controller}, {args.seeds} seeds, 100 m runs\n")
    print("| NN with error | sigma | collision-free runs | mean collisions/100 m | interventions |")
    print("|---|---|---|---|---|")
    for nn, sigmas in SIGMAS.items():
        for sigma in sigmas:
            records = evaluator.evaluate({nn: gaussian(sigma)} if sigma else {}, seeds)
            free = sum(r["collisions"] == 0 for r in records)
            rate = np.mean([r["collisions_per_100m"] for r in records])
            print(f"| {nn} | {sigma:g} {UNITS[nn]} | {free}/{len(records)} | {rate:.2f} | {sum(r['interventions'] for r in records)} |")


if __name__ == "__main__":
    main()
