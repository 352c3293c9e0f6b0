"""Scale out: closed-loop validation and a calibration with 1, 4, 8 and 16 workers.

    .venv/bin/python benchmarks/scale_out.py [--workers 1,4,8,16] [--runs 48] [--length 100]
                                             [--budget 20] [--skip-calibration] [--out docs/benchmarks/scale_out.json]

Validation: the shipped example's reference NNs (heading and distance) drive CropFollow
closed-loop for ``--runs`` seeded runs of ``--length`` metres, through
:func:`qaopt.closed_loop.validate_closed_loop`, on a local process pool of each size
(one worker: in this process, torch on one thread). The NNs are shipped to the workers by
value (:class:`qaopt.executor.ShippedNN`); each worker builds the simulator from the spec.
Calibration: the example's calibration (``--budget`` evaluations, its strategy and error
model) with a fresh trial cache for each worker count, so every run is simulated.

Writes ``{"validation": {"1": s, ...}, "validation_warmup": {...}, "calibration": {...},
"same_verdicts": bool, ...}`` with the machine, the sizes and each run's verdicts, and prints a
markdown table. ``validation`` is timed on a started pool; ``validation_warmup`` is the pool's
start plus one run per worker (spawned processes import torch and the simulator and compile its
kernels). Calibration times include starting its pool.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]


def validation_once(spec, workers: int, runs: int) -> tuple[float, float, dict]:
    import torch

    from qaopt.app_spec import load_entry_point
    from qaopt.closed_loop import validate_closed_loop
    from qaopt.executor import LocalPool, ShippedNN, SpecEvaluator
    from qaopt.spec_adapter import acceptance_of, goal_of, make_evaluator

    torch.set_num_threads(1)
    nns = {}
    for name, nn in spec.nns.items():
        module = load_entry_point(nn.model)(**nn.args).eval()
        nns[name] = ShippedNN(SimpleNamespace(key=name, nn=name, module=module, onnx_path=None, columns=None))
    def validate(n: int, **pool) -> tuple[float, dict]:
        start = time.perf_counter()
        v = validate_closed_loop(make_evaluator(spec), nns, goal_of(spec), acceptance_of(spec), n, trial=None,
                                 region_predicted_valid=True, **pool)
        return time.perf_counter() - start, {"runs": v.runs, "failures": v.failures, "verdict": v.verdict}

    # A run's pool lives through every stage, so validation meets started workers: the pool's start and each
    # worker's first run (imports, numba compilation) are timed apart, as a warm-up of one run per worker.
    if workers == 1:
        warmup, _ = validate(1)
        seconds, d = validate(runs)
    else:
        with LocalPool(workers) as pool:
            warmup, _ = validate(workers, executor=pool, remote=SpecEvaluator(spec))
            seconds, d = validate(runs, executor=pool, remote=SpecEvaluator(spec))
    return warmup, seconds, d


def calibration_once(spec, workers: int, budget: int) -> tuple[float, dict]:
    from qaopt.executor import LocalPool
    from qaopt.region_calibration import build_calibration

    with tempfile.TemporaryDirectory() as cache:
        cal = build_calibration(spec, cache_dir=cache)
        start = time.perf_counter()
        if workers == 1:
            region = cal.search(spec.calibration.strategy, budget, runs=spec.calibration.runs)
        else:
            with LocalPool(workers) as pool:
                cal.use(pool)
                region = cal.search(spec.calibration.strategy, budget, runs=spec.calibration.runs)
        seconds = time.perf_counter() - start
    points = [[o.errors, o.passes, o.failures, o.verdict.value] for o in region.observations]
    return seconds, {"evaluations": region.evaluations, "runs": region.trials, "points": points}


def write(path: str, result: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(REPO / "examples" / "cropfollow.yaml"))
    ap.add_argument("--workers", default="1,4,8,16")
    ap.add_argument("--runs", type=int, default=48, help="closed-loop validation runs")
    ap.add_argument("--length", type=float, default=100.0, help="metres per validation run (calibration: the spec's)")
    ap.add_argument("--budget", type=int, default=20, help="calibration evaluations")
    ap.add_argument("--skip-calibration", action="store_true")
    ap.add_argument("--skip-validation", action="store_true")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "scale_out.json"))
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    from qaopt.spec import load_spec

    spec = load_spec(args.spec)
    sim = spec.evaluator.simulator
    sim = sim.model_copy(update={"params": {**sim.params, "run_length_m": args.length}})
    short = spec.model_copy(update={"evaluator": spec.evaluator.model_copy(update={"simulator": sim})})
    counts = [int(w) for w in args.workers.split(",")]
    result: dict = {"validation": {}, "validation_warmup": {}, "calibration": {}, "details": {"validation": {}, "calibration": {}},
                    **prov, "usable_cores": len(os.sched_getaffinity(0)),
                    "sizes": {"validation_runs": args.runs, "run_length_m": args.length,
                              "calibration_budget": args.budget, "calibration_run_length_m": spec.evaluator.simulator.params.get("run_length_m")}}
    for w in counts:
        if not args.skip_validation:
            warmup, s, d = validation_once(short, w, args.runs)
            result["validation"][str(w)] = round(s, 2)
            result["validation_warmup"][str(w)] = round(warmup, 2)
            result["details"]["validation"][str(w)] = d
            print(f"validation, {w} worker(s): {s:.1f} s after a warm-up of {warmup:.1f} s, {d}", flush=True)
        if not args.skip_calibration:
            s, d = calibration_once(spec, w, args.budget)
            result["calibration"][str(w)] = round(s, 2)
            result["details"]["calibration"][str(w)] = d
            print(f"calibration, {w} worker(s): {s:.1f} s, {d['evaluations']} evaluations, {d['runs']} runs", flush=True)
        write(args.out, result)  # after each count: a run cut short keeps what it measured
    same = all(len({json.dumps(d, sort_keys=True) for d in result["details"][k].values()}) <= 1
               for k in ("validation", "calibration"))
    result["same_verdicts"] = same
    result["load_average_at_end"] = round(os.getloadavg()[0], 2)
    write(args.out, result)
    print("\n| workers | pool start + warm-up s | validation s | speedup | calibration s | speedup |\n"
          "|---|---|---|---|---|---|")
    v1, c1 = result["validation"].get("1"), result["calibration"].get("1")
    for w in counts:
        v, c, up = (result[k].get(str(w)) for k in ("validation", "calibration", "validation_warmup"))
        print(f"| {w} | {up if up is not None else '-'} | {v if v is not None else '-'} | {f'{v1 / v:.2f}x' if v and v1 else '-'} | "
              f"{c if c is not None else '-'} | {f'{c1 / c:.2f}x' if c and c1 else '-'} |")
    print(f"same verdicts and region for every worker count: {same}; wrote {args.out}")


if __name__ == "__main__":
    main()
