"""Where and when a benchmark ran, in the same keys in every JSON it writes.

    from provenance import provenance
    record = {**provenance(), ...}

``machine``: the CPU's model and the vector features that change which kernels run (an AVX2-only and an AVX-512
machine differ), its cores, Python, and the GPU where torch sees one; ``date`` (UTC), ``commit`` (with ``+dirty``
when the tree had changes), ``command`` (as typed, relative to the repository) and ``load`` (the 1-, 5- and
15-minute load averages when it started: a figure taken beside other work says so).
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def _gpu() -> str | None:
    if "torch" not in sys.modules:
        return None
    torch = sys.modules["torch"]
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def provenance() -> dict:
    """The machine, date, commit, command and load of this run."""
    from qaopt.kernels.target import host_cpu_info

    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    machine = {**host_cpu_info().to_dict(), "cores": os.cpu_count(), "python": platform.python_version()}
    gpu = _gpu()
    if gpu is not None:
        machine["gpu"] = gpu
    return {
        "machine": machine,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "command": shlex.join(["python", str(shown), *sys.argv[1:]]),
        "load": [round(x, 2) for x in os.getloadavg()],
    }
