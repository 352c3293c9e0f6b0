"""Where a run's CPU time goes: a py-spy profile of ``qaopt optimize`` summed by pipeline stage and by function.

    pip install py-spy
    py-spy record --subprocesses --format raw -r 20 -o prof.txt -- \
        qaopt optimize examples/cropfollow.yaml --profile quick
    python benchmarks/profile_stages.py prof.txt [--rate 20] [--top 25] [--json out.json]

py-spy samples every thread of the run and of its simulator workers ``--rate`` times a second; a sample is one
stack. Each stack is credited to the pipeline stage whose ``<Stage>.run`` frame it holds (``outside a stage``:
the simulator workers' closed-loop runs, which validation and the stress recordings start, and loading the NNs),
and, inclusively, to every qaopt function on it, so a function's seconds include what it calls. Prints, per stage,
its sampled CPU seconds and its ``--top`` qaopt functions; ``--json`` writes the same figures. Seconds are CPU
seconds of sampled (non-idle) threads, not wall time: two busy workers count twice.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict

STAGE = re.compile(r"^(\w+Stage)\.run \(")
OURS = ("qaopt/", "approx/", "kernels/", "calibrate/", "simulators/", "app_spec/")
OUTSIDE = "outside a stage"


def frame_name(frame: str) -> str:
    """``function (path:line)`` -> ``function path``: one entry per function, whatever line the sample was on."""
    name, _, where = frame.partition(" (")
    return f"{name} {where.rsplit(':', 1)[0]}" if where else name


def summarize(lines, rate: float, top: int) -> dict[str, dict]:
    """Per stage, its sampled CPU seconds and its ``top`` functions' (inclusive), the busiest first."""
    totals: Counter[str] = Counter()
    functions: dict[str, Counter[str]] = defaultdict(Counter)
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack:
            continue
        frames, n = stack.split(";"), int(count)
        stage = next((m.group(1) for f in frames if (m := STAGE.match(f))), OUTSIDE)
        totals[stage] += n
        for name in sorted({frame_name(f) for f in frames if any(p in f for p in OURS)}):  # ties in a fixed order
            functions[stage][name] += n
    return {stage: {"cpu_seconds": round(n / rate, 1),
                    "functions": {f: round(v / rate, 1) for f, v in functions[stage].most_common(top)}}
            for stage, n in totals.most_common()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="py-spy's --format raw output")
    ap.add_argument("--rate", type=float, default=20.0, help="py-spy's -r (samples a second)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()
    with open(args.profile) as f:
        summary = summarize(f, args.rate, args.top)
    for stage, s in summary.items():
        print(f"{stage}: {s['cpu_seconds']} CPU s")
        for name, seconds in s["functions"].items():
            print(f"  {seconds:8.1f}  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**prov, "rate": args.rate, "stages": summary}, f, indent=1)


if __name__ == "__main__":
    main()
