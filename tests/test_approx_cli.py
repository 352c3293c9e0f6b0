"""``qaopt approx sweep``: a table of candidates along one knob, and one-line errors for bad input."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qaopt.cli import main

SPEC = """
app: {name: tiny}
evaluator:
  simulator: {entry_point: "test_approx_build:TinyNavNet"}
qos: {metric: collisions, max: 0}
nns:
  heading:
    model: test_approx_build:trained_tiny_navnet
    input_shape: [1, 3, 24, 32]
    outputs: [{name: heading, unit: deg}]
    error_metric: {kind: l1, output: heading}
    data: {source: test_approx_build:stripe_data}
calibration:
  space: [{nn: heading, max: 30.0}]
approximations:
  all:
    pruning: {ratio: [0.0, 0.5], round_to: 8, steps: 1, per_layer: {PER_LAYER}}
    finetune: {steps: [0, 20]}
"""


@pytest.fixture
def qaopt(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the spec names models in test_approx_build

    def run(*args: str, per_layer: str = ""):
        spec = tmp_path / "app.yaml"
        spec.write_text(textwrap.dedent(SPEC).replace("{PER_LAYER}", "{" + per_layer + "}"))
        monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setenv("COLUMNS", "220")
        from qaopt.cli import app

        return CliRunner().invoke(app, ["approx", "sweep", str(spec), *args])

    return run


def test_sweep_prints_one_row_per_value_and_reuses_the_cache(qaopt):
    first = qaopt("--nn", "heading", "--knob", "pruning", "--values", "0,0.5", "--threads", "1")
    assert first.exit_code == 0, first.output
    rows = [line for line in first.output.splitlines() if re.match(r"^│\s+0(\.5)?\s+│", line)]
    assert len(rows) == 2, first.output
    assert "cache" not in rows[1] and "onnxruntime" in rows[0]  # a quick untuned figure: ONNX Runtime where it runs
    again = qaopt("--nn", "heading", "--knob", "pruning", "--values", "0,0.5", "--no-latency")
    rows = [line for line in again.output.splitlines() if re.match(r"^│\s+0(\.5)?\s+│", line)]
    assert len(rows) == 2 and all(row.rstrip(" │").endswith("cache") for row in rows), again.output


def test_sweep_of_dtypes_includes_int8(qaopt):
    result = qaopt("--nn", "heading", "--knob", "quantization", "--values", "fp32,int8", "--no-latency")
    assert result.exit_code == 0, result.output
    assert re.search(r"│\s+int8\s+│\s+[\d.]+\s+│", result.output), result.output


@pytest.mark.parametrize(
    ("args", "per_layer", "message"),
    [
        (("--nn", "heading", "--values", "0.2,1.0"), "", "NN 'heading', knob 'prune_ratio'"),
        (("--nn", "heading", "--values", "0.5"), "backbone.7: 0.5", "knob 'per_layer.backbone.7'"),
        (("--nn", "lidar",), "", "no NN named 'lidar'"),
        (("--nn", "heading", "--knob", "sparsity", "--values", "1"), "", "knob 'sparsity': no such knob"),
        (("--nn", "heading", "--knob", "quantization", "--values", "fp32,bf16"), "", "knob 'dtype': bf16 has no kernels on backend 'tvm'"),
    ],
)
def test_bad_input_is_one_line_naming_nn_and_knob(tmp_path, monkeypatch, args, per_layer, message, capsys):
    spec = tmp_path / "app.yaml"
    spec.write_text(textwrap.dedent(SPEC).replace("{PER_LAYER}", "{" + per_layer + "}") + "target: {backend: tvm}\n")
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with pytest.raises(SystemExit) as exit_:
        main(["approx", "sweep", str(spec), "--no-latency", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_model_typo_is_found_before_any_build_with_its_line(tmp_path, monkeypatch, capsys):
    """The sweep imports every entry point of the spec first, like every command that reads one."""
    spec = tmp_path / "app.yaml"
    spec.write_text(textwrap.dedent(SPEC).replace("{PER_LAYER}", "{}")
                    .replace("model: test_approx_build:trained_tiny_navnet", "model: test_approx_build:trained_tiny_navnte"))
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with pytest.raises(SystemExit) as exit_:
        main(["approx", "sweep", str(spec), "--nn", "heading", "--values", "0", "--no-latency"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert re.search(r"app\.yaml:\d+:\d+: nns\.heading\.model: ", err), err
    assert not (tmp_path / "cache" / "approx").exists(), "nothing is built before the spec is whole"
