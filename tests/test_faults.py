"""Faults, one class at a time: each is one line and a clear exit status, stores nothing wrong, and
the next normal run gives what a run that never had the fault gives.

The faulty application (tests/apps/faulty.py) is the synthetic one with a bug or a hang switched on by
``$QAOPT_TEST_FAULT``; without it, the bug is "fixed".
"""

from __future__ import annotations

import errno
import json
import os
import re
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
                    .replace("qaopt.calibrate.synthetic:SuperellipseApp", "faulty:FaultyApp")
                    .replace("steps: 300", "steps: 60").replace("budget: 6", "budget: 4"))
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
    assert re.search(r"\) after [12]\.\d s; nothing of these runs was stored", err[0]), err
    assert not (out / "region.json").exists()

    monkeypatch.delenv(FAULT)
    code, _, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")
    assert code == 0 and _observations(out) == clean


def test_a_hang_is_noticed_from_the_runs_own_block_times_without_a_time_limit(faulty, tmp_path, capsys, monkeypatch):
    # The default hard cap is 30 minutes; the third call of a worker hangs after two calls of a fraction of a second,
    # so the limit learnt from them (the 60 s floor) stops the run, and its pool ends with it.
    import multiprocessing

    from qaopt.calibrate.app_calls import HANG_FLOOR_S

    out = tmp_path / "out"
    code, err, took = _hung_in_a_pool(faulty[0], out, capsys, monkeypatch)
    assert HANG_FLOOR_S <= took < 300, took
    assert code == 2 and len(err) == 1, err
    assert re.search(r"error: application error: FaultyApp\.evaluate ran past its time limit of 60 s \(10x the median "
                     r"[0-9.e-]+ s per seed of this run's earlier evaluate calls, at least 60 s; output\.time_limit_s "
                     r"or --time-limit sets it\) on seeds ", err[0]), err
    assert not (out / "region.json").exists()
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not multiprocessing.active_children()  # no worker left behind


def test_a_time_limit_the_user_sets_is_used_as_given():
    from qaopt.calibrate.app_calls import RunLimits, hang_limit
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import limits_of, with_time_limit

    class App:
        pass

    learnt, given = RunLimits(), RunLimits(time_limit_s=900.0, learnt=False)
    assert hang_limit(App(), "evaluate", 4, learnt).seconds == learnt.time_limit_s  # nothing timed yet: the hard cap
    from qaopt.calibrate import app_calls

    app_calls._CALL_TIMES.add(app_calls._kind(App(), "evaluate"), 2.0)
    try:
        assert hang_limit(App(), "evaluate", 4, learnt).seconds == 80.0  # 10 x 2 s x 4 seeds
        assert hang_limit(App(), "evaluate", 1, learnt).seconds == 60.0  # the floor
        assert hang_limit(App(), "evaluate", 4, given).seconds == 900.0
        assert hang_limit(App(), "evaluate", 4000, learnt).seconds == learnt.time_limit_s  # never past the hard cap
    finally:
        app_calls.forget_call_times()
    spec = load_spec(APPS / "tiny.yaml")
    assert limits_of(spec).learnt and not limits_of(with_time_limit(spec, 120)).learnt


def _hung_in_a_pool(spec: Path, out: Path, capsys, monkeypatch, *options: str) -> tuple[int, list[str], float]:
    """``qaopt calibrate`` of the faulty spec on a pool of 2 whose workers hang on their third call."""
    monkeypatch.setenv(FAULT, "hang")
    monkeypatch.setenv("QAOPT_WORKERS", "2")
    start = time.monotonic()
    code, err, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet", *options)
    return code, err, time.monotonic() - start


def test_a_hung_pool_worker_is_stopped_and_the_pool_ends_cleanly(faulty, tmp_path, capsys, monkeypatch):
    spec, clean = faulty
    out = tmp_path / "out"
    code, err, took = _hung_in_a_pool(spec, out, capsys, monkeypatch, "--time-limit", "2")
    assert took < 60  # the pool was not waited for past the limit
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

    nn = ShippedNN(SimpleNamespace(key="k", nn="heading", module=torch.nn.Linear(1, 1), onnx_path=None, columns=None))
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


# ---------------------------------------------------------------- disk faults


