"""Error models fitted to CropFollow's reference NNs, and what each does to the calibrated region.

    .venv/bin/python benchmarks/calibrate_empirical.py [--budget 20]

Measures the reference heading and distance NNs on their time-ordered validation
drives (through qaopt.approx, cached), fits the Gaussian, AR(1) and empirical
(block bootstrap) error models to their residuals, then calibrates the shipped
spec with each model (``monotone`` strategy, same budget and seeds) and reports
the fitted parameters and the size of each region (share of the error space that
is certified / predicted valid). Prints markdown tables.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from scipy.stats import qmc

from qaopt.app_spec import load
from qaopt.app_spec.nn_errors import error_metric
from qaopt.calibrate import AR1, Empirical, Gaussian
from qaopt.region_calibration import build_calibration
from qaopt.on_policy import reference_residuals
from qaopt.spec_adapter import cache_dir_of

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(REPO / "examples" / "cropfollow.yaml"))
    ap.add_argument("--budget", type=int, default=20)
    args = ap.parse_args()
    spec = load(args.spec)
    residuals = {nn: reference_residuals(spec, nn, cache_dir_of(spec))[0] for nn in ("heading", "distance")}

    print("| NN | drives x frames | L1 | std | max abs | bias/sigma | lag-1 autocorrelation | AR(1) correlation steps "
          "| bootstrap block |")
    print("|---|---|---|---|---|---|---|---|---|")
    for nn, seqs in residuals.items():
        r = np.concatenate(seqs)
        lag1 = np.mean([np.corrcoef(s[:-1], s[1:])[0, 1] for s in seqs if len(s) > 2])
        print(f"| {nn} | {len(seqs)} x {len(seqs[0])} | {error_metric('l1', r):.4g} | {r.std():.4g} | "
              f"{np.abs(r).max():.3g} | "
              f"{Gaussian.fit(seqs).bias_ratio:.2f} | {lag1:.2f} | {AR1.fit(seqs).correlation_steps:.1f} | "
              f"{Empirical(seqs).block_length} |")

    U = qmc.Sobol(2, scramble=True, seed=0).random(4096)
    own = {nn: error_metric(spec.nns[nn].error_metric.kind, np.concatenate(seqs)) for nn, seqs in residuals.items()}
    tiny = {nn: v / 15 for nn, v in own.items()}
    print(f"\nVerdicts at the reference NNs' own L1 errors ({', '.join(f'{k}={v:.3g}' for k, v in own.items())}) "
          f"and at 1/15 of them.\n")
    print("| error model | evaluations | trials | certified share | predicted share | own errors | 1/15 of them | search s |")
    print("|---|---|---|---|---|---|---|---|")
    for model in ("gaussian", "ar1", "empirical"):
        s = spec.model_copy(update={"calibration": spec.calibration.model_copy(update={"error_model": model})})
        cal = build_calibration(s, residuals=residuals)
        t0 = time.time()
        region = cal.search("monotone", args.budget)
        seconds = time.time() - t0
        at_own, at_tiny = (cal.evaluate(e) for e in (own, tiny))
        print(f"| {model} | {region.evaluations} | {region.trials} | {region.contains_unit(U).mean():.1%} | "
              f"{region.contains_unit(U, 'predicted').mean():.1%} | {at_own.verdict.value} ({at_own.failures}/{at_own.trials} failed) | "
              f"{at_tiny.verdict.value} ({at_tiny.failures}/{at_tiny.trials} failed) | {seconds:.0f} |")
        region.plot(REPO / "docs" / "benchmarks" / f"calibrate_region_{model}.png")


if __name__ == "__main__":
    main()
