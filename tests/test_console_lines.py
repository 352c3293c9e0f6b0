"""A user's console carries qaopt's lines only: library warnings go to the run folder's run.log (docs/faults.md).

Run as a user runs it, in a process of its own, so that what native code writes to file
descriptor 2 (TVM's runtime, exporting a library) is seen too, not only Python's streams.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specs import tiny_spec

from qaopt.run_log import LIBRARY_LINE

APPS = Path(__file__).resolve().parent / "apps"


def _qaopt(*argv: str, cwd: Path) -> tuple[list[str], list[str]]:
    """The lines ``qaopt argv`` printed to stdout and to stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", "from qaopt.cli import main; main()", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines(), done.stderr.splitlines()


def test_the_library_line_pattern_catches_what_libraries_print():
    caught = ["/x/optuna/distributions.py:700: UserWarning: The distribution is specified by [50, 160] and step=27",
              "[03:01:02] /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:",
              "2026-12-08 [W:onnxruntime:, graph.cc:1234 Init] Initializer appears in graph inputs",
              "  warnings.warn(message, FutureWarning)"]
    kept = ["warning: a worker of the local pool of 2 worker(s) was lost (killed, or out of memory); its runs are "
            "run again", "Not accepted: trial 2, the fastest configuration no closed-loop run refuted, ..."]
    assert all(LIBRARY_LINE.search(line) for line in caught)
    assert not any(LIBRARY_LINE.search(line) for line in kept)


@pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="TVM is not installed")
def test_a_run_its_resume_and_a_tvm_export_print_only_qaopts_lines(tmp_path):
    def on_tvm(data):
        data["target"]["backend"] = "tvm"  # its export wrote 4 runtime warnings per NN library to the console
        data["target"]["search_backend"] = "torch"  # trials timed on a backend quick to build; the choice on TVM

    spec = tiny_spec(tmp_path, on_tvm)
    argv = ("optimize", str(spec), "--profile", "quick", "--trials", "2", "--workers", "2")
    first = _qaopt(*argv, cwd=tmp_path)
    resumed = _qaopt(*argv, cwd=tmp_path)
    for name, (out, err) in (("first run", first), ("resumed run", resumed)):
        assert out and out[-1].startswith(("Accepted:", "Not accepted:")), (name, out[-3:])
        assert not [line for line in out + err if LIBRARY_LINE.search(line)], name
    log = (tmp_path / "runs" / "run.log").read_text()
    assert "qaopt.native: TVM, exporting" in log and "Scope Saving" in log  # kept for whoever debugs the run


def test_optimize_help_names_each_profiles_caps():
    """A user read qaopt/profiles.py to learn what the quick profile caps; ``--help`` says it, from the profiles."""
    from typer.testing import CliRunner

    from qaopt.cli import app
    from qaopt.profiles import PROFILES

    shown = " ".join(CliRunner().invoke(app, ["optimize", "--help"], env={"COLUMNS": "200"}).output.split())
    for name, profile in PROFILES.items():
        assert f"{name}: {profile.caps()}." in shown
    assert "quick: trials=6, calibration_budget=12," in shown and "validation_runs=6" in shown


def test_library_warnings_go_to_the_run_log_and_not_the_console(tmp_path, capfd):
    import logging
    import warnings

    from qaopt.kernels.native_output import native_stderr_logged
    from qaopt.run_log import RUN_LOG, library_output_logged

    folder = tmp_path / "runs" / "not-made-yet"
    with library_output_logged(folder) as log:
        warnings.warn("The distribution is specified by [50, 160] and step=27", UserWarning)
        with native_stderr_logged("TVM, exporting m"):
            os.write(2, b"[03:01:02] /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:\n")
    assert log == folder / RUN_LOG
    text = log.read_text()
    assert "py.warnings: " in text and "UserWarning: The distribution is specified by" in text
    assert "qaopt.native: TVM, exporting m: [03:01:02] /project/src/runtime/vm/executable.cc:276" in text
    assert not capfd.readouterr().err  # neither Python's stderr nor file descriptor 2
    assert not logging.getLogger("py.warnings").handlers  # the block left logging as it found it
