"""End-to-end `qaopt optimize` on the shipped CropFollow example: speedups, validation, and cost.

    .venv/bin/python benchmarks/optimize_cropfollow.py --profile quick   # <= 15 min on 2 cores
    .venv/bin/python benchmarks/optimize_cropfollow.py --profile default # the real result

Prints a markdown summary for docs/BENCHMARKS.md; the full report is in the run folder.
"""

from __future__ import annotations

import argparse
import platform
import time
from datetime import date
from pathlib import Path

from qaopt import optimize

SPEC = Path(__file__).resolve().parents[1] / "examples" / "cropfollow.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: runs/bench-<profile>)")
    args = parser.parse_args()
    out = args.out or Path("runs") / f"bench-{args.profile}"
    start = time.perf_counter()
    r = optimize(SPEC, profile=args.profile, out=out)
    wall = time.perf_counter() - start
    print(f"### `qaopt optimize` on CropFollow, profile `{r.profile}` ({date.today()}, {platform.processor() or platform.machine()})\n")
    print(f"Command: `.venv/bin/python benchmarks/optimize_cropfollow.py --profile {args.profile}`; wall time {wall / 60:.1f} min "
          "(stages below; cached stages cost seconds on a re-run).\n")
    print("| configuration | latency/frame (ms) | speedup vs reference | schedule | heading NN | distance NN |")
    print("|---|---|---|---|---|---|")
    rows = (("reference", r.reference), ("application-agnostic", r.agnostic),
            (f"application-aware ({'accepted' if r.aware_accepted else 'not accepted'})", r.aware))
    for name, c in rows:
        if c is None:
            print("| application-aware | — | — | — | no configuration without a failing closed-loop run | |")
            continue
        nns = [f"prune {n.knobs['prune_ratio']:.2f}, {n.knobs['dtype']}, ft {n.knobs['finetune_steps']}, "
               f"L1 {n.error:.3g}, {n.backend} {n.latency_ms:.2f} ms" for n in c.nns.values()]
        print(f"| {name} | {c.latency_ms:.2f} | {r.reference.latency_ms / c.latency_ms:.2f}x | {c.schedule} | " + " | ".join(nns) + " |")
    s = r.speedups
    if s.aware_over_agnostic is not None:
        print(f"\nApplication-aware over application-agnostic: **{s.aware_over_agnostic:.2f}x** "
              f"(aware {s.aware:.2f}x, agnostic {s.agnostic:.2f}x over the reference).")
    if r.agnostic_validation is not None:
        v = r.agnostic_validation
        print(f"\nThe application-agnostic configuration with its NNs in the loop: {v.passes}/{v.runs} runs passed "
              f"({v.failures} failed), verdict {v.verdict}.")
    print("\n| validated trial | runs | passes | failures | verdict | region said valid |")
    print("|---|---|---|---|---|---|")
    for v in r.validations:
        print(f"| {'reference' if v.trial is None else v.trial} | {v.runs} | {v.passes} | {v.failures} | {v.verdict} "
              f"| {v.region_predicted_valid} |")
    print("\n| stage | seconds |\n|---|---|")
    for stage, seconds in r.seconds.items():
        print(f"| {stage} | {seconds:.0f} |")
    print("\nTrials: " + ", ".join(f"{m} {st.trials_complete} complete / {st.trials_feasible} feasible / {st.trials_failed} failed"
                              for m, st in r.studies.items()))


if __name__ == "__main__":
    main()
