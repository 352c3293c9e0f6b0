"""Knobs in the application: what a finished `qaopt optimize` run of a shipped example gained, into knobs.json.

The application goals are about whole runs, not the knob table: CropFollow's compact
NNs, default profile, aware over agnostic >= 3x with both configurations validated in >= 50
closed-loop runs; LaneKeep's default >= 2x. This script reads the run's ``result.json`` (the
run is made with the product's own command, on the machine the figure is for) and writes the
application's key of ``docs/benchmarks/knobs.json``, every other key kept:

    qaopt optimize examples/cropfollow.yaml --out /tmp/cf-default        # the default profile
    .venv/bin/python benchmarks/knobs_optimize.py cropfollow /tmp/cf-default/result.json

Run it on the machine that made the run, right after: it records that machine's CPU and load.
The aware configuration's validation is its acceptance on fresh seeds (the selection seeds'
runs are recorded beside it; a run older than fresh-seed acceptance has only those); the agnostic
one's is its run on the same fresh seeds. The goal also needs an agnostic baseline decided by its
NNs: a faster agnostic candidate its tolerance test left unresolved for want of validation frames
(``agnostic_unresolved``, as the report lists them; at most ``PRACTICAL_DATA_FACTOR`` times the frames
would decide it) means the baseline could be faster. Trials judged again on a second validation split
(``nns.<name>.data.more_validation``) are listed with their verdicts (``agnostic_second_looks``).
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import Any

from knobs import OUT, versions, write
from provenance import provenance

GOALS = {"cropfollow": 3.0, "lanekeep": 2.0}
"""Aware over agnostic each application's default profile should reach."""
VALIDATION_RUNS = 50
"""Closed-loop runs each side's validation needs for the ratio to count."""


def runs_of(validation) -> dict[str, Any] | None:
    if validation is None:
        return None
    return {"runs": validation.runs, "passes": validation.passes, "failures": validation.failures,
            "verdict": validation.verdict, "seed_base": validation.seed_base}


def nns_of(configuration) -> dict[str, Any] | None:
    if configuration is None:
        return None
    return {name: {"knobs": c.knobs, "error": c.error, "metric": c.metric, "backend": c.backend,
                   "latency_ms": c.latency_ms, "serves": c.serves} for name, c in configuration.nns.items()}


def record(app: str, result_path: Path) -> dict[str, Any]:
    """The application's entry: the ratio and its interval, both sides' validations and knobs, the goal's verdict."""
    from qaopt import kernels
    from qaopt.result import Result
    from qaopt.tolerance import PRACTICAL_DATA_FACTOR

    r = Result.load(result_path)
    interval = r.speedups.intervals.get("aware_over_agnostic")
    selection = [v for v in r.validations if r.aware is not None and v.trial == r.aware.trial]
    # Runs recorded before acceptance had fresh seeds of its own were accepted on the front's validation.
    aware_runs = runs_of(r.acceptance if r.acceptance is not None else (selection[-1] if selection else None))
    agnostic_runs = runs_of(r.agnostic_validation)
    ratio = r.speedups.aware_over_agnostic
    goal = GOALS[app]
    validated = all(v is not None and v["runs"] >= VALIDATION_RUNS and v["verdict"] == "valid"
                    for v in (aware_runs, agnostic_runs))
    # A faster agnostic candidate that its tolerance test could not decide for want of validation frames means the
    # baseline was held back by its data, not by its NNs: a ratio against it is no goal met.
    unresolved = {unit: u.model_dump(mode="json", include={"trial", "params", "quick_ms", "baseline_ms", "data_needed"})
                  for unit, u in (r.agnostic_rule.unresolved.items() if r.agnostic_rule is not None else ())}
    finished = dt.datetime.fromtimestamp(result_path.stat().st_mtime, dt.timezone.utc)
    return {
        "aware_over_agnostic": ratio,
        "interval": list(interval.ci) if interval is not None and interval.ci is not None else None,
        "interval_verdict": None if interval is None else interval.verdict,
        "aware_validation": aware_runs,
        "aware_validation_on": "fresh seeds" if r.acceptance is not None else "selection seeds",
        "aware_selection_validations": [runs_of(v) | {"trial": v.trial} for v in selection],
        "agnostic_validation": agnostic_runs,
        "validations": [runs_of(v) | {"configuration": v.name} for v in r.validations],
        "aware_accepted": r.aware_accepted,
        "aware_knobs": nns_of(r.aware),
        "agnostic_knobs": nns_of(r.agnostic),
        "reference_ms": r.reference.latency_ms,
        "aware_ms": None if r.aware is None else r.aware.latency_ms,
        "agnostic_ms": None if r.agnostic is None else r.agnostic.latency_ms,
        "agnostic_unresolved": unresolved,
        "agnostic_second_looks": [t.model_dump(mode="json", include={"unit", "trial", "params", "within", "latency_ms"})
                                  | {"frames": {n: j.frames for n, j in t.judged.items()}}
                                  for t in (r.agnostic_rule.second_looks if r.agnostic_rule is not None else ())],
        "aware_over_agnostic_by_point": r.speedups.aware_over_agnostic_by_point,
        "agnostic_by_point_knobs": nns_of(r.agnostic_by_point),
        "goal": {"aware_over_agnostic": goal, "validation_runs": VALIDATION_RUNS, "agnostic_resolved": True},
        "goal_met": ratio is not None and ratio >= goal and validated and not any(
            u["data_needed"] <= PRACTICAL_DATA_FACTOR for u in unresolved.values()),
        "fidelity": r.fidelity.model_dump(mode="json"),
        "profile": r.profile,
        "spec": r.spec,
        "result": str(result_path),
        "run_finished": finished.strftime("%Y-%m-%d %H:%M UTC"),
        "stage_seconds": r.seconds,
        **provenance(),
        "versions": versions(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("app", choices=sorted(GOALS))
    parser.add_argument("result", type=Path, help="the finished run's result.json")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    entry = record(args.app, args.result)
    write(args.out, args.app, entry)
    aware, agnostic = entry["aware_validation"], entry["agnostic_validation"]
    print(f"{args.app} ({entry['profile']} profile): aware over agnostic {entry['aware_over_agnostic']} "
          f"{entry['interval']}; aware validation {aware}; agnostic validation {agnostic}; goal "
          f"{GOALS[args.app]}x: {'met' if entry['goal_met'] else 'not met'}\nwrote {args.out} (key {args.app!r})")


if __name__ == "__main__":
    main()
