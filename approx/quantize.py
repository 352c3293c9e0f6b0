"""Quantization: the dtype a candidate runs in, through a backend with kernels for it.

int8 is post-training static quantization with ONNX Runtime (QDQ graph, uint8
activations, int8 per-channel weights, calibrated on training images): on this
CPU it is the route that runs VNNI integer kernels (docs/quantization.md has the
measurements behind that choice). bf16 and fp16 are casts of the torch module,
run by torch.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process
from torch import nn

from .errors import ApproxError

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INPUT, OUTPUT = "input", "output"


def export_onnx(model: nn.Module, example: torch.Tensor, path: Path, nn_name: str) -> Path:
    """Export a float module to ONNX with a dynamic batch dimension."""
    try:
        with warnings.catch_warnings():
            # The TorchScript exporter is deprecated, but its graphs are what ORT's quantizer handles best.
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                model.eval(),
                (example,),
                str(path),
                dynamo=False,
                opset_version=17,
                input_names=[INPUT],
                output_names=[OUTPUT],
                dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}},
            )
    except Exception as exc:  # the exporter raises many types; all mean the same to a user
        raise ApproxError(nn_name, "dtype", f"int8 needs an ONNX export of the model, which failed: {exc}") from exc
    return path


class CalibrationBatches(CalibrationDataReader):
    """Feeds calibration images to ONNX Runtime's quantizer in batches."""

    def __init__(self, x: np.ndarray, batch: int):
        self.chunks = iter([np.ascontiguousarray(x[i : i + batch], dtype=np.float32) for i in range(0, len(x), batch)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        chunk = next(self.chunks, None)
        return None if chunk is None else {INPUT: chunk}


def quantize_int8(model: nn.Module, example: torch.Tensor, calibration: np.ndarray, path: Path, nn_name: str) -> Path:
    """Write ``model`` as a statically quantized int8 ONNX (QDQ) file at ``path``."""
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = export_onnx(model, example, Path(tmp) / "fp32.onnx", nn_name)
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(str(fp32), str(prepared))
        quantize_static(
            str(prepared),
            str(path),
            CalibrationBatches(calibration, batch=8),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
        )
    return path


def ort_session(path: Path, threads: int | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    # ORT's pool threads spin after each run by default, stealing the cores from the
    # rest of the application (and from the other NN); they sleep instead.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def cast(model: nn.Module, dtype: str) -> nn.Module:
    """The module in a float dtype (int8 keeps the fp32 module it was quantized from)."""
    return model.to(TORCH_DTYPES.get(dtype, torch.float32)).eval()


def predict_torch(model: nn.Module, x: np.ndarray, batch: int = 32) -> np.ndarray:
    """Outputs of a torch module in its own dtype, as float32 numpy."""
    dtype = next(model.parameters()).dtype
    outs = []
    with torch.inference_mode():
        for i in range(0, len(x), batch):
            chunk = torch.from_numpy(np.asarray(x[i : i + batch], dtype=np.float32)).to(dtype)
            outs.append(model(chunk).float().numpy())
    return np.concatenate(outs)


def predict_onnx(session: ort.InferenceSession, x: np.ndarray, batch: int = 32) -> np.ndarray:
    outs = [
        session.run(None, {INPUT: np.ascontiguousarray(x[i : i + batch], dtype=np.float32)})[0]
        for i in range(0, len(x), batch)
    ]
    return np.concatenate(outs).astype(np.float32)
