"""``qaopt calibrate`` killed (SIGKILL) mid-run, then run again, loses no finished evaluation and ends with the
region an uninterrupted run finds.

The child runs ``qaopt calibrate`` on a copy of the tiny application (its module
beside the spec, no ``PYTHONPATH``) and kills itself inside an atomic write of
:mod:`qaopt.app_spec.store`, which fsyncs every file before renaming it: the file
being written is torn (cut to half) and the process gets SIGKILL, twice inside the
write of a seed block's runs (the Nth new one of that process) and once inside the
write of ``region.json``. Every seed block cached before a kill must still be there,
byte for byte, after the resumed run, and the resumed run's region must equal that
of a run that was never killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from qaopt.calibrate import ErrorRegion

APPS = Path(__file__).resolve().parent / "apps"

CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path

    seen = 0

    def torn_fsync(fd, _fsync=os.fsync):
        global seen
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.environ["KILL_IN"] in path:
            seen += 1
            if seen == int(os.environ["KILL_AT"]):
                os.ftruncate(fd, os.fstat(fd).st_size // 2)
                os.kill(os.getpid(), signal.SIGKILL)
        _fsync(fd)

    os.fsync = torn_fsync
    from qaopt.cli import main
    main(["calibrate", sys.argv[1]])
""")

# (which write, the how-many-th such write of that process): two kills while runs are being cached, one in region.json
KILLS = (("calibrate/trials", 3), ("calibrate/trials", 4), ("region.json", 1))


def _app(folder: Path) -> Path:
    folder.mkdir(parents=True)
    shutil.copy(APPS / "tinyapp.py", folder)
    shutil.copy(APPS / "tiny.yaml", folder)
    return folder / "tiny.yaml"  # caches in folder/cache, writes folder/runs/region.json


def _blocks(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in (folder / "cache" / "calibrate" / "trials").rglob("*.json")}


def _calibrate(spec: Path, env: dict, **kill: str) -> subprocess.CompletedProcess:
    script = spec.parent / "child.py"
    script.write_text(CHILD)
    return subprocess.run([sys.executable, str(script), str(spec)], env={**env, **kill}, cwd=spec.parent,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(600)
def test_calibrate_killed_mid_run_resumes_and_finds_the_same_region(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("QAOPT_CACHE_DIR", "PYTHONPATH")}
    spec = _app(tmp_path / "killed")
    kept: dict[Path, bytes] = {}
    for kill_in, kill_at in KILLS:
        proc = _calibrate(spec, env, KILL_IN=kill_in, KILL_AT=str(kill_at))
        assert proc.returncode == -signal.SIGKILL, f"no kill inside {kill_in}:\n{proc.stderr[-3000:]}"
        blocks = _blocks(spec.parent)
        assert kept.items() <= blocks.items()  # nothing finished before an earlier kill was lost or rewritten
        kept = blocks
    assert len(kept) >= 7  # 3 + 4 new blocks before the first two kills
    assert not (spec.parent / "runs" / "region.json").exists()  # the torn region.json was never put in place

    resumed = _calibrate(spec, env, KILL_IN="nothing", KILL_AT="0")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert kept.items() <= _blocks(spec.parent).items()
    assert "wrote" in resumed.stdout

    clean_spec = _app(tmp_path / "clean")
    clean = _calibrate(clean_spec, env, KILL_IN="nothing", KILL_AT="0")
    assert clean.returncode == 0, clean.stderr[-3000:]
    region, reference = (ErrorRegion.load(s.parent / "runs" / "region.json") for s in (spec, clean_spec))
    assert [o.to_json() for o in region.observations] == [o.to_json() for o in reference.observations]
    assert (region.evaluations, region.trials) == (reference.evaluations, reference.trials)
    assert _blocks(spec.parent).keys() == {spec.parent / p.relative_to(clean_spec.parent) for p in _blocks(clean_spec.parent)}
