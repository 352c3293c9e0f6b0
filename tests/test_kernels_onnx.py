"""The one ONNX exporter and session factory: names, dynamic batch, threading, errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from qaopt import kernels


class TwoInTwoOut(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + y, x * y


def test_export_names_inputs_and_outputs_with_a_dynamic_batch(tmp_path):
    path = kernels.export_onnx(TwoInTwoOut(), [torch.rand(1, 3), torch.rand(1, 3)], tmp_path / "m.onnx")
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == ["input", "input1"]
    assert [o.name for o in graph.output] == ["output", "output1"]
    assert all(v.type.tensor_type.shape.dim[0].dim_param == "batch" for v in [*graph.input, *graph.output])
    session = kernels.ort_session(path, threads=1)
    x, y = np.ones((4, 3), np.float32), np.full((4, 3), 2, np.float32)
    s, p = session.run(None, {"input": x, "input1": y})
    np.testing.assert_allclose(s, x + y) and np.testing.assert_allclose(p, x * y)
    assert (kernels.INPUT_NAME, kernels.OUTPUT_NAME, kernels.OPSET) == ("input", "output", 17)


def test_session_threads_and_no_spinning(tmp_path):
    path = kernels.export_onnx(torch.nn.Linear(3, 2), [torch.rand(1, 3)], tmp_path / "l.onnx")
    options = kernels.ort_session(path, threads=2).get_session_options()
    assert options.intra_op_num_threads == 2 and options.inter_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_an_operator_onnx_cannot_express_is_named(tmp_path):
    class Bessel(torch.nn.Module):
        def forward(self, x):
            return torch.special.bessel_j0(x)

    with pytest.raises(kernels.UnsupportedOperatorError, match="bessel_j0.*opset 17"):
        kernels.export_onnx(Bessel(), [torch.rand(1, 4)], tmp_path / "b.onnx")
