"""Fidelity diagnosis: which closed-loop seeds the real NNs fail, across configurations, against the seeds
that injected errors fail.

    .venv/bin/python benchmarks/fidelity_scenes.py --closed-loop DIR [DIR ...] [--spec examples/cropfollow.yaml]
        [--inject heading=4.5,distance=0.0354 ...] [--json docs/benchmarks/fidelity_scenes.json]

``DIR`` is a fidelity ground-truth folder (``benchmarks/fidelity_closed_loop.py``): every configuration ran the same
seeds (validation's selection seeds, in order) and kept each run's QoS metric. A seed is one scene: its field, its
look and its start come from the seed alone. If a configuration's failures were spread like independent draws at its
failure rate, every seed would be failed by about as many configurations; if the real NNs fail where a *scene* is
hard for them, a few seeds carry most failures, across configurations of unrelated knobs.

Each ``--inject`` is one point of the error space (``nn=level`` for every calibrated NN): the spec's simulator runs the
same seeds with the spec's error model injecting that point, as calibration does, and the seeds it fails are listed beside the real ones. Seeds that real NNs fail and injected
errors do not are scenes that no region charted with injected errors sees. Writes ``--json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import REPO, read_closed_loop  # noqa: E402


def real_failures(folders: list[Path], goal) -> tuple[int, list[dict]]:
    """(runs per configuration, one row per configuration: its NNs, verdict and the run indices it failed)."""
    rows, runs = [], None
    for folder in folders:
        for rec in read_closed_loop(folder)[1]:
            if "qos" not in rec:
                raise SystemExit(f"{folder}: configuration {rec['id']} has no per-run records (recorded before the "
                                 "closed-loop script kept them)")
            runs = runs or len(rec["qos"])
            failed = [i for i, q in enumerate(rec["qos"]) if not goal.passes(q)]
            rows.append({"set": folder.name, "id": rec["id"], "verdict": rec["verdict"], "failed_runs": failed,
                         "nns": {k: v for k, v in rec.items() if isinstance(v, str) and k != "verdict"}})
    return runs or 0, rows


def injected_failures(spec, points: list[dict[str, float]], seeds: list[int], goal) -> list[dict]:
    """The run indices that the spec's error model, injected at each point, fails on ``seeds``."""
    from qaopt.region_calibration import build_calibration

    cal = build_calibration(spec)
    out = []
    for point in points:
        records = cal.evaluator.evaluate({nn: cal.models[nn].injector({"metric": level}) for nn, level in point.items()},
                                   seeds)
        out.append({"point": point, "failed_runs": [i for i, r in enumerate(records) if not goal.passes(r[goal.metric])]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--closed-loop", type=Path, nargs="+", required=True)
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "cropfollow.yaml")
    ap.add_argument("--inject", nargs="*", default=[], metavar="NN=LEVEL,NN=LEVEL",
                    help="points of the error space to inject on the same seeds (a level for every NN)")
    ap.add_argument("--json", type=Path, default=REPO / "docs" / "benchmarks" / "fidelity_scenes.json")
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    from qaopt.closed_loop import VALIDATION_SEED_BASE
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import goal_of

    spec = load_spec(args.spec)
    goal = goal_of(spec)
    runs, rows = real_failures(args.closed_loop, goal)
    seeds = [VALIDATION_SEED_BASE + i for i in range(runs)]
    by_seed = Counter(i for r in rows for i in r["failed_runs"])
    failing = [r for r in rows if r["failed_runs"]]
    injected = []
    if args.inject:
        points = []
        for text in args.inject:
            point = {nn: float(level) for nn, _, level in (part.partition("=") for part in text.split(","))}
            if set(point) != set(spec.nns):
                raise SystemExit(f"--inject {text!r}: give a level for each NN of {args.spec} ({', '.join(spec.nns)})")
            points.append(point)
        injected = injected_failures(spec, points, seeds, goal)

    out = {
        **prov,
        "seeds": seeds, "configurations": rows,
        "failures_by_seed": {str(seeds[i]): n for i, n in by_seed.most_common()},
        "configurations_failing": len(failing),
        "share_of_failures_on_top3_seeds": round(sum(n for _, n in by_seed.most_common(3)) / max(1, sum(by_seed.values())), 3),
        "injected": [{"point": p["point"], "failed_seeds": [seeds[i] for i in p["failed_runs"]]} for p in injected],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")

    print(f"{len(rows)} configurations x {runs} seeds; {len(failing)} failed at least one run, "
          f"{sum(by_seed.values())} failed runs in all\n")
    print("| seed | configurations that failed it | of those failing any |")
    print("|---|---|---|")
    for i, n in by_seed.most_common(12):
        print(f"| {seeds[i]} | {n} | {n}/{len(failing)} |")
    print(f"\nthe three most failed seeds hold {100 * out['share_of_failures_on_top3_seeds']:.0f} % of all failed runs")
    for p in out["injected"]:
        shown = ", ".join(f"{nn} {v:.4g}" for nn, v in p["point"].items())
        print(f"- injected at {shown}: {len(p['failed_seeds'])}/{runs} failed, seeds "
              f"{', '.join(str(s) for s in p['failed_seeds']) or 'none'}")


if __name__ == "__main__":
    main()
