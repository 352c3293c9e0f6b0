"""``qaopt train SPEC``: loads (training on first use) each reference NN and reports its validation error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from qaopt.cli import app, main
from tinyapp import tiny_data, tiny_net

from .test_application import TINY


def test_train_reports_each_nn_with_its_declared_metric():
    result = CliRunner().invoke(app, ["train", str(TINY), "--threads", "1"])
    assert result.exit_code == 0, result.output
    data, model = tiny_data("b"), tiny_net("b")
    with torch.no_grad():
        pred = model(torch.from_numpy(data.x_val)).numpy()
    expected = float(np.mean(np.abs(pred[:, 0] - data.y_val[:, 0])))
    row = next(line for line in result.output.splitlines() if "l1 of b" in line)
    assert f"{expected:.4g}" in row and "l1 of a" in result.output


def test_train_only_the_named_nn():
    result = CliRunner().invoke(app, ["train", str(TINY), "--nn", "a", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "l1 of a" in result.output and "l1 of b" not in result.output


def test_train_names_an_unknown_nn(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(TINY), "--nn", "c"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --nn c: ") and "its nns are a, b" in err
