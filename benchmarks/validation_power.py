"""How often closed-loop validation accepts a configuration, by its true failure rate: the test's power.

A spec's QoS goal is a failure rate bound with a confidence (CropFollow: at most 5 % of
100 m runs with a collision, at 90 %); validation runs a configuration in blocks and stops
as the product's stop rule says (:class:`qaopt.closed_loop.StopRule`). When the reference
NNs themselves fail some runs, a configuration exactly as good as the reference is
accepted only with some probability: that probability, not the region, can decide what a
run ends with. This script computes it by Monte Carlo over Bernoulli runs replayed with
the product's own rule (:func:`qaopt.closed_loop.replay`), beside the exact figure every run's
report states (:func:`qaopt.closed_loop.acceptance_probability`), for the spec's acceptance test
and each profile's run cap, and writes ``docs/benchmarks/validation_power.json``:

    .venv/bin/python benchmarks/validation_power.py [--spec examples/cropfollow.yaml] [--draws 20000]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RATES = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1)


def power(test, runs: int, rate: float, draws: int, rng: np.random.Generator) -> dict[str, float]:
    """P(accept) by simulation and exactly (what every run's report states), and the mean runs spent, for a
    configuration failing each run with probability ``rate``."""
    from qaopt.calibrate import Verdict
    from qaopt.closed_loop import acceptance_probability, replay

    accepted, spent = 0, 0
    for passed in rng.random((draws, runs)) >= rate:
        used, _, verdict = replay(list(passed), test, runs)
        accepted += verdict == Verdict.VALID
        spent += used
    return {"p_accept": round(accepted / draws, 4), "p_accept_exact": round(acceptance_probability(test, runs, rate), 4),
            "mean_runs": round(spent / draws, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "examples" / "cropfollow.yaml")
    parser.add_argument("--draws", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "validation_power.json")
    args = parser.parse_args()

    from qaopt.closed_loop import StopRule
    from qaopt.profiles import PROFILES
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import acceptance_of

    spec = load_spec(args.spec)
    test = acceptance_of(spec)
    rng = np.random.default_rng(0)
    caps = {name: p.validation_runs for name, p in PROFILES.items()} | {"spec max_trials": test.max_trials}
    rows = {}
    for name, runs in caps.items():
        rows[name] = {"runs": runs, "failures_tolerated": StopRule(test, runs).tolerated,
                      "by_rate": {str(rate): power(test, runs, rate, args.draws, rng) for rate in RATES}}
    record = {
        "spec": str(args.spec.relative_to(ROOT)) if args.spec.is_relative_to(ROOT) else str(args.spec),
        "goal": {"max_failure_rate": test.max_failure_rate, "confidence": test.confidence, "block": test.block},
        "draws": args.draws, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python benchmarks/validation_power.py" + (f" --spec {args.spec}" if args.spec != parser.get_default("spec") else ""),
        "caps": rows,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{record['spec']}: failure rate <= {test.max_failure_rate:g} at {test.confidence:g} confidence, "
          f"{args.draws} draws per cell\n")
    print("| runs (cap) | failures tolerated | " + " | ".join(f"true rate {r:g}" for r in RATES) + " |")
    print("|---|---|" + "---|" * len(RATES))
    for name, row in rows.items():
        cells = " | ".join(f"{c['p_accept_exact']:.2f} (simulated {c['p_accept']:.2f}, {c['mean_runs']:.0f} runs)"
                           for c in row["by_rate"].values())
        print(f"| {row['runs']} ({name}) | {row['failures_tolerated']} | {cells} |")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
