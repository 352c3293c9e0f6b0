"""``qaopt kernels bench``: a table of every backend's figures for a spec's NNs, one-line errors for bad input."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from qaopt.cli import main

SPEC = """
app: {name: tiny}
evaluator:
  simulator: {entry_point: "test_kernels_cli:tiny_net"}
qos: {metric: collisions, max: 0}
nns:
  heading:
    model: test_kernels_cli:tiny_net
    input_shape: [1, 3, 24, 32]
    outputs: [{name: heading, unit: deg}]
    error_metric: {kind: l1, output: heading}
    data: {source: test_kernels_cli:tiny_net}
calibration:
  space: [{nn: heading, max: 30.0}]
target: {device: cpu, backend: auto, threads: 1, tuning: {trials: 0}}
output: {cache_dir: CACHE}
"""


def tiny_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(8, 1)).eval()


@pytest.fixture
def spec(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path / "locks"))
    path = tmp_path / "app.yaml"
    path.write_text(textwrap.dedent(SPEC).replace("CACHE", str(tmp_path / "cache")))
    return path


def test_bench_measures_every_backend_and_marks_the_kept_one(spec):
    from qaopt.cli import app

    result = CliRunner().invoke(app, ["kernels", "bench", str(spec)])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("│ heading")]
    assert {r.split("│")[2].strip().removesuffix(" (kept)") for r in rows} == {"torch", "torch[channels_last]", "onnxruntime",
                                                                               "openvino", "tvm"}
    assert sum("(kept)" in r for r in rows) == 1


def test_unknown_nn_is_a_one_line_error(spec, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["kernels", "bench", str(spec), "--nn", "lateral"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--nn lateral" in err and "heading" in err
