"""What a closed-loop validation task should hold: one run, or a block of runs in lock-step?

    python benchmarks/validation_chunking.py [--runs 8] [--length 20]

Runs the same ``--runs`` seeded CropFollow episodes (compact reference NNs in the loop, torch on
one thread, this process pinned to one core) once as one batched ``evaluate_perception`` call and
once as single-run calls, and prints the CPU time of each and whether the runs agree. Validation
sends single runs out as tasks (``qaopt.closed_loop.RUN_CHUNK``) so that every worker has one.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from qaopt.closed_loop import VALIDATION_SEED_BASE
from qaopt.simulators.cropfollow import CropFollowEvaluator, reference_nn
from qaopt.simulators.perception import torch_perception


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--length", type=float, default=20.0, help="metres per run")
    args = ap.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    ev = CropFollowEvaluator(run_length_m=args.length)
    nns = {t: torch_perception(reference_nn(t, "compact", train_if_missing=False), "cpu", args.runs)
           for t in ("heading", "distance")}
    seeds = [VALIDATION_SEED_BASE + i for i in range(args.runs)]
    ev.evaluate_perception(nns, seeds[:1])  # compile and warm up
    started = time.process_time()
    batched = ev.evaluate_perception(nns, seeds)
    batch_s = time.process_time() - started
    started = time.process_time()
    single = [ev.evaluate_perception(nns, [s])[0] for s in seeds]
    single_s = time.process_time() - started
    same = [r["collisions"] for r in batched] == [r["collisions"] for r in single]
    print(f"| {args.runs} runs of {args.length:g} m | one batch: {batch_s:.1f} s CPU | single runs: {single_s:.1f} s CPU "
          f"| same collisions: {same} |")


if __name__ == "__main__":
    main()
