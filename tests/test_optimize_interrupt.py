"""Ctrl-C, as a user presses it: one clean line and exit 130 for every command; an interrupted trial is re-run.

A SIGINT is sent to a real ``qaopt`` process at a deterministic point by a small
wrapper script (as tests/test_resume_after_kill.py does with SIGKILL): inside the
second trial of the aware study, once its knobs are sampled; and inside ``qaopt
calibrate`` before it calibrates. The resumed run must redo the interrupted trial
(same knobs) and end with the budget's number of completed trials, keeping every
trial that had finished.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from rich.console import Console

import qaopt.region_calibration as region_calibration
from qaopt import optimize
from qaopt.commands.runner import INTERRUPTED
from qaopt.search import ATTR_FAILURE

APPS = Path(__file__).resolve().parent / "apps"

# The child: the qaopt CLI, with a SIGINT sent to itself at the point INTERRUPT_AT names.
CHILD = textwrap.dedent("""
    import os, signal, sys, time

    def interrupt():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises at the next bytecode; never reached

    if os.environ["INTERRUPT_AT"] == "aware trial 1":
        import qaopt.search as search
        say = search.Objective._say

        def patched(self, trial, phase, detail=""):
            say(self, trial, phase, detail)
            if self.mode == "aware" and trial.number == 1 and phase == "building":  # its knobs are sampled
                interrupt()

        search.Objective._say = patched
    else:
        import qaopt.region_calibration as calibration
        calibration.calibrate_spec = lambda *args, **kwargs: interrupt()

    from qaopt.cli import main
    main(sys.argv[1:])
""")


def _spec(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.yaml"
    path.write_text((APPS / "tiny.yaml").read_text())
    return path


def _run_interrupted(tmp_path: Path, at: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(APPS), "INTERRUPT_AT": at}
    env.pop("QAOPT_DEBUG", None)
    return subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=600)


def _assert_one_clean_line(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == INTERRUPTED
    assert proc.stderr.count(INTERRUPTED) == 1 and "Aborted" not in proc.stderr


def _aware(db: Path) -> optuna.Study:
    storage = f"sqlite:///{db}"
    [name] = [s.study_name for s in optuna.study.get_all_study_summaries(storage) if s.study_name.endswith("-aware")]
    return optuna.load_study(study_name=name, storage=storage)


@pytest.mark.timeout(900)
def test_ctrl_c_in_a_trial_exits_cleanly_and_the_trial_is_rerun(tmp_path, monkeypatch):
    spec = _spec(tmp_path / "app")
    proc = _run_interrupted(tmp_path, "aware trial 1", "optimize", str(spec), "--profile", "quick", "--trials", "3")
    _assert_one_clean_line(proc)

    run = spec.parent / "runs"
    study = _aware(run / "study.db")
    before = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert before[0].state == TrialState.COMPLETE
    interrupted = before[1]
    assert interrupted.state == TrialState.FAIL
    assert interrupted.user_attrs[ATTR_FAILURE].startswith("interrupted by Ctrl-C"), interrupted.user_attrs
    [retry] = [t for t in before.values() if t.system_attrs.get("failed_trial") == 1]
    assert retry.state == TrialState.WAITING and retry.params == interrupted.params

    # Resume: nothing finished is recomputed (the region is reused), the interrupted trial runs again.
    def no_calibration(*args, **kwargs):
        raise AssertionError("the region calibrated before Ctrl-C must be reused")

    monkeypatch.setattr(region_calibration, "calibrate_spec", no_calibration)
    monkeypatch.setenv("PYTHONPATH", str(APPS))
    monkeypatch.syspath_prepend(str(APPS))
    result = optimize(spec, profile="quick", trials=3, console=Console(file=io.StringIO()))

    after = {t.number: t for t in _aware(run / "study.db").get_trials(deepcopy=False)}
    assert after[0].params == before[0].params and after[0].values == before[0].values, "a finished trial changed"
    assert after[retry.number].state == TrialState.COMPLETE and after[retry.number].params == interrupted.params
    summary = result.studies["aware"]
    assert summary.trials_complete == 3, "a resumed run ends with the budget's number of completed trials"
    assert any(f.startswith("trial 1: interrupted") for f in summary.failures)
    assert "trial 1: interrupted" in (run / "report.md").read_text()


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(tmp_path):
    spec = _spec(tmp_path / "app")
    proc = _run_interrupted(tmp_path, "calibrate", "calibrate", str(spec))
    _assert_one_clean_line(proc)
    assert not (spec.parent / "runs" / "region.json").exists()
