"""Fidelity diagnosis: inject each real candidate's *own* fitted error process. Does the loop fail?

    .venv/bin/python benchmarks/fidelity_own_shape.py [--runs 96] [--run-dir docs/benchmarks/fidelity_device/run1]
                                                      [--strata]

If one region point per NN (a level) cannot predict the closed loop (``benchmarks/fidelity.py``),
the richest error model qaopt measures might: the ``shaped`` model fitted to the candidate's own
on-policy residual and truth sequences (its bias, slope on the true value, correlation time,
bursts), injected at its own level. For each configuration the run folder ran closed-loop (the
records ``benchmarks/fidelity.py`` reads), both NNs are injected with their own processes, in the
example's simulator (100 m, ``--runs`` seeds of their own), twice: the slope held at the edges of
the band of true values it was measured on (the model as shipped), and extrapolated beyond it.
Prints the failing runs beside the configuration's closed-loop ground truth, with each NN's fitted
offset (its bias) and slope. ``--strata`` fits each process to the stress strata's drives as well (a run folder
recorded since the set ``cropfollow-seed2`` keeps them): states far from a centred start, so the slope is measured
over large headings and offsets instead of extrapolated to them.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
from fidelity import read_closed_loop

REPO = Path(__file__).resolve().parents[1]
NNS = ("heading", "distance")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, default=REPO / "docs" / "benchmarks" / "fidelity_device" / "run1")
    ap.add_argument("--runs", type=int, default=96)
    ap.add_argument("--strata", action="store_true", help="fit to the stress strata's drives too")
    args = ap.parse_args()

    from qaopt.calibrate.error_models import Shaped
    from qaopt.simulators.cropfollow import CropFollowEvaluator
    from qaopt.spec import load_spec

    spec = load_spec(REPO / "examples" / "cropfollow.yaml")
    evaluator = CropFollowEvaluator(**spec.evaluator.simulator.params)
    sequences = np.load(args.run_dir / "fidelity_residuals.npz")
    _, records = read_closed_loop(args.run_dir)

    def drives(name: str) -> list[str]:
        """The run folder's drive prefixes of one variant: on-policy (``name/``), and each stratum's with --strata."""
        kept = [k.rsplit("/residual/", 1) for k in sequences.files if k.startswith(f"{name}/") and "/residual/" in k]
        return sorted(f"{where}/%s/{i}" for where, i in kept if args.strata or where == name)

    def fit(name: str) -> Shaped:
        found = drives(name)
        if not found:
            raise SystemExit(f"{args.run_dir}: no residual sequences of {name}")
        return Shaped.fit([sequences[d % "residual"] for d in found], "l1", [sequences[d % "truth"] for d in found])

    seeds = list(range(9_000_000, 9_000_000 + args.runs))
    print(f"{args.runs} injection runs of {spec.evaluator.simulator.params['run_length_m']} m per configuration, "
          "each NN injected with its own fitted process\n")
    print("| # | heading (on-policy L1, offset, slope) | distance (on-policy L1, offset, slope) | closed loop (real NNs) "
          "| injected, slope held at the band | injected, slope extrapolated |")
    print("|---|---|---|---|---|---|")
    for rec in sorted(records, key=lambda r: r["id"]):
        models = {nn: fit(rec[nn]) for nn in NNS}
        cells = []
        for extrapolated in (False, True):
            injectors = {nn: (replace(m, truth_range=(-np.inf, np.inf)) if extrapolated else m).injector(
                {"metric": m.features.level}) for nn, m in models.items()}
            records_ = evaluator.evaluate(injectors, seeds)
            cells.append(f"{sum(r[spec.qos.metric] > spec.qos.max for r in records_)}/{args.runs}")
        described = [f"{rec[nn]} ({m.features.level:.4g}, {m.offset:+.3g}, {m.gain:+.2f})" for nn, m in models.items()]
        print(f"| {rec['id']} | {described[0]} | {described[1]} | {rec['failures']}/{rec['runs']} | {cells[0]} | "
              f"{cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
