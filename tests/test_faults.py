"""Faults, one class at a time (issue 35): each is one line and a clear exit status, stores nothing wrong, and
the next normal run gives what a run that never had the fault gives.

The faulty application (tests/apps/faulty.py) is the synthetic one with a bug or a hang switched on by
``$QAOPT_TEST_FAULT``; without it, the bug is "fixed".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from faulty import FAULT
from specs import CALIBRATE_SPEC, run_qaopt

APPS = Path(__file__).resolve().parent / "apps"


def _faulty_spec(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "app.yaml"
    path.write_text(textwrap.dedent(CALIBRATE_SPEC).replace("{LIMITS}", "{heading: 10.0, distance: 0.1}")
                    .replace("qaopt.calibrate.synthetic:SuperellipseApp", "faulty:FaultyApp"))
    return path


def _observations(folder: Path) -> list:
    return json.loads((folder / "region.json").read_text())["observations"]


@pytest.fixture(scope="module")
def clean_region(tmp_path_factory):
    """The region of a run of the faulty spec that never had a fault (its own cache)."""
    folder = tmp_path_factory.mktemp("clean")
    from qaopt.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QAOPT_CACHE_DIR", str(folder / "cache"))
        mp.delenv(FAULT, raising=False)
        with pytest.raises(SystemExit) as info:
            main(["calibrate", str(_faulty_spec(folder / "app")), "--out", str(folder / "out"), "--quiet"])
    assert info.value.code == 0
    return _observations(folder / "out")


@pytest.fixture
def faulty(tmp_path, monkeypatch, clean_region):
    """The faulty spec in ``tmp_path`` (its cache there too), and the region of a run that never had a fault."""
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    return _faulty_spec(tmp_path / "app"), clean_region


def test_an_application_exception_stops_the_run_and_the_fixed_run_equals_a_clean_one(faulty, tmp_path, capsys,
                                                                                      monkeypatch):
    spec, clean = faulty
    out = tmp_path / "out"
    monkeypatch.setenv(FAULT, "raise")
    code, err, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("error: application error: FaultyApp.evaluate raised ZeroDivisionError: float division "
                             "by zero in the controller on seeds "), err
    assert "(calibration point heading=" in err[0] and "--debug" in err[0]
    assert not (out / "region.json").exists()  # no region with the bug's runs in it
    stored = sorted((tmp_path / "cache").rglob("*.json"))
    assert len(stored) == 2  # the two blocks before the bug; the failed block is not evidence

    monkeypatch.delenv(FAULT)  # the bug is fixed
    code, _, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")
    assert code == 0
    assert _observations(out) == clean


def test_debug_shows_the_applications_own_traceback(faulty, tmp_path, monkeypatch):
    from qaopt.calibrate import ApplicationFault
    from qaopt.cli import main

    spec, _ = faulty
    monkeypatch.setenv(FAULT, "raise")
    with pytest.raises(ApplicationFault) as info:
        main(["--debug", "calibrate", str(spec), "--out", str(tmp_path / "out"), "--quiet"])
    assert 'faulty.py", line' in str(info.value.__cause__) and "ZeroDivisionError" in str(info.value.__cause__)


def test_a_hung_simulator_is_stopped_at_its_time_limit(faulty, tmp_path, capsys, monkeypatch):
    spec, clean = faulty
    out = tmp_path / "out"
    monkeypatch.setenv(FAULT, "hang")
    start = time.monotonic()
    code, err, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet", "--time-limit", "1")
    assert time.monotonic() - start < 30
    assert code == 2 and len(err) == 1, err
    assert "error: application error: FaultyApp.evaluate ran past its time limit of 1 s (output.time_limit_s, " \
           "--time-limit) on seeds " in err[0]
    assert "after 1.0 s" in err[0] and not (out / "region.json").exists()

    monkeypatch.delenv(FAULT)
    code, _, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")
    assert code == 0 and _observations(out) == clean


def test_a_hung_pool_worker_is_stopped_and_the_pool_ends_cleanly(faulty, tmp_path, capsys, monkeypatch):
    spec, clean = faulty
    out = tmp_path / "out"
    monkeypatch.setenv(FAULT, "hang")
    monkeypatch.setenv("QAOPT_WORKERS", "2")
    start = time.monotonic()
    code, err, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet", "--time-limit", "2")
    assert time.monotonic() - start < 60  # the pool was not waited for past the limit
    assert code == 2, err
    assert [line for line in err if line.startswith("error:")] == err and len(err) == 1, err
    assert "ran past its time limit of 2 s" in err[0] and not (out / "region.json").exists()

    monkeypatch.delenv(FAULT)
    code, _, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")
    assert code == 0 and _observations(out) == clean


def test_an_old_style_application_is_supported_with_a_note(tmp_path, capsys):
    from specs import tiny_spec

    from qaopt.closed_loop import validate_closed_loop
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import acceptance_of, goal_of
    from faulty import OldStyleTiny
    from tinyapp import TinyEvaluator

    def old_style(data):
        data["evaluator"]["simulator"]["entry_point"] = "faulty:OldStyleTiny"

    path = tiny_spec(tmp_path, old_style)
    code, err, out = run_qaopt(capsys, "validate", str(path))
    assert code == 0, err
    assert out.splitlines()[0] == (
        "note: OldStyleTiny.evaluate_perception does not declare render_threads (an optional parameter added to the "
        "protocol after it was written): supported, qaopt calls it without it; declare "
        "evaluate_perception(nns, seeds, render_threads=1) to use it")
    assert "keeps the application protocol" in out.splitlines()[1]

    spec = load_spec(path)
    judged = dict(goal=goal_of(spec), test=acceptance_of(spec), runs=16, trial=1, region_predicted_valid=True, threads=2)
    assert validate_closed_loop(OldStyleTiny(), {}, **judged) == validate_closed_loop(TinyEvaluator(), {}, **judged)


def test_ctrl_c_to_the_process_group_is_one_line_from_the_parent_alone(faulty, tmp_path, capsys):
    """Ctrl-C at a terminal: SIGINT to the command and its pool workers at once, one worker in a run, one idle."""
    from faulty import STARTED

    from qaopt.commands.runner import INTERRUPTED

    spec, clean = faulty
    out, started = tmp_path / "out", tmp_path / "started"
    env = {**os.environ, FAULT: "slow", STARTED: str(started), "QAOPT_WORKERS": "2",
           "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", "from qaopt.cli import main; main()", "calibrate", str(spec),
                             "--out", str(out), "--quiet"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # its own process group, as a terminal's job is
    deadline = time.monotonic() + 60
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), proc.communicate()
    time.sleep(1.5)  # the other worker runs the point's other blocks meanwhile, then waits idle for more
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [INTERRUPTED]
    assert not (out / "region.json").exists()

    code, _, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")  # resumes
    assert code == 0 and _observations(out) == clean


def test_a_worker_lost_mid_validation_is_one_warning_line_and_its_runs_are_redone(tmp_path, monkeypatch, capfd):
    import torch
    from flaky import DIE_MARKER, ScriptedPerceptionApp

    from qaopt.calibrate import AcceptanceTest, QoSGoal
    from qaopt.closed_loop import ValidationBlocks, validate_closed_loop
    from qaopt.executor import LocalPool, ShippedNN

    nn = ShippedNN(SimpleNamespace(key="k", module=torch.nn.Linear(1, 1), onnx_path=None, columns=None))
    goal = QoSGoal("errors", max=0.0)
    judged = dict(goal=goal, test=AcceptanceTest(0.1, 0.8, 8, 32, block=8), runs=32, trial=1,
                  region_predicted_valid=True, seed_base=100)
    serial = validate_closed_loop(ScriptedPerceptionApp([105]), {"a": nn}, **judged)
    monkeypatch.setenv(DIE_MARKER, str(tmp_path / "died"))  # the pool's first worker to run a block dies in it
    blocks = ValidationBlocks.of(tmp_path / "cache", {"a": "k"}, "app", goal)
    capfd.readouterr()
    with LocalPool(2) as pool:
        pooled = validate_closed_loop(ScriptedPerceptionApp([105]), {"a": nn}, executor=pool, cache=blocks, **judged)
    assert (tmp_path / "died").exists()
    assert pooled == serial
    err = capfd.readouterr().err.strip().splitlines()
    assert err == ["warning: a worker of the local pool of 2 worker(s) was lost (killed, or out of memory); its runs "
                   "are run again"]
    monkeypatch.delenv(DIE_MARKER)

    class RunsNothing(ScriptedPerceptionApp):
        def evaluate_perception(self, nns, seeds, render_threads=1):
            raise AssertionError(f"seeds {seeds} ran again")

    # every block the pool ran was stored whole and right: a second validation reads them all
    assert validate_closed_loop(RunsNothing(), {"a": nn}, cache=blocks, **judged) == serial
