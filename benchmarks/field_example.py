"""The worked example of docs/field.md: simulated field trials change a calibrated region.

The CropFollow simulator plays both parts. Calibration runs it as the simulator
(seeds 0, 1, ...); the "field" is the same simulator with harder parameters
(narrower rows, curvier rows, faster driving, more wheel slip and terrain noise)
and seeds from another family (1,000,000 on), so that it disagrees with the
simulator the way a real field would. Field runs are logged through the robot-side
API (``qaopt.field.Run``), for a second robot through a CSV import, and for a third
through the ROS 2 bag it recorded (``qaopt field import-bag``: several runs, odometry at
50 Hz, bumper and operator events, one corrupt message); then the ``qaopt field``
commands summarize them, fold them into the region and plan the next trial. Every
command's output below is real and printed as markdown.

    .venv/bin/python benchmarks/field_example.py [WORKDIR]   # default runs/field-example
"""

from __future__ import annotations

import csv
import math
import os
import random
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from qaopt.app_spec import load
from qaopt.calibrate import ErrorRegion, Verdict
from qaopt.field import Run, Store, ros_events
from qaopt.field.evidence import apply_evidence, certified_fraction, collect_evidence
from qaopt.field.plan import plan
from qaopt.field.synthetic_bag import SyntheticBag
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
BAG_CONFIG = {"hash": "prune-h30-d55", "knobs": {"heading": {"prune": 0.3}, "distance": {"prune": 0.55}},
              "nn_errors": {"heading": 4.5, "distance": 0.12}}
BAG_RUNS = 12


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
    # The third robot's bag: bumper hits on /bumper (std_msgs/Bool), the rest in qaopt's convention.
    data["evaluator"]["field"] = {"store": "field.db",
                                  "bag": {"events": {"/qaopt/events": "json", "/bumper": "collision"}}}
    # The calibration docs/field.md's worked example uses (not the shipped spec's AR(1) model and narrower
    # space): ApproxCaliper's white Gaussian errors over the wide space, the optimistic simulator that field
    # runs are there to correct.
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

        bag_runs = record_bag(field, workdir / "robot3" / "robot3_0.mcap", test)

    print("## Importing the second robot's spreadsheet\n")
    sh(workdir, "field", "import", "robot2-typo.csv", "--spec", "cropfollow.yaml")
    sh(workdir, "field", "import", "robot2.csv", "--spec", "cropfollow.yaml")
    sh(workdir, "field", "import", "robot2.csv", "--spec", "cropfollow.yaml")

    print("## Importing the third robot's ROS 2 bag\n")
    print(f"`robot3/robot3_0.mcap`: {bag_runs['runs']} runs of configuration {BAG_CONFIG['hash']}, "
          f"{bag_runs['messages']} messages ({bag_runs['odometry']} odometry at 50 Hz), "
          f"{bag_runs['bytes'] / 1e6:.1f} MB; {bag_runs['collisions']} bumper hit(s), "
          f"{bag_runs['interventions']} intervention(s); one odometry message corrupt.\n")
    sh(workdir, "field", "import-bag", "robot3", "--spec", "cropfollow.yaml")
    sh(workdir, "field", "import-bag", "robot3", "--spec", "cropfollow.yaml", "--skip-bad")
    sh(workdir, "field", "import-bag", "robot3", "--spec", "cropfollow.yaml", "--skip-bad")

    print("## Summary\n")
    sh(workdir, "field", "summary", "--spec", "cropfollow.yaml")
    print("## The field evidence changes the region\n")
    sh(workdir, "field", "evidence", "cropfollow.yaml", "-o", "region-field.json")
    ErrorRegion.load(workdir / "region-field.json").plot(workdir / "region-field.png")
    print("## Plan after the field days\n")
    sh(workdir, "field", "plan", "cropfollow.yaml")
    print(f"Total wall time {time.perf_counter() - t0:.0f} s.")


def record_bag(field: FieldStandIn, path: Path, acceptance) -> dict:
    """The third robot's bag, as ``ros2 bag record -s mcap`` writes it: runs of one deployed
    configuration driven by the stand-in (stopping once the verdict is decided), odometry at
    50 Hz along each row, the bumper as a std_msgs/Bool, interventions, the configuration latched
    at the start, the day's conditions as MCAP metadata, and one odometry message corrupted."""
    rng = random.Random(3)
    point = BAG_CONFIG["nn_errors"]
    injectors = {nn: field.models[nn].injector({"metric": v}) for nn, v in point.items()}
    speed, hz, ns = 0.7, 50, 1_000_000_000
    t0 = round(datetime(2026, 6, 4, 8, 0, tzinfo=timezone.utc).timestamp()) * ns
    held = {"runs": 0, "messages": 0, "odometry": 0, "collisions": 0, "interventions": 0}
    path.parent.mkdir(parents=True)
    passes = failures = 0
    with SyntheticBag(path) as bag:
        bag.metadata("qaopt", {"crop": "maize", "growth_stage": "V10", "weather": "dry", "field": "plot-C",
                               "operator": "robot-3"})
        bag.string("/qaopt/config", ros_events.config(**BAG_CONFIG), t0)
        bag.channel("/bumper", "std_msgs/msg/Bool")
        bag.channel("/qaopt/events", "std_msgs/msg/String")
        for k in range(BAG_RUNS):
            (rec,) = field.robot.evaluate(injectors, [field.next_seed])
            field.next_seed += 1
            start = t0 + (60 + 300 * k) * ns
            n = int(rec["distance_m"] / speed * hz)
            hits = sorted(rng.randrange(n) for _ in range(int(rec["collisions"])))
            takeovers = sorted(rng.randrange(n) for _ in range(int(rec["interventions"])))
            bag.string("/qaopt/run", ros_events.run_start(), start)
            for i in range(n + 1):
                t = start + i * ns // hz
                s = speed * i / hz
                y = 0.02 * math.sin(s / 7.0)  # the row wanders a little; odometry follows it
                if k == 2 and i == n // 2:
                    bag.raw("/odom", "nav_msgs/msg/Odometry", b"\x00\x01\x00\x00\x10\x00\x00", t)
                else:
                    bag.odometry(t, s, y, 0.0, speed)
                held["odometry"] += 1
                if i in hits:
                    bag.write("/bumper", "std_msgs/msg/Bool", {"data": True}, t + 1_000_000)
                    bag.write("/bumper", "std_msgs/msg/Bool", {"data": False}, t + 200_000_000)
                if i in takeovers:
                    bag.string("/qaopt/events", ros_events.event("intervention", reason="drifted"), t + 1_000_000)
            bag.string("/qaopt/run", ros_events.run_end(), start + (n + 1) * ns // hz)
            held["runs"] += 1
            held["collisions"] += len(hits)
            held["interventions"] += len(takeovers)
            failures += rec["collisions"] > 0
            passes += rec["collisions"] == 0
            if acceptance.decide_fixed(failures, passes + failures) is not Verdict.UNDECIDED:
                break
    held["messages"] = held["odometry"] + 2 * held["collisions"] + held["interventions"] + 2 * held["runs"] + 1
    held["bytes"] = path.stat().st_size
    return held


def fmt(point: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in point.items())


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "runs" / "field-example")
