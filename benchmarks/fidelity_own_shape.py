"""Fidelity diagnosis (issue #13): inject each real candidate's *own* fitted error process. Does the loop fail?

    .venv/bin/python benchmarks/fidelity_own_shape.py [--runs 96] [--run-dir docs/benchmarks/fidelity_device/run1]

If one region point per NN (a level) cannot predict the closed loop (``benchmarks/fidelity.py``),
the richest error model qaopt measures might: the ``shaped`` model fitted to the candidate's own
on-policy residual and truth sequences (its bias, slope on the true value, correlation time,
bursts), injected at its own level, with the other NN's reference process. Run in the example's
simulator (100 m, ``--runs`` seeds of their own), twice: the slope held at the edges of the band of
true values it was measured on (the model as shipped), and extrapolated beyond it. Prints the
failing runs beside the closed-loop ground truth of the same NN (with the other NN the reference).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
HEADING = ["h-ref", "h-p30-ft100", "h-p50-ft100", "h-p50-ft400", "h-p70-ft100", "h-p70-ft400", "h-p90-ft400"]
DISTANCE = ["d-ref", "d-p30-ft100", "d-p50-ft100", "d-p70-ft100", "d-p70-ft400", "d-p90-ft400"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, default=REPO / "docs" / "benchmarks" / "fidelity_device" / "run1")
    ap.add_argument("--runs", type=int, default=96)
    args = ap.parse_args()

    from qaopt.calibrate.error_models import Shaped
    from qaopt.simulators.cropfollow import CropFollowEvaluator
    from qaopt.spec import load_spec

    spec = load_spec(REPO / "examples" / "cropfollow.yaml")
    evaluator = CropFollowEvaluator(**spec.evaluator.simulator.params)
    sequences = np.load(args.run_dir / "fidelity_residuals.npz")
    drives = len([k for k in sequences.files if k.startswith("h-ref/residual/")])
    truth = {}
    for text in (args.run_dir / "done.jsonl").read_text().replace("}{", "}\n{").splitlines():
        rec = json.loads(text)
        truth[(rec["heading"], rec["distance"])] = f"{rec['failures']}/{rec['runs']}"

    def fit(name: str) -> Shaped:
        return Shaped.fit([sequences[f"{name}/residual/{i}"] for i in range(drives)], "l1",
                          [sequences[f"{name}/truth/{i}"] for i in range(drives)])

    seeds = list(range(9_000_000, 9_000_000 + args.runs))
    reference = {"heading": fit("h-ref"), "distance": fit("d-ref")}
    print(f"{args.runs} injection runs of {spec.evaluator.simulator.params['run_length_m']} m per row; the other NN "
          f"injected with the reference's own process\n")
    print("| NN variant | on-policy L1 | slope on truth | closed loop (real NNs) | injected, slope held at the band | "
          "injected, slope extrapolated |")
    print("|---|---|---|---|---|---|")
    for nn, names in (("heading", HEADING), ("distance", DISTANCE)):
        other = "distance" if nn == "heading" else "heading"
        for name in names:
            model = fit(name)
            level = model.features.level
            cells = []
            for variant in (model, replace(model, truth_range=(-np.inf, np.inf))):
                injectors = {nn: variant.injector({"metric": level}),
                             other: reference[other].injector({"metric": reference[other].features.level})}
                records = evaluator.evaluate(injectors, seeds)
                cells.append(f"{sum(r[spec.qos.metric] > spec.qos.max for r in records)}/{args.runs}")
            pair = (name, "d-ref") if nn == "heading" else ("h-ref", name)
            print(f"| {name} | {level:.4g} | {model.gain:+.2f} | {truth.get(pair, '-')} | {cells[0]} | {cells[1]} |",
                  flush=True)


if __name__ == "__main__":
    main()
