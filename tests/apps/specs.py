"""Spec texts and helpers shared by several test files: a small `qaopt calibrate` spec on the synthetic app,
copies of the tiny application's spec with one thing changed, and `qaopt` run as a user runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

TINY = Path(__file__).resolve().with_name("tiny.yaml")

CALIBRATE_SPEC = """
app: {name: synthetic}
evaluator:
  simulator:
    entry_point: qaopt.calibrate.synthetic:SuperellipseApp
    params: {limits: {LIMITS}, steps: 300}
qos:
  metric: failed
  max: 0.0
  acceptance: {max_failure_rate: 0.05, confidence: 0.9, min_trials: 8, max_trials: 96}
nns:
  heading:
    model: qaopt.simulators.cropfollow:reference_nn
    input_shape: [1, 3, 240, 320]
    outputs: [{name: heading, unit: deg}]
    error_metric: {kind: l1, output: heading}
    data: {source: qaopt.simulators.cropfollow:reference_dataset}
  distance:
    model: qaopt.simulators.cropfollow:reference_nn
    input_shape: [1, 3, 240, 320]
    outputs: [{name: distance, unit: ratio}]
    error_metric: {kind: l1, output: distance}
    data: {source: qaopt.simulators.cropfollow:reference_dataset}
calibration:
  strategy: monotone
  budget: 6
  space:
    - {nn: heading, max: 15.0}
    - {nn: distance, max: 0.15}
"""


def tiny_spec(tmp_path: Path, edit=None, name: str = "app.yaml") -> Path:
    """A copy of the tiny application's spec (tests/apps/tiny.yaml) in ``tmp_path``, ``edit``-ed as a dict first."""
    data = yaml.safe_load(TINY.read_text())
    if edit is not None:
        edit(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_qaopt(capsys, *argv: str) -> tuple[int, list[str], str]:
    """``qaopt argv`` as a user runs it: its exit status, the lines it printed to stderr, and its stdout."""
    from qaopt.cli import main  # the CLI imports much: only when a test runs it

    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out = capsys.readouterr()
    return info.value.code, out.err.strip().splitlines(), out.out


def line_of(path: Path, problem: str) -> str:
    """The spec's line a ``path:line:col: ...`` problem points at."""
    line = int(problem.removeprefix("error: ").removeprefix(str(path)).split(":")[1])
    return path.read_text().splitlines()[line - 1]


def one_error(capsys, path: Path, *argv: str) -> str:
    """The one problem ``qaopt argv path`` prints (``error: path:line:col: field: ...``), exit status 2.

    Notes about this machine are not problems (on a CPU without bf16 instructions ``validate`` notes that bf16
    is left out of the search): they are left out of the count."""
    code, err, _ = run_qaopt(capsys, *argv, str(path))
    assert code == 2, err
    problems = [line for line in err if not line.startswith("note: ")]
    assert len(problems) == 1 and problems[0].startswith(f"error: {path}:"), err
    return problems[0]
