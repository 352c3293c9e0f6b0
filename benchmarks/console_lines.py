"""What a user's console shows of a run: every line of ``qaopt optimize SPEC --profile quick``, held to the shape
of a library's line (``qaopt.run_log.LIBRARY_LINE``), and what went to the run folder's ``run.log`` instead.

    python benchmarks/console_lines.py examples/cropfollow.yaml examples/lanekeep.yaml

Each spec runs as a user runs it, in a process of its own, on its own run folder (a second call resumes it: the
record says whether the folder held a result before). Writes ``docs/benchmarks/console_lines.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from provenance import ROOT, provenance

from qaopt.run_log import LIBRARY_LINE, RUN_LOG
from qaopt.spec import load_spec


def console_of(spec: Path, profile: str) -> dict:
    run_dir = Path(load_spec(spec).output.dir)
    resumed = (run_dir / "result.json").exists()
    log = run_dir / RUN_LOG
    before = log.read_text().count("\n") if log.exists() else 0
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "from qaopt.cli import main; main()", "optimize", str(spec),
                           "--profile", profile], capture_output=True, text=True, check=False)
    lines = done.stdout.splitlines() + done.stderr.splitlines()
    return {
        "spec": str(spec),
        "resumed": resumed,
        "exit_status": done.returncode,
        "seconds": round(time.monotonic() - start, 1),
        "console_lines": len(lines),
        "library_lines": [line for line in lines if LIBRARY_LINE.search(line)],
        "run_log_lines": (log.read_text().count("\n") if log.exists() else 0) - before,
        "last_line": done.stdout.splitlines()[-1] if done.stdout.strip() else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", type=Path)
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "console_lines.json")
    args = parser.parse_args()
    record = {**provenance(), "profile": args.profile, "runs": [console_of(s, args.profile) for s in args.specs]}
    record["library_lines"] = sum(len(r["library_lines"]) for r in record["runs"])
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({r["spec"]: (r["exit_status"], len(r["library_lines"])) for r in record["runs"]}))


if __name__ == "__main__":
    main()