@pytest.fixture
def fsync_fails(monkeypatch):
    """``fsync_fails(n, code)``: the store's ``n``-th fsync from now on (and every later one) fails with ``code``."""
    from qaopt.app_spec import store

    real, calls = store.os.fsync, []

    def start(n: int, code: int) -> None:
        def fsync(fd: int) -> None:
            calls.append(fd)
            if len(calls) >= n:
                raise OSError(code, os.strerror(code))
            real(fd)

        monkeypatch.setattr(store.os, "fsync", fsync)

    yield start
    monkeypatch.setattr(store.os, "fsync", real)


def _stored(cache: Path) -> dict[Path, int]:
    """Every file of the cache with its modification time; each must be whole (no temporary file is left)."""
    files = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    assert not [p for p in files if p.name.endswith(".tmp")], "a torn temporary file was left"
    for p in files:
        json.loads(p.read_text())  # written whole
    return files


def test_a_full_disk_is_one_line_and_a_run_with_space_resumes(faulty, tmp_path, capsys, fsync_fails, monkeypatch):
    spec, clean = faulty
    out, cache = tmp_path / "out", tmp_path / "cache"
    fsync_fails(3, errno.ENOSPC)  # the third calibration block finds the disk full
    code, err, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: cannot write in {cache / 'calibrate' / 'trials'}/"), err
    assert ": no space left on its device: free space there (or point the run elsewhere: --out or output.dir for " \
           "the run folder, output.cache_dir or $QAOPT_CACHE_DIR for the cache), then run again; finished work is " \
           "kept and resumed" in err[0]
    kept = _stored(cache)
    assert len(kept) == 2 and not (out / "region.json").exists()

    monkeypatch.undo()  # space again (and the faulty fixture's cache folder with it)
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(cache))
    code, _, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")
    assert code == 0 and _observations(out) == clean
    assert {p: t for p, t in _stored(cache).items() if p in kept} == kept  # what was complete is reused as it is


@pytest.mark.parametrize("code,says", [(errno.EROFS, "it is on a read-only file system: give a writable folder"),
                                       (errno.EACCES, "no permission to write there: make it writable (chmod, chown)")])
def test_a_read_only_or_locked_output_folder_is_one_line_naming_it(faulty, tmp_path, capsys, monkeypatch, code, says):
    from qaopt.app_spec import store

    spec, clean = faulty
    out, cache = tmp_path / "out", tmp_path / "cache"
    real = store.tempfile.mkstemp

    def mkstemp(*args, dir, **kwargs):
        if Path(dir) == out:
            raise OSError(code, os.strerror(code), str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(store.tempfile, "mkstemp", mkstemp)
    code_, err, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")
    assert code_ == 2 and err == [f"error: cannot write in {out}: {says}" + err[0].split(says, 1)[1]], err
    assert "(--out or output.dir for the run folder" in err[0] and not (out / "region.json").exists()
    kept = _stored(cache)


    monkeypatch.setattr(store.tempfile, "mkstemp", real)
    code_, _, _ = run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")
    assert code_ == 0 and _observations(out) == clean
    assert _stored(cache) == kept  # every run was complete: nothing ran again


@pytest.mark.parametrize("folder", ["run folder", "cache"])
def test_a_read_only_existing_folder_is_named_before_any_work(tmp_path, capsys, monkeypatch, folder):
    # As a user's existing runs/ folder turned read-only: without the check up front, SQLite said only
    # "unable to open database file" for its study.db.
    from specs import tiny_spec

    from qaopt.app_spec import store

    out, cache = tmp_path / "runs", tmp_path / "cache"
    out.mkdir()
    cache.mkdir()
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(cache))
    read_only = out if folder == "run folder" else cache
    if os.geteuid() != 0:  # root writes through a mode; a read-only mount is not to be had in a test
        read_only.chmod(0o555)
    else:
        real = store.tempfile.mkstemp

        def mkstemp(*args, dir, **kwargs):
            if Path(dir) == read_only:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(store.tempfile, "mkstemp", mkstemp)
    try:
        code, err, _ = run_qaopt(capsys, "optimize", str(tiny_spec(tmp_path)), "--out", str(out), "--quiet",
                                 "--profile", "quick")
    finally:
        read_only.chmod(0o755)
    assert code == 2 and len(err) == 1, err
    says = ("it is on a read-only file system: give a writable folder" if os.geteuid() == 0
            else "no permission to write there: make it writable (chmod, chown)")
    assert err[0].startswith(f"error: cannot write in {read_only}: {says}"), err
    assert "--out or output.dir for the run folder, output.cache_dir or $QAOPT_CACHE_DIR for the cache" in err[0]
    assert not list(out.iterdir()) and not list(cache.iterdir())  # nothing was computed


