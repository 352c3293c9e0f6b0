"""How often closed-loop validation accepts a configuration, by its true failure rate: the test's power.

A spec's QoS goal is a failure rate bound with a confidence (CropFollow: at most 5 % of 100 m runs with a
collision, at 90 %); validation runs a configuration in blocks until its sequential test decides
(:class:`qaopt.calibrate.SequentialTest`) or its cap is reached. When the reference NNs themselves fail some runs,
a configuration exactly as good as the reference is accepted only with some probability: that probability, not the
region, can decide what a run ends with. This script computes it by Monte Carlo over Bernoulli runs replayed with
the product's own decisions (:func:`qaopt.closed_loop.replay`), beside the exact figure every run's report states
(:meth:`~qaopt.calibrate.SequentialTest.operating`), for the spec's acceptance test at each profile's cap, and writes
``docs/benchmarks/validation_power.json``:

    .venv/bin/python benchmarks/validation_power.py [--spec examples/cropfollow.yaml] [--draws 20000]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
RATES = (0.0, 0.005, 0.01, 0.02, 0.025, 0.03, 0.05, 0.1)


def power(test, runs: int, rate: float, draws: int, rng: np.random.Generator) -> dict[str, float]:
    """P(accept) by simulation and exactly (what every run's report states), and the mean runs spent, for a
    configuration failing each run with probability ``rate``."""
    from qaopt.calibrate import SequentialTest, Verdict
    from qaopt.closed_loop import replay

    accepted = spent = 0
    for _ in range(draws):
        used, _, verdict = replay(list(rng.random(runs) >= rate), test, runs)
        accepted += verdict == Verdict.VALID
        spent += used
    exact, _, expected = SequentialTest.of(test, runs).operating(rate)
    return {"p_accept": round(accepted / draws, 4), "p_accept_exact": round(exact, 4),
            "mean_runs": round(spent / draws, 2), "mean_runs_exact": round(expected, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "examples" / "cropfollow.yaml")
    parser.add_argument("--draws", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "validation_power.json")
    args = parser.parse_args()
    record = provenance()

    from qaopt.calibrate import SequentialTest
    from qaopt.profiles import PROFILES
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import acceptance_of

    spec = load_spec(args.spec)
    test = acceptance_of(spec)
    rng = np.random.default_rng(0)
    caps = {name: min(p.validation_runs or test.max_trials, test.max_trials) for name, p in PROFILES.items()}
    rows = {}
    for name, runs in caps.items():
        sequential = SequentialTest.of(test, runs)
        rows[name] = {"runs": runs, "failures_tolerated": sequential.tolerated, "line": sequential.power_line(),
                      "by_rate": {str(rate): power(test, runs, rate, args.draws, rng) for rate in RATES}}
    record |= {
        "spec": str(args.spec.relative_to(ROOT)) if args.spec.is_relative_to(ROOT) else str(args.spec),
        "goal": {"max_failure_rate": test.max_failure_rate, "confidence": test.confidence, "block": test.block},
        "test": "truncated sequential probability ratio test (qaopt.calibrate.SequentialTest)",
        "draws": args.draws,
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
