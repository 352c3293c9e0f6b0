"""LaneKeep, the second shipped application: QoS under injected error, NNs in the loop,
the calibrated 3-NN region, and `qaopt optimize` quick and default.

    .venv/bin/python benchmarks/lanekeep.py qos [--seeds 32]        # QoS vs injected error, per NN and kind
    .venv/bin/python benchmarks/lanekeep.py loop [--seeds 50]       # the reference NNs in the loop
    .venv/bin/python benchmarks/lanekeep.py calibrate               # the spec's region and its plot
    .venv/bin/python benchmarks/lanekeep.py optimize --profile quick|default
    .venv/bin/python benchmarks/lanekeep.py optimize --result RUN/result.json   # a run made elsewhere

Each part prints a markdown table for docs/BENCHMARKS.md and merges its figures into
``docs/benchmarks/lanekeep.json`` (``--json`` elsewhere): ``nns``, ``quick_seconds``,
``aware_over_agnostic``, ``validation_runs``, ``violation_free_runs`` (the application's
safety metric is ``violations``: collisions, lane departures, missed stops and late
arrivals, so the issue's ``collision_free_runs`` is named after it), and a section per part.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "examples" / "lanekeep.yaml"
JSON = REPO / "docs" / "benchmarks" / "lanekeep.json"
PLOT = REPO / "docs" / "benchmarks" / "lanekeep_region.png"
SAFETY = ("collisions", "lane_departures", "missed_stops")
LEVELS = 6  # injected error levels per NN, from 0 to the axis' max


def _spec():
    from qaopt.spec import load_spec

    return load_spec(SPEC)


def part_qos(seeds: int) -> dict:
    """Each NN alone with injected error (the spec's error model, its own metric), the others perfect."""
    from qaopt.region_calibration import error_models_of
    from qaopt.spec_adapter import make_evaluator

    spec = _spec()
    evaluator, models = make_evaluator(spec), error_models_of(spec)
    seed_list = list(range(10_000, 10_000 + seeds))
    rows = {}
    print(f"| NN | kind | injected error ({spec.calibration.error_model}) | runs | violation-free | "
          + " | ".join(SAFETY) + " | mean time ratio | ms per run |")
    print("|---|---|---|---|---|" + "---|" * len(SAFETY) + "---|---|")
    for axis in spec.calibration.space:
        kind = spec.nns[axis.nn].error_metric.kind
        rows[axis.nn] = []
        for level in np.linspace(axis.min, axis.max, LEVELS):
            start = time.perf_counter()
            records = evaluator.evaluate({axis.nn: models[axis.nn].injector({"metric": float(level)})}, seed_list)
            ms = 1000 * (time.perf_counter() - start) / seeds
            row = {"level": float(level), "runs": seeds, "ms_per_run": ms,
                   "violation_free": sum(r[spec.qos.metric] <= spec.qos.max for r in records),
                   **{k: float(sum(r[k] for r in records)) for k in SAFETY},
                   "mean_time_ratio": float(np.mean([r["time_ratio"] for r in records]))}
            rows[axis.nn].append(row)
            print(f"| {axis.nn} | {kind} | {level:.3g} | {seeds} | {row['violation_free']} | "
                  + " | ".join(f"{row[k]:.0f}" for k in SAFETY) + f" | {row['mean_time_ratio']:.3f} | {ms:.1f} |")
    return {"qos_vs_error": {"error_model": spec.calibration.error_model, "rows": rows}}


def part_loop(seeds: int) -> dict:
    """The three reference NNs reading rendered frames, closed loop, one run per seed."""
    import torch

    from qaopt.app_spec import load_entry_point
    from qaopt.simulators.perception import torch_perception
    from qaopt.spec_adapter import make_evaluator

    torch.set_num_threads(2)
    spec = _spec()
    evaluator = make_evaluator(spec)
    nns = {n: torch_perception(load_entry_point(s.model)(**s.args)) for n, s in spec.nns.items()}
    seed_list = list(range(20_000, 20_000 + seeds))
    start = time.perf_counter()
    records = []
    for i in range(0, seeds, 8):
        records += evaluator.evaluate_perception(nns, seed_list[i : i + 8], render_threads=2)
    seconds = time.perf_counter() - start
    free = sum(r[spec.qos.metric] <= spec.qos.max for r in records)
    out = {"runs": seeds, "violation_free": free, "seconds": seconds,
           **{k: float(sum(r[k] for r in records)) for k in (*SAFETY, "phantom_stops")},
           "mean_time_ratio": float(np.mean([r["time_ratio"] for r in records])),
           "worst_seeds": [s for s, r in zip(seed_list, records) if r[spec.qos.metric] > spec.qos.max][:10]}
    print("| runs | violation-free | " + " | ".join((*SAFETY, "phantom_stops")) + " | mean time ratio | seconds |")
    print("|---|---|" + "---|" * (len(SAFETY) + 1) + "---|---|")
    print(f"| {seeds} | {free} | " + " | ".join(f"{out[k]:.0f}" for k in (*SAFETY, "phantom_stops"))
          + f" | {out['mean_time_ratio']:.3f} | {seconds:.0f} |")
    return {"nns_in_the_loop": out}


def part_calibrate(out: Path) -> dict:
    """The spec's calibration (its strategy, budget and error model), its region plotted over every pair of axes."""
    from qaopt.region_calibration import calibrate_spec

    spec = _spec()
    start = time.perf_counter()
    region, folder = calibrate_spec(spec, spec.calibration.strategy, spec.calibration.budget, out)
    seconds = time.perf_counter() - start
    PLOT.write_bytes((Path(folder) / "region.png").read_bytes())
    points = [{"errors": o.errors, "passes": o.passes, "failures": o.failures, "verdict": o.verdict.value}
              for o in region.observations]
    print(f"calibration: {region.evaluations} evaluations, {region.trials} runs, {seconds:.0f} s; plot {PLOT}")
    print("\n| point | passes | failures | verdict |\n|---|---|---|---|")
    for p in points:
        print(f"| {', '.join(f'{k} {v:.3g}' for k, v in p['errors'].items())} | {p['passes']} | {p['failures']} | {p['verdict']} |")
    return {"calibration": {"axes": [a.key for a in spec.calibration.space], "evaluations": region.evaluations,
                            "runs": region.trials, "seconds": seconds, "points": points}}


def part_optimize(profile: str, out: Path, result: Path | None = None) -> dict:
    """Run `qaopt optimize` (or read a finished run's ``result.json``, e.g. one made by benchmarks/real_result.py)."""
    from qaopt import optimize
    from qaopt.result import Result

    start = time.perf_counter()
    r = Result.load(result) if result is not None else optimize(SPEC, profile=profile, out=out)
    wall = sum(r.seconds.values()) if result is not None else time.perf_counter() - start
    print(f"`qaopt optimize examples/lanekeep.yaml --profile {r.profile}`: {wall / 60:.1f} min")
    print("\n| configuration | latency/frame (ms) | speedup vs reference | " + " | ".join(r.reference.nns) + " |")
    print("|---|---|---|" + "---|" * len(r.reference.nns))
    for name, c in (("reference", r.reference), ("application-agnostic", r.agnostic), ("application-aware", r.aware)):
        if c is None:
            print(f"| {name} | — | — |" + " |" * len(r.reference.nns))
            continue
        nns = [f"prune {n.knobs['prune_ratio']:.2f}, {n.knobs['dtype']}, {n.metric} {n.error:.3g}, {n.backend} "
               f"{n.latency_ms:.2f} ms" for n in c.nns.values()]
        print(f"| {name} | {c.latency_ms:.2f} | {r.reference.latency_ms / c.latency_ms:.2f}x | " + " | ".join(nns) + " |")
    s = r.speedups
    print(f"\naware over agnostic: {s.aware_over_agnostic}; aware {s.aware}, agnostic {s.agnostic} over the reference")
    print("\n| validated trial | runs | passes | failures | verdict | region said valid |\n|---|---|---|---|---|---|")
    for v in r.validations:
        print(f"| {'reference' if v.trial is None else v.trial} | {v.runs} | {v.passes} | {v.failures} | {v.verdict} "
              f"| {v.region_predicted_valid} |")
    chosen = next((v for v in r.validations if r.aware is not None and v.trial == r.aware.trial), None)
    figures = {"profile": r.profile, "seconds": wall, "from_result": None if result is None else str(result), "aware_over_agnostic": s.aware_over_agnostic,
               "aware": s.aware, "agnostic": s.agnostic, "aware_accepted": r.aware_accepted,
               "chosen_validation": None if chosen is None else chosen.model_dump(mode="json"),
               "stages": r.seconds, "run_folder": str(out)}
    top = {"quick_seconds": wall} if r.profile == "quick" else {
        "aware_over_agnostic": s.aware_over_agnostic,
        "validation_runs": None if chosen is None else chosen.runs,
        "violation_free_runs": None if chosen is None else chosen.passes}
    return {**top, f"optimize_{r.profile}": figures}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["qos", "loop", "calibrate", "optimize"])
    ap.add_argument("--seeds", type=int, default=None, help="runs per row (qos: 32, loop: 50)")
    ap.add_argument("--profile", default="quick")
    ap.add_argument("--out", type=Path, default=None, help="run folder (default: runs/lanekeep-<part>)")
    ap.add_argument("--result", type=Path, default=None, help="optimize: read this finished run's result.json instead")
    ap.add_argument("--json", type=Path, default=JSON)
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()
    out = args.out or REPO / "runs" / f"lanekeep-{args.part if args.part != 'optimize' else args.profile}"
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}\n")
    if args.part == "qos":
        figures = part_qos(args.seeds or 32)
    elif args.part == "loop":
        figures = part_loop(args.seeds or 50)
    elif args.part == "calibrate":
        figures = part_calibrate(out)
    else:
        figures = part_optimize(args.profile, out, args.result)
    data = json.loads(args.json.read_text()) if args.json.exists() else {}
    data.update({**prov, "nns": len(_spec().nns), **figures})  # the provenance of the part written last
    args.json.write_text(json.dumps(data, indent=1, default=float) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
