"""CropFollow with a state estimator (EKF: NNs + wheel odometry + gyro) against raw perception.

    .venv/bin/python benchmarks/cropfollow_estimator.py [--seeds 100] [--nn-runs 16] [--render-threads 1]
                                                        [--out docs/benchmarks/cropfollow_estimator.json]

For both pipelines (``estimator: none``, the MPC steering from the raw NN outputs, and
``estimator: ekf``, with the default :class:`EstimatorParams`):

1. QoS against injected error (no rendering): the share of collision-free 100 m runs,
   one per seed, at a grid of injected L1 errors with qaopt.calibrate's ``gaussian``
   (white) and ``ar1`` (5-step correlation time, as the shipped example uses) error
   models, on the heading NN, on the distance NN (the other perfect), and on both at once.
2. The shipped compact reference NNs in the loop (rendered frames), ``--nn-runs`` seeded
   100 m runs per pipeline; about 10-30 s of CPU a run, so keep it small.

Prints markdown tables and writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from qaopt.calibrate import AR1, Gaussian
from qaopt.simulators.cropfollow import CropFollowEvaluator, reference_nn, torch_perception

REPO = Path(__file__).resolve().parents[1]
PIPELINES = ("none", "ekf")
MODELS = {"gaussian": Gaussian(), "ar1": AR1()}
HEADING_L1_DEG = (0, 2, 4, 6, 8, 10, 12, 16, 20, 25, 30)
DISTANCE_L1 = (0, 0.03, 0.06, 0.09, 0.12, 0.16, 0.2, 0.25, 0.3)
BOTH_L1 = ((2, 0.03), (4, 0.06), (6, 0.09), (8, 0.12), (10, 0.15), (12, 0.18), (16, 0.24))
"""Both NNs err at once, in the proportion of the example spec's error space (8 deg : 0.12)."""
RUN_LENGTH_M = 100.0


def qos(records: list[dict]) -> dict:
    """The QoS numbers of a set of runs: collision-free count, failure rate, mean collisions per 100 m, interventions."""
    free = sum(r["collisions"] == 0 for r in records)
    return {
        "runs": len(records),
        "collision_free": free,
        "failure_rate": 1.0 - free / len(records),
        "mean_collisions_per_100m": float(np.mean([r["collisions_per_100m"] for r in records])),
        "interventions": int(sum(r["interventions"] for r in records)),
    }


def single_run_cpu_ms(evaluator: CropFollowEvaluator, runs: int = 31) -> float:
    """Median CPU time of one 100 m run with white errors on both NNs (after a warm-up that loads the kernels)."""
    injectors = {"heading": Gaussian().injector({"metric": 4.0}), "distance": Gaussian().injector({"metric": 0.04})}
    evaluator.evaluate(injectors, [0])
    times = []
    for seed in range(runs):
        started = time.process_time()
        evaluator.evaluate(injectors, [seed])
        times.append(time.process_time() - started)
    return 1000.0 * float(np.median(times))


def injected_curves(evaluators: dict[str, CropFollowEvaluator], seeds: list[int]) -> list[dict]:
    """One row per (error model, NNs with error, L1 point): the QoS of each pipeline there."""
    points = [("heading", {"heading": h}) for h in HEADING_L1_DEG]
    points += [("distance", {"distance": d}) for d in DISTANCE_L1]
    points += [("both", {"heading": h, "distance": d}) for h, d in BOTH_L1]
    rows = []
    for model_name, model in MODELS.items():
        for nns, l1 in points:
            row = {"model": model_name, "nns": nns, "l1": l1}
            for pipeline, evaluator in evaluators.items():
                injectors = {nn: model.injector({"metric": m}) for nn, m in l1.items() if m > 0}
                row[pipeline] = qos(evaluator.evaluate(injectors, seeds))
            rows.append(row)
    return rows