def test_torchs_write_failure_on_a_full_disk_is_the_same_one_line(tmp_path):
    from qaopt.app_spec.store import StorageError, writing_to

    torn = RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0")
    with pytest.raises(StorageError, match=rf"^cannot write in {tmp_path}: no space left on its device"):
        with writing_to(tmp_path):
            raise torn


# ---------------------------------------------------------------- damaged artifacts

GARBAGE = b"\xff\xfe\x00garbage\x80 that decodes as nothing"


def test_a_damaged_region_json_is_one_line_to_read_and_set_aside_by_a_run(tmp_path, capfd):
    from specs import tiny_spec

    from qaopt.plan import BoundApplication
    from qaopt.spec import load_spec
    from qaopt.stages.region import calibrated_region

    path = tiny_spec(tmp_path)
    app, run = BoundApplication(load_spec(path)), tmp_path / "run"
    clean = calibrated_region(app, 4, run).region.to_json()
    (run / "region.json").write_bytes(GARBAGE)

    code, err, _ = run_qaopt(capfd, "calibrate", str(path), "--out", str(run), "--plot")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {run / 'region.json'}: cannot read the region ('utf-8' codec can't decode")
    assert err[0].endswith("run `qaopt calibrate` again")

    capfd.readouterr()
    again = calibrated_region(app, 4, run)  # what optimize's region stage does: set it aside, calibrate anew
    assert again.note.startswith("region.json was unreadable (") and again.region.to_json() == clean
    assert capfd.readouterr().err.strip().splitlines() == [
        f"warning: {run / 'region.json'} is damaged ({again.note.split('(', 1)[1].split('); calibrating')[0]}); "
        "moved aside to region.json.damaged and rebuilt"]
    assert (run / "region.json.damaged").read_bytes() == GARBAGE


def test_a_damaged_calibration_block_is_run_again(faulty, tmp_path, capsys):
    spec, clean = faulty
    out, cache = tmp_path / "out", tmp_path / "cache"
    assert run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")[0] == 0
    damaged = sorted(cache.rglob("*.json"))[0]
    damaged.write_bytes(GARBAGE)
    (out / "region.json").unlink()
    assert run_qaopt(capsys, "calibrate", str(spec), "--out", str(out), "--quiet")[0] == 0
    assert _observations(out) == clean and json.loads(damaged.read_text())  # run again and stored whole


def test_a_damaged_validation_block_is_set_aside_and_run_again(tmp_path, capfd):
    from flaky import ScriptedPerceptionApp

    from qaopt.calibrate import AcceptanceTest, QoSGoal
    from qaopt.closed_loop import ValidationBlocks, validate_closed_loop

    goal = QoSGoal("errors", max=0.0)
    judged = dict(goal=goal, test=AcceptanceTest(0.1, 0.8, 8, 48, block=8), runs=48, trial=1,
                  region_predicted_valid=True, seed_base=100)
    blocks = ValidationBlocks.of(tmp_path, {"a": "k"}, "app", goal)
    clean = validate_closed_loop(ScriptedPerceptionApp([105]), {}, cache=blocks, **judged)
    stored = sorted(blocks.folder.glob("*.json"))
    good = stored[1].read_bytes()
    stored[1].write_bytes(good.replace(b"0.0", b"1.0", 1))  # one run's outcome edited: its checksum no longer holds
    capfd.readouterr()
    assert validate_closed_loop(ScriptedPerceptionApp([105]), {}, cache=blocks, **judged) == clean
    assert capfd.readouterr().err.strip().splitlines() == [
        f"warning: {stored[1]} is damaged (its checksum does not match its content); moved aside to "
        f"{stored[1].name}.damaged and rebuilt"]
    assert stored[1].read_bytes() == good


def test_a_damaged_candidate_is_set_aside_and_rebuilt(tmp_path, capfd):
    from specs import TINY

    from qaopt.app_spec import load
    from qaopt.approx import Knobs, TargetNN, build
    from qaopt.kernels import onnx

    nn_ = TargetNN.from_spec("a", load(TINY).nns["a"])
    knobs = Knobs(prune_ratio=0.5)
    first = build(nn_, knobs, cache_dir=tmp_path, onnx=onnx)
    approx = tmp_path / "approx"
    [float_entry] = (approx / "float").glob("[!.]*")
    (float_entry / "model.pt").write_bytes(GARBAGE)
    capfd.readouterr()
    again = build(nn_, knobs, cache_dir=tmp_path, onnx=onnx)
    assert again.error == first.error and not again.from_cache
    assert capfd.readouterr().err.strip().splitlines() == [
        f"warning: {float_entry} is damaged (model.pt does not match its checksum); moved aside to "
        f"{float_entry.name}.damaged and rebuilt"]

    [candidate] = (approx / "candidates").glob("[!.]*[!d]")
    (candidate / "candidate.json").write_bytes(GARBAGE)
    assert build(nn_, knobs, cache_dir=tmp_path, onnx=onnx).error == first.error
    assert "is damaged (" in capfd.readouterr().err


def test_a_damaged_result_json_is_one_line_naming_it(tmp_path):
    from qaopt.app_spec import QaoptError
    from qaopt.result import Result

    (tmp_path / "result.json").write_bytes(GARBAGE)
    with pytest.raises(QaoptError, match=rf"^{tmp_path / 'result.json'}: cannot read the run's result \(ValidationError"
                                         r", .*\); run `qaopt optimize SPEC` again: it resumes"):
        Result.load(tmp_path / "result.json")


# ---------------------------------------------------------------- entry points and the protocol


def test_a_failing_nn_entry_point_stops_optimize_before_any_run(tmp_path, capsys, monkeypatch):
    from specs import line_of, tiny_spec

    import qaopt.region_calibration as region_calibration

    (tmp_path / "brokennn.py").write_text(textwrap.dedent("""
        def tiny_net(target="a"):
            raise FileNotFoundError("checkpoints/a.pt")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))

    def broken(data):
        data["nns"]["b"]["model"] = "brokennn:tiny_net"

    path = tiny_spec(tmp_path, broken)
    monkeypatch.setattr(region_calibration, "calibrate_spec", lambda *a, **k: pytest.fail("calibration ran"))
    code, err, _ = run_qaopt(capsys, "optimize", str(path), "--profile", "quick")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {path}:") and err[0].endswith(
        ": nns.b.model: brokennn:tiny_net raised FileNotFoundError: checkpoints/a.pt; fix that entry point (`qaopt "
        "validate SPEC` runs it)"), err
    assert "brokennn:tiny_net" in line_of(path, err[0])
    assert not list((tmp_path / "runs").rglob("*.json")) and not (tmp_path / "cache").exists()  # nothing stored


def test_a_second_validation_split_the_data_source_refuses_stops_optimize_at_its_line(tmp_path, capsys, monkeypatch):
    """``nns.<name>.data.more_validation`` is called before anything runs: an argument the source does not take is
    found at once, at its line, not after the searches that would use it."""
    from specs import line_of, tiny_spec

    import qaopt.region_calibration as region_calibration

    def second_split(data):
        data["nns"]["a"]["data"]["more_validation"] = {"validation_drives": 48}

    path = tiny_spec(tmp_path, second_split)
    monkeypatch.setattr(region_calibration, "calibrate_spec", lambda *a, **k: pytest.fail("calibration ran"))
    code, err, _ = run_qaopt(capsys, "optimize", str(path), "--profile", "quick")
    assert code == 2 and len(err) == 1, err
    assert ": nns.a.data.more_validation: tinyapp:tiny_data raised TypeError: " in err[0], err
    assert "validation_drives" in err[0] and "more_validation" in line_of(path, err[0])


def test_an_exception_in_closed_loop_validation_stops_it_and_stores_nothing_of_its_block(tmp_path):
    from flaky import ScriptedPerceptionApp

    from qaopt.calibrate import AcceptanceTest, ApplicationFault, QoSGoal
    from qaopt.closed_loop import ValidationBlocks, validate_closed_loop

    class Buggy(ScriptedPerceptionApp):
        def evaluate_perception(self, nns, seeds, render_threads=1):
            if 113 in seeds:
                raise IndexError("lane 3 of 2")
            return super().evaluate_perception(nns, seeds, render_threads)

    goal = QoSGoal("errors", max=0.0)
    judged = dict(goal=goal, test=AcceptanceTest(0.1, 0.8, 8, 48, block=8), runs=48, trial=4,
                  region_predicted_valid=True, seed_base=100)
    clean = validate_closed_loop(ScriptedPerceptionApp([105]), {}, **judged)
    blocks = ValidationBlocks.of(tmp_path, {"a": "k"}, "app", goal)
    with pytest.raises(ApplicationFault, match=r"^application error: Buggy.evaluate_perception raised IndexError: lane "
                                               r"3 of 2 on seed 113 \(closed-loop validation of trial 4\) after"):
        validate_closed_loop(Buggy([105]), {}, cache=blocks, **judged)
    assert [blocks.get(list(range(s, s + 8))) is not None for s in (100, 108)] == [True, False]
    assert validate_closed_loop(ScriptedPerceptionApp([105]), {}, cache=blocks, **judged) == clean  # fixed


def test_retries_absorb_a_transient_failure_and_name_the_attempts_of_a_lasting_one():
    from qaopt.calibrate import RunLimits, call_application

    class Transient:
        calls = 0

        def evaluate(self, injectors, seeds):
            self.calls += 1
            if self.calls == 1:
                raise ConnectionRefusedError("license server")
            return [{"m": 0.0} for _ in seeds]

    assert call_application(Transient(), "evaluate", {}, [1, 2], RunLimits(retries=1)).result == [{"m": 0.0}] * 2
    failure = call_application(Transient(), "evaluate", {}, [1, 2], RunLimits(retries=0)).failure
    assert failure.error == "raised ConnectionRefusedError: license server" and failure.seeds_text() == "seeds 1, 2"

    class Always(Transient):
        def evaluate(self, injectors, seeds):
            raise RuntimeError("diverged")

    from qaopt.calibrate import ApplicationFault

    failure = call_application(Always(), "evaluate", {}, [7], RunLimits(retries=2)).failure
    assert "on seed 7 (point) (after 3 attempts) after " in str(ApplicationFault(failure, "point"))


def test_a_worker_that_dies_on_every_try_is_one_line(tmp_path):
    from qaopt.executor import ExecutorError, LocalPool

    with LocalPool(1, retries=1) as pool:
        with pytest.raises(ExecutorError, match=r"^a worker of the local pool of 1 worker\(s\) died 2 times running the "
                                                r"same task: the application crashes its process"):
            pool.submit(os._exit, 3).result(timeout=60)


def test_a_damaged_tuning_database_is_set_aside_and_tuning_starts_afresh(tmp_path, capsys):
    pytest.importorskip("tvm")
    from qaopt.kernels.tuning import DATABASE_FILES, TuningDatabase

    database = TuningDatabase(tmp_path / "db", target=None)
    for name in DATABASE_FILES:
        (database.path / name).write_bytes(b"\x00\xffnot json\n")
    db = database.open()  # a fresh, empty database: the damaged records were only a cache of measurements
    assert len(db.get_all_tuning_records()) == 0
    assert all((database.path / f"{name}.damaged").exists() for name in DATABASE_FILES)
    err = capsys.readouterr().err
    assert err.count("warning:") == len(DATABASE_FILES) and "database_tuning_record.json is damaged" in err
    assert len(database.open().get_all_tuning_records()) == 0  # and it opens cleanly from then on


@pytest.mark.parametrize("sqlite_says,fix", [("database or disk is full", "no space left on its device"),
                                             ("attempt to write a readonly database", "read-only file system")])
def test_a_full_or_read_only_study_database_is_the_same_one_line(capsys, sqlite_says, fix):
    # Optuna writes each trial through SQLAlchemy: SQLite's own words for the disk faults, not an OSError.
    import sqlite3

    import typer
    from sqlalchemy.exc import OperationalError

    from qaopt.commands.runner import run

    app = typer.Typer()

    @app.command()
    def study() -> None:
        raise OperationalError("INSERT INTO trials", {}, sqlite3.OperationalError(sqlite_says))

    with pytest.raises(SystemExit) as exit:
        run(app, [], "qaopt", debug=lambda: False)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("error: cannot write the study database (study.db in the run folder, or search.storage "
                             "/ --storage): ") and fix in err[0] and "search.storage or --storage" in err[0]
