"""The torch and ONNX Runtime code of the quantization pass (:mod:`qaopt.approx.passes.quantization`).

The ONNX export and the ONNX Runtime sessions come from an injected
:class:`~qaopt.approx.OnnxToolchain` (``qaopt.kernels.onnx``): approx never owns a second exporter.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process
from torch import nn

from .errors import ApproxError
from .toolchain import OnnxToolchain

INPUT = "input"
"""The input name of every ONNX graph the toolchain exports."""


class CalibrationBatches(CalibrationDataReader):
    """Feeds calibration images to ONNX Runtime's quantizer in batches."""

    def __init__(self, x: np.ndarray, batch: int):
        self.chunks = iter([np.ascontiguousarray(x[i : i + batch], dtype=np.float32) for i in range(0, len(x), batch)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        chunk = next(self.chunks, None)
        return None if chunk is None else {INPUT: chunk}


def quantize_int8(
    model: nn.Module, example: torch.Tensor, calibration: np.ndarray, path: Path, nn_name: str, onnx: OnnxToolchain
) -> Path:
    """Write ``model`` as a statically quantized int8 ONNX (QDQ) file at ``path``."""
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        try:
            onnx.export_onnx(model.eval(), [example], fp32)
        except Exception as exc:  # the exporter raises many types; all mean the same to a user
            raise ApproxError(nn_name, "dtype", f"int8 needs an ONNX export of the model, which failed: {exc}") from exc
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(str(fp32), str(prepared))
        with torch.no_grad():
            columns = int(np.prod(model(example).shape[1:]))
        quantize_static(
            model_input=str(prepared),
            model_output=str(path),
            calibration_data_reader=CalibrationBatches(calibration, batch=8),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
            nodes_to_exclude=output_tail(prepared) if columns > 1 else [],
        )
    return path


ELEMENTWISE = {"Mul", "Add", "Sub", "Div"}


def output_tail(path: Path) -> list[str]:
    """The element-wise nodes between the graph's last layer and its output, left in float.

    Static quantization gives a tensor one scale; an output whose columns are in different units (the heads of
    a merged NN: degrees beside a ratio) would lose the small ones to the large ones' step. The last layer's
    own output stays quantized: its columns share one spread until the tail maps each to its unit.
    """
    import onnx as onnx_proto

    graph = onnx_proto.load(str(path)).graph
    producer = {out: node for node in graph.node for out in node.output}
    tail, frontier = [], [o.name for o in graph.output]
    while frontier:
        node = producer.get(frontier.pop())
        if node is None or node.op_type not in ELEMENTWISE:
            continue
        tail.append(node.name)
        frontier += list(node.input)
    return tail


def cast(model: nn.Module, torch_dtype: str | None) -> nn.Module:
    """The module in a float dtype by torch name (``None`` keeps fp32: int8 keeps the module it was quantized from)."""
    return model.to(getattr(torch, torch_dtype or "float32")).eval()


CPU_BATCH, GPU_BATCH = 8, 32
"""Frames per forward pass of :func:`predict_torch` on a CPU and on a GPU. On a CPU, torch's kernels ran CropFollow's
compact NN 1.6x slower per frame at 32 frames a batch (40 MB of activations a layer, past the caches) than at 4-16
(docs/benchmarks/error_inference.json, written by benchmarks/error_inference.py), with the same outputs; every candidate's error
is its outputs on thousands of frames, so that was a large share of a search. A GPU wants the larger batch."""


def predict_torch(model: nn.Module, x: np.ndarray, batch: int | None = None, device: str = "cpu") -> np.ndarray:
    """Outputs of a torch module in its own dtype, as float32 numpy; run on ``device``, the module left where it was.

    ``batch`` frames go through it at a time (``None``: :data:`CPU_BATCH` or :data:`GPU_BATCH`, by ``device``). A
    module that already lives on ``device`` stays there without a copy, so a caller that runs it frame by frame (a
    closed-loop run on a GPU) places it once.
    """
    first = next(model.parameters())
    dtype, home, there = first.dtype, first.device, torch.device(device)
    # Moving a module visits every parameter even when it stays put (0.26 ms a move for CropFollow's compact NN,
    # two a call: about 6 % of a closed-loop run), so a module already on the device is not moved.
    move = home.type != there.type or (there.index is not None and there.index != home.index)
    batch = batch or (CPU_BATCH if there.type == "cpu" else GPU_BATCH)
    outs = []
    if move:
        model.to(there)
    try:
        with torch.inference_mode():
            for i in range(0, len(x), batch):
                chunk = torch.from_numpy(np.asarray(x[i : i + batch], dtype=np.float32)).to(there, dtype)
                outs.append(model(chunk).float().cpu().numpy())
    finally:
        if move:
            model.to(home)
    return np.concatenate(outs)


def predict_onnx(session, x: np.ndarray, batch: int = 32) -> np.ndarray:
    outs = [
        session.run(None, {INPUT: np.ascontiguousarray(x[i : i + batch], dtype=np.float32)})[0]
        for i in range(0, len(x), batch)
    ]
    return np.concatenate(outs).astype(np.float32)