def print_curves(rows: list[dict], seeds: int) -> None:
    print(f"## QoS against injected L1 error: collision-free {RUN_LENGTH_M:g} m runs of {seeds} seeds per point\n")
    print("failure rate = share of runs with a collision; mean collisions per 100 m in brackets\n")
    for model_name in MODELS:
        for nns in ("heading", "distance", "both"):
            unit = {"heading": "deg", "distance": "ratio", "both": "deg, ratio"}[nns]
            print(f"### {model_name} errors on {'both NNs' if nns == 'both' else f'the {nns} NN (the other perfect)'}\n")
            print(f"| injected L1 ({unit}) | none: collision-free | none: failure rate | ekf: collision-free | ekf: failure rate |")
            print("|---|---|---|---|---|")
            for row in rows:
                if row["model"] != model_name or row["nns"] != nns:
                    continue
                l1 = ", ".join(f"{row['l1'][nn]:g}" for nn in ("heading", "distance") if nn in row["l1"])
                cells = [f"{row[p]['collision_free']}/{row[p]['runs']} | {row[p]['failure_rate']:.0%} ({row[p]['mean_collisions_per_100m']:.2f})"
                         for p in PIPELINES]
                print(f"| {l1} | {' | '.join(cells)} |")
            print()


def nn_in_the_loop(evaluators: dict[str, CropFollowEvaluator], runs: int, render_threads: int) -> dict[str, dict]:
    """Both compact reference NNs in the loop, ``runs`` seeds, for each pipeline."""
    nns = {t: torch_perception(reference_nn(t, "compact", train_if_missing=False)) for t in ("heading", "distance")}
    out = {}
    for pipeline, evaluator in evaluators.items():
        started = time.perf_counter()
        records = evaluator.evaluate_perception(nns, list(range(runs)), render_threads=render_threads)
        out[pipeline] = {**qos(records), "max_collisions": max(r["collisions"] for r in records),
                         "mean_distance_m": float(np.mean([r["distance_m"] for r in records])),
                         "wall_s": time.perf_counter() - started, "records": records}
    return out


def print_nn_in_the_loop(results: dict[str, dict], runs: int) -> None:
    print(f"## Compact reference NNs in the loop: {runs} seeds, {RUN_LENGTH_M:g} m runs, controller mpc\n")
    print("| pipeline | collision-free runs | failure rate | mean collisions/100 m | max collisions | interventions | mean distance (m) | wall time (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for pipeline, r in results.items():
        print(f"| {pipeline} | {r['collision_free']}/{r['runs']} | {r['failure_rate']:.0%} | {r['mean_collisions_per_100m']:.2f} | "
              f"{r['max_collisions']} | {r['interventions']} | {r['mean_distance_m']:.1f} | {r['wall_s']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100, help="runs per point of the injected-error curves")
    ap.add_argument("--nn-runs", type=int, default=16, help="100 m runs per pipeline with the reference NNs in the loop (0: skip)")
    ap.add_argument("--render-threads", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "cropfollow_estimator.json")
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()
    torch.set_num_threads(args.threads)
    evaluators = {p: CropFollowEvaluator(run_length_m=RUN_LENGTH_M, controller="mpc", estimator=p) for p in PIPELINES}
    print(f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, {args.threads} torch "
          f"thread(s), {args.render_threads} render thread(s); ekf with the default EstimatorParams\n")
    cpu_ms = {p: single_run_cpu_ms(e) for p, e in evaluators.items()}
    print("one 100 m run with injected errors (median CPU time of 31): "
          + ", ".join(f"{p} {ms:.1f} ms" for p, ms in cpu_ms.items()) + "\n")
    started = time.perf_counter()
    seeds = list(range(args.seeds))
    curves = injected_curves(evaluators, seeds)
    curves_s = time.perf_counter() - started
    print_curves(curves, args.seeds)
    print(f"(injected-error curves: {curves_s:.0f} s wall)\n")
    summary = {**prov, "torch": torch.__version__,
               "run_length_m": RUN_LENGTH_M, "seeds_per_point": args.seeds, "single_run_cpu_ms": cpu_ms,
               "estimator_params": dataclasses.asdict(evaluators["ekf"].estimator),
               "error_models": {name: model.config() for name, model in MODELS.items()},
               "curves": curves, "curves_wall_s": curves_s}
    if args.nn_runs > 0:
        results = nn_in_the_loop(evaluators, args.nn_runs, args.render_threads)
        print_nn_in_the_loop(results, args.nn_runs)
        summary["nn_in_the_loop"] = {"backbone": "compact", "runs": args.nn_runs, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
