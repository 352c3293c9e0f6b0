"""The one ONNX exporter and the one ONNX Runtime session factory of qaopt.

Every ONNX file qaopt writes (the onnxruntime backend's, int8 quantization's
input, the exported artifacts) comes from :func:`export_onnx`, and every ONNX
Runtime session from :func:`ort_session`, so the names, opset and threading are
the same everywhere. The exporter is TorchScript's (``dynamo=False``) at opset 17:
its graphs are the ones ONNX Runtime's static quantizer handles (the measured
routes are in docs/quantization.md).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UnsupportedOperatorError
from .model import describe, module_of, torch_inputs, unsupported

if TYPE_CHECKING:
    import onnxruntime

INPUT_NAME = "input"
OUTPUT_NAME = "output"
OPSET = 17
_NO_EXPORT = re.compile(r"Exporting the operator '([\w:.]+)' to ONNX")


def io_names(prefix: str, count: int) -> list[str]:
    """``input``, ``input1``, ``input2``, … (the first has no number)."""
    return [prefix if i == 0 else f"{prefix}{i}" for i in range(count)]


def export_onnx(module: Any, example_inputs: Sequence[Any], path: str | Path) -> Path:
    """Export a torch module (or ExportedProgram) to ONNX at ``path``.

    Inputs are named ``input`` (then ``input1``, …), outputs ``output`` (then
    ``output1``, …), and axis 0 of each is a dynamic batch axis. An operator ONNX
    cannot express raises :class:`UnsupportedOperatorError` naming it.
    """
    import torch

    module = module_of(module).eval()
    inputs = torch_inputs(example_inputs, like=module)
    with torch.no_grad():
        out = module(*inputs)
    inputs_names = io_names(INPUT_NAME, len(inputs))
    output_names = io_names(OUTPUT_NAME, len(out) if isinstance(out, (tuple, list)) else 1)
    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is chosen on purpose
            torch.onnx.export(module, inputs, str(path), dynamo=False, opset_version=OPSET,
                              input_names=inputs_names, output_names=output_names,
                              dynamic_axes={name: {0: "batch"} for name in inputs_names + output_names})
    except Exception as exc:  # the exporter raises many types; all mean the same to a user
        match = _NO_EXPORT.search(str(exc))
        if match:
            raise UnsupportedOperatorError(match.group(1), "onnxruntime", describe(module),
                                           f"ONNX opset {OPSET} cannot express it; choose backend torch or tvm") from exc
        raise unsupported("onnxruntime", module, f"ONNX export failed: {type(exc).__name__}: {exc}") from exc
    return path


def ort_session(path: str | Path | bytes, threads: int | None = None, device: str = "cpu") -> onnxruntime.InferenceSession:
    """An ONNX Runtime session: all graph optimizations, one inter-op thread, ``threads`` intra-op threads.

    The pool's threads sleep after each run instead of spinning: spinning threads
    steal the cores from the rest of the application (and from the other NNs of a
    parallel schedule). ``device`` 'cuda' uses the CUDA execution provider. ``path``
    may be the ONNX file's bytes, for a process that has the graph but not the file
    (a validation worker, :class:`qaopt.executor.ShippedNN`).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.inter_op_num_threads = 1
    if threads:
        options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), options, providers=providers)


def onnx_param_bytes(path: str | Path) -> int:
    """Bytes of an ONNX file's initializers (its weights)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return int(sum(len(t.raw_data) or 0 for t in model.graph.initializer))
