"""A kill while any artifact is being written never leaves a file that a resumed run misreads.

Every artifact goes through :mod:`qaopt.app_spec.store`, which writes a temporary file,
fsyncs it and renames it into place. The test runs ``optimize`` in child processes
that tear the file being written (cut to half its size) and SIGKILL themselves inside
that write: first inside a write of calibration's cache, then of ``region.json``, a
candidate, a closed-loop validation, ``report.md`` and ``result.json``. Each kill
happens in a fresh process that resumed from the caches the previous one left. A
last, uninterrupted run (a fresh process too) must then finish and find the same result as
a run that was never killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from qaopt.result import Result

APPS = Path(__file__).resolve().parent / "apps"

# The child: optimize, torn and killed inside the first atomic write whose path contains KILL_IN (if it is set).
CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path

    def torn_fsync(fd, _fsync=os.fsync):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if "KILL_IN" in os.environ and os.environ["KILL_IN"] in path:
            os.ftruncate(fd, os.fstat(fd).st_size // 2)
            with open(os.environ["KILL_LOG"], "a") as log:
                log.write(path + "\\n")
            os.kill(os.getpid(), signal.SIGKILL)
        _fsync(fd)

    os.fsync = torn_fsync
    import io
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
    """Each validation by the bytes of the NNs it ran (the two folders' candidate keys differ, and so may the trial
    that found the NNs)."""
    return {json.dumps({n: nn.bytes_hash for n, nn in v.nns.items()}, sort_keys=True):
            v.model_dump(exclude={"trial": True, "label": True, "nns": {"__all__": {"candidate"}}})
            for v in result.validations}


def _trials(result: Result) -> dict[str, dict[str, tuple]]:
    """Each study's trials by their parameters: whether each was feasible and its errors."""
    return {mode: {json.dumps(t.params, sort_keys=True): (t.state, t.feasible, t.errors) for t in s.trials}
            for mode, s in result.studies.items()}


def _comparable(result: Result) -> dict:
    """What a resumed run must find as a clean one did, where timing noise cannot decide it.

    Latencies are measured again, so they differ by noise, and so may what they decide: which informed trials the
    walk enqueues (its screening times each probe untuned), and which configuration validation runs (the quick
    profile's six runs cannot accept, so it stops at the fastest unrefuted one). Compared are how many trials each
    study finished and the validations' verdicts; a trial both runs ran (:func:`_trials`), and NNs both validated
    (:func:`_validations`), must match whole.
    """
    aware = result.aware.model_dump(exclude={"nns": {"__all__": {"latency_ms", "backends_measured", "memory_bytes"}},
                                             "latency_ms": True, "memory_bytes": True}) if result.aware else None
    return {
        "aware": aware if result.aware_accepted else None,
        "verdicts": sorted((v.runs, v.passes, v.failures, v.accepted) for v in result.validations),
        "trials": {mode: (s.trials_complete, s.trials_failed) for mode, s in result.studies.items()},
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

    # The resumed and the clean run start in fresh processes too, as the killed ones did: what this test's
    # process ran before (other tests) must not move a build.
    env.pop("KILL_IN", None)
    for folder in (spec.parent, tmp_path / "clean"):
        proc = subprocess.run([sys.executable, str(script), str(_spec(folder))], env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    resumed, clean = (Result.load(folder / "runs" / "result.json") for folder in (spec.parent, tmp_path / "clean"))
    # No torn temporary file is ever taken for an artifact: every one left behind is still a temporary.
    for path in killed:
        assert not Path(path).exists() or Path(path).name.startswith("."), path
    assert _comparable(resumed) == _comparable(clean)
    resumed_trials, clean_trials = _trials(resumed), _trials(clean)
    for mode, trials in resumed_trials.items():
        both = trials.keys() & clean_trials[mode].keys()
        assert both or not trials, f"{mode}: not even the reference trial is common"
        assert {p: trials[p] for p in both} == {p: clean_trials[mode][p] for p in both}, mode
    resumed_validations, clean_validations = _validations(resumed), _validations(clean)
    for nns in resumed_validations.keys() & clean_validations.keys():
        assert resumed_validations[nns] == clean_validations[nns], nns
