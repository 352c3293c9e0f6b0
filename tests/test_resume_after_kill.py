"""A kill while any artifact is being written never leaves a file that a resumed run misreads.

Every artifact goes through :mod:`qaopt.app_spec.store`, which writes a temporary file,
fsyncs it and renames it into place. The test runs ``optimize`` in child processes
that tear the file being written (cut to half its size) and SIGKILL themselves inside
that write: first inside a write of calibration's cache, then of ``region.json``, a
candidate, a closed-loop validation, ``report.md`` and ``result.json``. Each kill
happens in a fresh process that resumed from the caches the previous one left. A
last, uninterrupted run must then finish and find the same result as a run that was
never killed.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from qaopt import optimize
from qaopt.result import Result

APPS = Path(__file__).resolve().parent / "apps"

# The child: optimize, torn and killed inside the first atomic write whose path contains KILL_IN.
CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path

    def torn_fsync(fd, _fsync=os.fsync):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.environ["KILL_IN"] in Path(path).name or os.environ["KILL_IN"] in path:
            os.ftruncate(fd, os.fstat(fd).st_size // 2)
            with open(os.environ["KILL_LOG"], "a") as log:
                log.write(path + "\\n")
            os.kill(os.getpid(), signal.SIGKILL)
        _fsync(fd)

    os.fsync = torn_fsync
    import io
    import torch
    # As in the test's own process (tests/conftest.py): the tiny app's NNs train when loaded, and torch's CPU
    # kernels give other weights at another thread count (a run would refuse the other process's study).
    torch.set_num_threads(1)
    from rich.console import Console
    from qaopt import optimize
    optimize(sys.argv[1], profile="quick", trials=3, console=Console(file=io.StringIO()))
""")

KILL_POINTS = ("calibrate", "region.json", "candidate", "validation", "report.md", "result.json")


def _spec(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load((APPS / "tiny.yaml").read_text())
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _validations(result: Result) -> dict[str, dict]:
    """Each validated configuration's validation, by trial (the two folders' candidate keys differ; their bytes, by
    ``bytes_hash``, must not)."""
    return {str(v.trial): v.model_dump(exclude={"nns": {"__all__": {"candidate"}}}) for v in result.validations}


def _comparable(result: Result) -> dict:
    """What a resumed run must find as a clean one did; latencies are measured again, so they differ by noise.

    The quick profile's closed-loop runs are too few to accept; then validation stops at the fastest unrefuted
    configuration, and which of two sub-millisecond configurations (the reference and a 10 % pruned one) measures
    faster is noise: compared are the verdicts the validations reached, not which trial they validated. A trial
    that both runs validated is compared whole (:func:`_validations`).
    """
    aware = result.aware.model_dump(exclude={"nns": {"__all__": {"latency_ms", "backends_measured", "memory_bytes"}},
                                             "latency_ms": True, "memory_bytes": True}) if result.aware else None
    return {
        "aware": aware if result.aware_accepted else None,
        "verdicts": sorted((v.runs, v.passes, v.failures, v.accepted) for v in result.validations),
        "trials": {m: [(t.number, t.params, t.feasible) for t in s.trials] for m, s in result.studies.items()},
    }


@pytest.mark.timeout(900)
def test_kill_inside_any_artifact_write_then_resume(tmp_path, monkeypatch):
    monkeypatch.delenv("QAOPT_CACHE_DIR", raising=False)
    # Each spec keeps its cache beside it (tiny.yaml's output.cache_dir), so the two runs share nothing.
    env = {k: v for k, v in os.environ.items() if k != "QAOPT_CACHE_DIR"}
    env.update(PYTHONPATH=str(APPS), KILL_LOG=str(tmp_path / "kills.log"))
    spec = _spec(tmp_path / "killed")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    for point in KILL_POINTS:
        proc = subprocess.run([sys.executable, str(script), str(spec)], env={**env, "KILL_IN": point},
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == -signal.SIGKILL, f"no write of a {point} artifact was reached:\n{proc.stderr[-3000:]}"
    killed = (tmp_path / "kills.log").read_text().splitlines()
    assert len(killed) == len(KILL_POINTS)

    resumed = optimize(spec, profile="quick", trials=3, console=Console(file=io.StringIO()))
    assert Result.load(spec.parent / "runs" / "result.json") == resumed
    # No torn temporary file is ever taken for an artifact: every one left behind is still a temporary.
    for path in killed:
        assert not Path(path).exists() or Path(path).name.startswith("."), path

    clean = optimize(_spec(tmp_path / "clean"), profile="quick", trials=3, console=Console(file=io.StringIO()))
    assert _comparable(resumed) == _comparable(clean)
    resumed_validations, clean_validations = _validations(resumed), _validations(clean)
    for trial in resumed_validations.keys() & clean_validations.keys():
        assert resumed_validations[trial] == clean_validations[trial], trial
