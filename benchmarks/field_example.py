"""The worked example of docs/field.md: simulated field trials change a calibrated region.

The CropFollow simulator plays both parts. Calibration runs it as the simulator
(seeds 0, 1, ...); the "field" is the same simulator with harder parameters
(narrower rows, curvier rows, faster driving, more wheel slip and terrain noise)
and seeds from another family (1,000,000 on), so that it disagrees with the
simulator the way a real field would. Field runs are logged through the robot-side
API (``qaopt.field.Run``) and, for one robot, through a CSV import; then the
``qaopt field`` commands summarize them, fold them into the region and plan the
next trial. Every command's output below is real and printed as markdown.

    .venv/bin/python benchmarks/field_example.py [WORKDIR]   # default runs/field-example
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from qaopt.app_spec import load
from qaopt.calibrate import ErrorRegion, Verdict
from qaopt.field import Run, Store
from qaopt.field.evidence import apply_evidence, certified_fraction, collect_evidence
from qaopt.field.plan import plan
from qaopt.region_calibration import calibrate_spec
from qaopt.simulators.cropfollow import CropFollowEvaluator
from qaopt.region_calibration import error_models_of
from qaopt.spec_adapter import acceptance_of, goal_of, space_of

REPO = Path(__file__).resolve().parents[1]
HARDER_FIELD = {
    "field": {"row_spacing_m": 0.70, "curvature_max_per_m": 0.04},
    "robot": {"cruise_speed_mps": 0.7, "speed_slip_std": 0.06, "turn_noise_std_radps": 0.15},
    "initial_lateral_m": 0.06,
}
FIELD_SEEDS = 1_000_000
ROUNDS = 5


def sh(workdir: Path, *args: str) -> str:
    """Run a `qaopt` command in ``workdir`` and return what it printed (as a user sees it)."""
    exe = Path(sys.executable).with_name("qaopt")
    out = subprocess.run([str(exe), *args], cwd=workdir, capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    text = (out.stdout + out.stderr).rstrip()
    print(f"```\n$ qaopt {' '.join(args)}\n{text}\n```\n")
    return text


class FieldStandIn:
    """Drives 'field' runs at a point and logs each one as the robot would."""

    def __init__(self, spec, store: Store):
        self.spec, self.store = spec, store
        params = {**spec.evaluator.simulator.params, **HARDER_FIELD}
        self.robot = CropFollowEvaluator(**params)
        self.models = error_models_of(spec)
        self.next_seed = FIELD_SEEDS
        self.clock = datetime(2026, 6, 2, 8, 0, tzinfo=timezone.utc)

    def drive(self, point: dict[str, float], runs: int, acceptance, config: dict | None = None) -> tuple[int, int]:
        """Up to ``runs`` runs, stopping as soon as the pooled field verdict is decided."""
        injectors = {nn: self.models[nn].injector({"metric": v}) for nn, v in point.items()}
        passes = failures = 0
        for _ in range(runs):
            (rec,) = self.robot.evaluate(injectors, [self.next_seed])
            self.next_seed += 1
            with Run(self.store, self.spec.app.name, config=config or {"hash": "reference"},
                     error_point=None if config else point, operator="sim-field",
                     conditions={"crop": "maize", "growth_stage": "V8", "weather": "dry", "light": "overcast",
                                 "row_spacing_m": HARDER_FIELD["field"]["row_spacing_m"]}) as run:
                for _ in range(int(rec["collisions"])):
                    run.event("collision")
                for _ in range(int(rec["interventions"])):
                    run.event("intervention")
                run.end(distance_m=rec["distance_m"])
            failures += rec["collisions"] > 0
            passes += rec["collisions"] == 0
            if acceptance.decide_fixed(failures, passes + failures) is not Verdict.UNDECIDED:
                break
        return passes, failures


def main(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    data = yaml.safe_load((REPO / "examples" / "cropfollow.yaml").read_text())
    data["evaluator"]["field"] = {"store": "field.db"}
    # The calibration docs/field.md was recorded with (before the example moved to the AR(1) model
    # and a narrower space): ApproxCaliper's white Gaussian errors over the wide space, the optimistic
    # simulator that field runs are there to correct.
    data["calibration"].update(error_model="gaussian", space=[{"nn": "heading", "max": 30.0}, {"nn": "distance", "max": 0.25}])
    data["output"] = {"dir": ".", "cache_dir": ".qaopt-cache"}
    spec_path = workdir / "cropfollow.yaml"
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load(spec_path, check_entry_points=False)
    space, test, goal = space_of(spec), acceptance_of(spec), goal_of(spec)

    print(f"# Field example ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)\n")
    t0 = time.perf_counter()
    region, _ = calibrate_spec(spec)  # as `qaopt calibrate`: writes region.json and region.png
    print(f"Simulator calibration: {region.evaluations} evaluations, {region.trials} runs, "
          f"{time.perf_counter() - t0:.0f} s; certified valid share of the error space "
          f"{certified_fraction(region):.1%}.\n")

    print("## Plan before any field run\n")
    sh(workdir, "field", "plan", "cropfollow.yaml")

    with Store(spec.evaluator.field.store) as store:
        field = FieldStandIn(spec, store)
        for r in range(1, ROUNDS + 1):
            current = ErrorRegion.load(workdir / "region.json")
            apply_evidence(current, collect_evidence(store.runs(application=spec.app.name), space, goal).evidence)
            best = plan(current, top=1)[0]
            point = best.candidate.errors
            p, f = field.drive(point, best.runs or 1, test)
            print(f"Field day {r}: the plan's first proposal, {fmt(point)}: {p + f} run(s), {f} with a "
                  f"collision -> {test.decide_fixed(f, p + f).value} in the field "
                  f"(the simulator region {'contains' if region.contains(point) else 'excludes'} it).\n")

        # The second robot's log arrives as a spreadsheet: a deployed configuration.
        cfg_point = {"heading": 7.0, "distance": 0.07}
        rows, seed = [], 2_000_000
        injectors = {nn: field.models[nn].injector({"metric": v}) for nn, v in cfg_point.items()}
        for i, rec in enumerate(field.robot.evaluate(injectors, list(range(seed, seed + 45)))):
            start = datetime(2026, 6, 3, 9, 0, tzinfo=timezone.utc) + timedelta(minutes=10 * i)
            rows.append({"application": "cropfollow", "started_at": start.isoformat(),
                         "ended_at": (start + timedelta(seconds=rec["distance_m"] / 0.7)).isoformat(),
                         "distance_m": f"{rec['distance_m']:.2f}", "operator": "robot-2",
                         "config.hash": "prune-h50-d40", "config.knobs": '{"heading": {"prune": 0.5}, "distance": {"prune": 0.4}}',
                         "config.nn_errors.heading": cfg_point["heading"], "config.nn_errors.distance": cfg_point["distance"],
                         "conditions.crop": "maize", "collisions": int(rec["collisions"]),
                         "interventions": int(rec["interventions"])})
        with open(workdir / "robot2.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        bad = (workdir / "robot2.csv").read_text().splitlines()
        bad[7] = bad[7].replace("2026-06-03", "2026-13-03", 1)
        (workdir / "robot2-typo.csv").write_text("\n".join(bad) + "\n")

    print("## Importing the second robot's spreadsheet\n")
    sh(workdir, "field", "import", "robot2-typo.csv", "--spec", "cropfollow.yaml")
    sh(workdir, "field", "import", "robot2.csv", "--spec", "cropfollow.yaml")
    sh(workdir, "field", "import", "robot2.csv", "--spec", "cropfollow.yaml")

    print("## Summary\n")
    sh(workdir, "field", "summary", "--spec", "cropfollow.yaml")
    print("## The field evidence changes the region\n")
    sh(workdir, "field", "evidence", "cropfollow.yaml", "-o", "region-field.json")
    ErrorRegion.load(workdir / "region-field.json").plot(workdir / "region-field.png")
    print("## Plan after the field days\n")
    sh(workdir, "field", "plan", "cropfollow.yaml")
    print(f"Total wall time {time.perf_counter() - t0:.0f} s.")


def fmt(point: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in point.items())


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "runs" / "field-example")
