"""Fidelity diagnosis: each configuration's errors on drives its own NNs steer.

    .venv/bin/python benchmarks/fidelity_self_steered.py --only 0,2,25,26,27 [--drives 16] [--steps 200]
        [--truth docs/benchmarks/fidelity_device/knobs-seed0] [--out FILE.json]

The product places a candidate by its error on drives the *reference* NNs steer (on-policy error
data) or on its data's drives, with stress strata beside them. Scaled CropFollow NNs fail the
closed loop at errors every region certifies, and their own fitted error processes, injected,
do not fail it (``fidelity_own_shape.py``): what fails is in the states they reach themselves.
This measures that directly. For each configuration of ``fidelity_closed_loop.CONFIGURATIONS``
(its NNs built as that script builds them, here on the CPU), ``record_perception`` drives the
simulator with the configuration's own NNs steering (``--drives`` drives of at most ``--steps``
steps, seeds of their own), and each NN's L1 is measured on those frames, beside the reference
NN's L1 on the same frames and the candidate's L1 on drives the reference NNs steer (the same
seeds). A drive that ends before ``--steps`` ended in a collision or left the row. Prints a
markdown table with the closed-loop ground truth of ``--truth`` (another machine's builds of the
same knobs) and writes the figures to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from fidelity import read_closed_loop
from fidelity_closed_loop import CONFIGURATIONS, InLoopNN, build_variants

REPO = Path(__file__).resolve().parents[1]
NNS = ("heading", "distance")
REFERENCE_PAIR = ("h-ref", "d-ref")
SEED_BASE = 12_000_000
"""Drive seeds of this diagnosis: disjoint from on-policy drives (7,000,000 +) and validation (5,000,000 +)."""


def l1(nn, recording) -> float:
    """``nn``'s L1 against the recording's truth on every frame, in batches."""
    idx = np.arange(len(recording.truth))
    pred = np.concatenate([np.asarray(nn(recording.inputs[idx[i:i + 64]])).reshape(-1)
                           for i in range(0, idx.size, 64)])
    return float(np.mean(np.abs(pred - recording.truth[:, 0])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "cropfollow.yaml")
    ap.add_argument("--only", required=True, help="comma-separated configuration indices")
    ap.add_argument("--drives", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: the spec's cache")
    ap.add_argument("--truth", type=Path, default=REPO / "docs" / "benchmarks" / "fidelity_device" / "knobs-seed0")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch  # noqa: F401 - imported before provenance(), which names the GPU torch sees
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    from qaopt.simulators.cropfollow import CropFollowEvaluator
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import cache_dir_of

    spec = load_spec(args.spec)
    cache = args.cache_dir or cache_dir_of(spec)
    chosen = [int(i) for i in args.only.split(",")]
    start = time.perf_counter()
    names = {v for i in chosen for v in CONFIGURATIONS[i]} | set(REFERENCE_PAIR)
    variants, _ = build_variants(spec, cache, "cpu", names, 0, lambda line: print(line, flush=True))
    nns = {n: InLoopNN(v["cand"], "cpu") for n, v in variants.items()}
    truth = {r["id"]: f"{r['failures']}/{r['runs']}" for r in read_closed_loop(args.truth)[1]} if args.truth else {}
    evaluator = CropFollowEvaluator(**spec.evaluator.simulator.params)
    seeds = [SEED_BASE + i for i in range(args.drives)]

    def drives(pair) -> dict:
        return evaluator.record_perception({nn: nns[name] for nn, name in zip(NNS, pair, strict=True)}, seeds,
                                           args.steps)

    by_reference = drives(REFERENCE_PAIR)
    rows = []
    for i in chosen:
        pair = CONFIGURATIONS[i]
        own = drives(pair)
        lengths = [len(s) for s in own["heading"].sequences]
        row = {"id": i, "variants": dict(zip(NNS, pair, strict=True)), "closed_loop": truth.get(i),
               "drives_ended_early": sum(n < args.steps for n in lengths), "mean_steps": float(np.mean(lengths))}
        for nn, name, reference in zip(NNS, pair, REFERENCE_PAIR, strict=True):
            row[nn] = {"reference_steered": l1(nns[name], by_reference[nn]), "self_steered": l1(nns[name], own[nn]),
                       "reference_nn_on_self_steered": l1(nns[reference], own[nn])}
        rows.append(row)
        print(f"configuration {i}: {json.dumps(row)}", flush=True)

    print(f"\n{args.drives} drives of at most {args.steps} steps each; L1 on drives the reference NNs steer -> on "
          "drives the configuration's own NNs steer (the reference NN on those same frames)\n")
    print("| # | heading | distance | closed loop | drives ended early | heading L1 | distance L1 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[nn]['reference_steered']:.4g} -> **{r[nn]['self_steered']:.4g}** "
                 f"({r[nn]['reference_nn_on_self_steered']:.4g})" for nn in NNS]
        print(f"| {r['id']} | {r['variants']['heading']} | {r['variants']['distance']} | {r['closed_loop'] or '-'} | "
              f"{r['drives_ended_early']}/{args.drives} | {cells[0]} | {cells[1]} |")
    if args.out is not None:
        args.out.write_text(json.dumps({**prov,
                                        "drives": args.drives, "steps": args.steps, "seed_base": SEED_BASE,
                                        "seconds": round(time.perf_counter() - start, 1), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
