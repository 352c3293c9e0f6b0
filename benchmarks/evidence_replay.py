"""Replay a run's closed-loop evidence into its calibrated region, one configuration's runs at a time.

    python benchmarks/evidence_replay.py --run-dir DIR [--trials 1 2 7] --json docs/benchmarks/evidence_replay.json

``DIR`` holds a ``qaopt optimize`` run's ``region.json`` (the calibrated region), ``closed_loop.json`` (every
configuration's closed-loop runs, in the order they were recorded) and ``result.json`` (the reference NNs' errors
and the aware study's trials). For the calibrated region and after each recorded configuration is folded in as this
qaopt folds it (``qaopt.stages.region.fold``), this says what the runs at that point decide (the fixed-sample test of
``qos.acceptance``) and whether the region holds the reference NNs' point and each of ``--trials`` (default: every
trial whose configuration ran closed-loop). Writes ``--json``: the date, the command and one row per step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--trials", type=int, nargs="*", help="aware trials to probe (default: those that ran closed-loop)")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    record = provenance()

    from qaopt.calibrate import ErrorRegion
    from qaopt.stages.region import ClosedLoopEvidence, fold

    missing = [n for n in ("region.json", "closed_loop.json", "result.json") if not (args.run_dir / n).is_file()]
    if missing:
        sys.exit(f"--run-dir {args.run_dir}: no {', '.join(missing)} there; give a qaopt optimize run's folder")
    region = ErrorRegion.load(args.run_dir / "region.json")
    runs = ClosedLoopEvidence.load(args.run_dir).runs
    result = json.loads((args.run_dir / "result.json").read_text())
    trials = {t["number"]: t["errors"] for t in result["studies"]["aware"]["trials"] if t.get("errors")}
    ran = [int(r.note.split(":")[0].removeprefix("trial ")) for r in runs if r.note.startswith("trial ")]
    probes = {"reference": result["reference"]["errors"],
              **{f"trial {n}": trials[n] for n in (args.trials if args.trials is not None else ran)}}
    rows = []
    for step in range(len(runs) + 1):
        folded = fold(region, runs[:step])
        run = runs[step - 1] if step else None
        row = {"folded": step, "configuration": run.note.split(":")[0] if run else "none (as calibrated)",
               "runs": f"{run.failures} of {run.passes + run.failures} failed" if run else "",
               "verdict": folded.acceptance.decide_fixed(run.failures, run.passes + run.failures).value if run else "",
               "holds": {name: folded.contains(errors) for name, errors in probes.items()}}
        outside = [name for name, inside in row["holds"].items() if not inside]
        print(f"{step:2d} {row['configuration']:>22} {row['runs']:>16} {row['verdict']:>9}  outside: "
              f"{', '.join(outside) or 'none'}", flush=True)
        rows.append(row)
    out = {**record, "certifier": region.certifier, "acceptance": region.acceptance.to_json(), "probes": probes,
           "rows": rows}
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
