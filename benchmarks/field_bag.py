"""How long importing a robot's bag takes, and that its memory does not grow with the bag.

Writes a 10-minute ROS 2 bag as rosbag2 records one (``qaopt.field.synthetic_bag``): odometry
at 50 Hz, ``sensor_msgs/CameraInfo`` at 30 Hz (the size of a camera's metadata stream, which
the import must read past), five runs of two minutes split on ``/qaopt/run``, a configuration
and a few events: about 48,000 messages. Each import runs in a fresh process into a fresh
store (``qaopt.field.bag.import_bag``, the same call as ``qaopt field import-bag``) and is
timed around that call alone; the median of the repeats is the figure. The same is done for
a bag three times as long: the peak memory of the process must stay the same, because the
bag is streamed chunk by chunk and only runs and events are kept.

    .venv/bin/python benchmarks/field_bag.py [--repeats 5] [--json docs/benchmarks/field_bag.json]

The machine's load average is recorded before the runs: on a shared machine the seconds are
inflated by the other jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
T0 = 1_780_000_000 * 1_000_000_000
RUN_S = 120  # back-to-back runs of two minutes: five in 10 minutes of recording
TARGET_S = 5.0

IMPORT = textwrap.dedent("""
    import json, resource, sys, time
    from qaopt.field import Store
    from qaopt.field.bag import import_bag
    import mcap.reader, mcap_ros2.decoder  # loaded before the clock starts, as a CLI run has them

    def rss_mb():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

    bag, db = sys.argv[1], sys.argv[2]
    store = Store(db)
    before = rss_mb()
    t = time.perf_counter()
    done = import_bag(store, bag, application="bench")
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    runs = store.runs()
    print(json.dumps({"seconds": seconds, "rss_before_mb": before, "peak_rss_mb": peak,
                      "runs": len(done.result.added), "distance_m": sum(r.distance_m for r in runs),
                      "events": sum(len(r.events) for r in runs)}))
""")


def write_bag(path: Path, minutes: int) -> dict:
    """A bag of ``minutes`` of recording; returns what it holds."""
    from qaopt.field import ros_events
    from qaopt.field.synthetic_bag import SyntheticBag

    ns = 1_000_000_000
    counts = {"odometry": 0, "camera_info": 0, "other": 0}
    runs = minutes * 60 // RUN_S
    with SyntheticBag(path) as bag:
        bag.string("/qaopt/config", ros_events.config("3f2a9c", nn_errors={"heading": 4.1}), T0)
        bag.channel("/qaopt/events", "std_msgs/msg/String")
        for k in range(runs):
            start = T0 + k * RUN_S * ns
            bag.string("/qaopt/run", ros_events.run_start({"weather": "dry"}, operator="ana"), start)
            for i in range(RUN_S * 50):
                t = start + i * 20_000_000
                bag.odometry(t, 0.012 * i, 0.0, 0.0, 0.6)
                counts["odometry"] += 1
                if i % 5 in (0, 2, 3):  # 30 of every 50 ticks: 30 Hz
                    bag.camera_info(t + 1_000_000)
                    counts["camera_info"] += 1
                if i == 3000:
                    bag.string("/qaopt/events", ros_events.event("collision"), t + 2_000_000)
                    counts["other"] += 1
            bag.string("/qaopt/run", ros_events.run_end(), start + RUN_S * ns - 1_000_000)
            counts["other"] += 2
        counts["other"] += 1
    return {"minutes": minutes, "runs": runs, "messages": sum(counts.values()), **counts,
            "bytes": path.stat().st_size}


def import_once(bag: Path, tmp: Path, i: int) -> dict:
    out = subprocess.run([sys.executable, "-c", IMPORT, str(bag), str(tmp / f"store-{bag.stem}-{i}.db")],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    if out.returncode != 0:
        raise SystemExit(f"import failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=REPO / "docs" / "benchmarks" / "field_bag.json")
    args = parser.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()
    results = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for minutes in (10, 30):
            bag = tmp / f"bag-{minutes}min.mcap"
            t = time.perf_counter()
            held = write_bag(bag, minutes)
            print(f"{minutes}-minute bag: {held['messages']} messages, {held['bytes'] / 1e6:.1f} MB "
                  f"(written in {time.perf_counter() - t:.0f} s)", flush=True)
            repeats = [import_once(bag, tmp, i) for i in range(args.repeats)]
            seconds = [r["seconds"] for r in repeats]
            row = {
                **held,
                "import_s_median": round(statistics.median(seconds), 3),
                "import_s": [round(s, 3) for s in seconds],
                "messages_per_s": round(held["messages"] / statistics.median(seconds)),
                "peak_rss_mb": round(max(r["peak_rss_mb"] for r in repeats), 1),
                "rss_before_import_mb": round(statistics.median(r["rss_before_mb"] for r in repeats), 1),
                "runs_imported": repeats[0]["runs"], "distance_m": round(repeats[0]["distance_m"], 2),
                "events": repeats[0]["events"],
            }
            results.append(row)
            print(f"  import: median {row['import_s_median']} s of {seconds}; peak RSS {row['peak_rss_mb']} MB "
                  f"({row['rss_before_import_mb']} MB before the import)", flush=True)
    ten, thirty = results
    report = {
        "what": "qaopt field import-bag: a rosbag2 MCAP bag with 50 Hz nav_msgs/Odometry and 30 Hz "
                "sensor_msgs/CameraInfo, five 2-minute runs per 10 minutes; each import in a fresh process "
                "into a fresh SQLite store",
        **prov,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "target": {"import_s_10min": TARGET_S},
        "bags": results,
        "ten_minutes_within_target": ten["import_s_median"] <= TARGET_S,
        "peak_rss_growth_mb_3x_bag": round(thirty["peak_rss_mb"] - ten["peak_rss_mb"], 1),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {args.json}")


if __name__ == "__main__":
    main()
