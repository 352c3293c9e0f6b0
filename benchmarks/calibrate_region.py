"""Calibration on CropFollow with Gaussian injection: each strategy's region against a dense ground truth.

    .venv/bin/python benchmarks/calibrate_region.py [--grid 30] [--truth-trials 200] [--reps 3]

Ground truth: every cell centre of a ``grid x grid`` lattice over the spec's error
space is run ``truth-trials`` times on seeds no search uses (cached, so computed
once); a point is truly valid when its observed failure rate is at most the spec's
``max_failure_rate``. Each strategy then searches with budgets of 10, 20 and 40
evaluations (a point's trials count as one), repeated on ``reps`` disjoint seed
sets, and its region is scored on the lattice: agreement (share of lattice points
labelled as the truth labels them) and false-valid rate (share of lattice points
called valid that are truly invalid), in both region modes. The 3-D case (heading
bias x heading sigma x distance sigma) is scored the same way on a coarser lattice.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
import time
from pathlib import Path

import numpy as np

from qaopt.app_spec import load
from qaopt.calibrate import Axis, Calibration, ErrorSpace, Gaussian
from qaopt.region_calibration import build_calibration

REPO = Path(__file__).resolve().parents[1]
TRUTH_SEED = 1_000_000  # ground-truth runs use seeds from here on; searches use 0 .. reps*10_000
STRATEGIES = ("bisect", "monotone", "active")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def lattice(space: ErrorSpace, n: int) -> np.ndarray:
    """Cell centres of an n^d lattice over the unit cube."""
    g = (np.arange(n) + 0.5) / n
    return np.array(list(itertools.product(g, repeat=space.dim)))


def ground_truth(cal: Calibration, n: int, trials: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    U = lattice(cal.space, n)
    rates = np.empty(len(U))
    t0 = time.time()
    for i, u in enumerate(U):
        ob = cal.evaluate_fixed(cal.space.from_unit(u), trials, first_seed=TRUTH_SEED)
        if ob.trials != trials:
            raise RuntimeError(f"ground truth failed at {ob.errors}: {ob.message}")
        rates[i] = ob.failures / ob.trials
        if i % 100 == 99:
            log(f"  truth {i + 1}/{len(U)} ({time.time() - t0:.0f} s)")
    return U, rates <= cal.acceptance.max_failure_rate, rates


def score(region, U: np.ndarray, truth: np.ndarray, mode: str) -> tuple[float, float]:
    called = region.contains_unit(U, mode)
    return float((called == truth).mean()), float((called & ~truth).mean())


def strategy_table(cal: Calibration, U, truth, budgets, reps, strategies=STRATEGIES) -> list[str]:
    rows = ["| strategy | budget | evaluations | trials | certified agreement | certified false-valid "
            "| predicted agreement | predicted false-valid | search s |", "|" + "---|" * 9]
    for strategy in strategies:
        for budget in budgets:
            res = []
            for rep in range(reps):
                c = copy.copy(cal)
                c.seed_base = rep * 10_000
                t0 = time.time()
                region = c.search(strategy, budget)
                res.append((region.evaluations, region.trials, *score(region, U, truth, "certified"),
                            *score(region, U, truth, "predicted"), time.time() - t0))
            r = np.array(res)
            mean = r.mean(0)
            rows.append(
                f"| {strategy} | {budget} | {mean[0]:.1f} | {mean[1]:.0f} | "
                f"{100 * mean[2]:.1f} % (min {100 * r[:, 2].min():.1f}) | {100 * mean[3]:.2f} % (max {100 * r[:, 3].max():.2f}) | "
                f"{100 * mean[4]:.1f} % (min {100 * r[:, 4].min():.1f}) | {100 * mean[5]:.2f} % (max {100 * r[:, 5].max():.2f}) | "
                f"{mean[6]:.1f} |"
            )
            log(rows[-1])
    return rows


def evaluator_speed(cal: Calibration) -> str:
    inj = {"heading": Gaussian().injector({"metric": 5.0}), "distance": Gaussian().injector({"metric": 0.05})}
    cal.evaluator.evaluate(inj, [0])  # warm-up (numba)
    out = []
    for n in (8, 200):
        t0 = time.perf_counter()
        for _ in range(3):
            cal.evaluator.evaluate(dict(inj), list(range(n)))
        dt = (time.perf_counter() - t0) / 3
        out.append(f"{n} seeds per call: {dt * 1000:.0f} ms ({dt / n * 1000:.1f} ms per 100 m run)")
    return "; ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(REPO / "examples" / "cropfollow.yaml"))
    ap.add_argument("--grid", type=int, default=30)
    ap.add_argument("--grid3", type=int, default=10)
    ap.add_argument("--truth-trials", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budgets", type=int, nargs="+", default=[10, 20, 40])
    ap.add_argument("--budgets3", type=int, nargs="+", default=[20, 40])
    args = ap.parse_args()

    spec = load(args.spec)
    cal = build_calibration(spec)
    print(f"Evaluator speed (CropFollow, MPC, 100 m): {evaluator_speed(cal)}\n")
    acc = cal.acceptance
    print(f"Acceptance: P(fail) <= {acc.max_failure_rate} at {acc.confidence:.0%} confidence, "
          f"{acc.min_trials}..{acc.max_trials} trials in blocks of {acc.block}; "
          f"space {', '.join(f'{a.name} in [{a.min}, {a.max}]' for a in cal.space.axes)}\n")

    t0 = time.time()
    U, truth, rates = ground_truth(cal, args.grid, args.truth_trials)
    print(f"### 2-D: {args.grid}x{args.grid} ground truth, {args.truth_trials} runs per point "
          f"({time.time() - t0:.0f} s incl. cache reads): {truth.mean():.1%} of points valid, "
          f"{np.mean((rates > 0) & (rates < 0.2)):.1%} with a failure rate in (0, 0.2)\n")
    print("\n".join(strategy_table(cal, U, truth, args.budgets, args.reps)) + "\n")

    space3 = ErrorSpace([Axis("heading", 20.0, "bias"), Axis("heading", 30.0, "sigma"), Axis("distance", 0.3, "sigma")])
    cal3 = Calibration(cal.evaluator, space3, {"heading": Gaussian(), "distance": Gaussian()}, cal.goal,
                       cal.acceptance, cal.cache.root.parent.parent, cal.app_key)
    t0 = time.time()
    U3, truth3, rates3 = ground_truth(cal3, args.grid3, args.truth_trials)
    print(f"### 3-D (heading bias x heading sigma x distance sigma): {args.grid3}^3 ground truth, "
          f"{args.truth_trials} runs per point ({time.time() - t0:.0f} s): {truth3.mean():.1%} of points valid\n")
    print("\n".join(strategy_table(cal3, U3, truth3, args.budgets3, args.reps)))


if __name__ == "__main__":
    main()
