"""How long one closed-loop run takes with a run's chosen NNs in the loop, and with a merged NN's views sharing
one backbone run per frame batch or each running it.

    python benchmarks/closed_loop_speed.py RUN_DIR --spec examples/cropfollow.yaml --cache-dir DIR [--runs 2]

Rebuilds each side's NNs from the cache as ``benchmarks/side_by_side_fresh.py`` does (the bytes the run chose),
ships them as validation does (:class:`qaopt.executor.ShippedNN`) and times ``--runs`` seeded runs of the spec's
run length on one thread in this process, after one warm-up run, for the reference, aware and agnostic NNs. For a
side with a merged NN it also times the views each under a key of its own, so that each runs the backbone on every
frame, as every view did before the views shared it. Prints one JSON line per side and variant: the seconds of
each run, their median, and the records (the same for both variants: the views' outputs are the same).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

from side_by_side_fresh import rebuilt, run_arguments


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    run_arguments(ap)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()

    import torch

    from qaopt.app_spec import load_entry_point
    from qaopt.closed_loop import VALIDATION_SEED_BASE
    from qaopt.executor import ShippedNN
    from qaopt.spec import load_spec

    torch.set_num_threads(1)
    spec = load_spec(args.spec)
    simulator = spec.evaluator.simulator
    app = load_entry_point(simulator.entry_point)(**dict(simulator.params))
    seeds = [VALIDATION_SEED_BASE + i for i in range(args.runs)]
    result = json.loads((args.run_dir / "result.json").read_text())
    for side, built in rebuilt(spec, result, args.cache_dir).items():
        variants = {"shared": {n: ShippedNN(c) for n, (c, _) in built.items()}}
        if any(c.columns is not None for c, _ in built.values()):
            variants["each view"] = {n: ShippedNN(dataclasses.replace(c, key=f"{c.key}-{n}"))
                                     for n, (c, _) in built.items()}
        for variant, nns in variants.items():
            app.evaluate_perception(nns, [seeds[0] - 1])  # warm-up: kernels compiled, sessions opened
            seconds, records = [], []
            for seed in seeds:
                start = time.perf_counter()
                records += app.evaluate_perception(nns, [seed])
                seconds.append(round(time.perf_counter() - start, 2))
            print(json.dumps({"side": side, "variant": variant, "seconds": seconds,
                              "median_s": statistics.median(seconds), "records": records}), flush=True)


if __name__ == "__main__":
    main()
