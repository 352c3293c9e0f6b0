"""OpenVINO: the CPU runtime x86 edge teams choose, beside ONNX Runtime.

It reads what the other backends read: fp32 from the torch module (exported
once by :func:`.onnx.export_onnx`) or an ONNX file, int8 from the static QDQ
ONNX graph qaopt's quantization makes (OpenVINO turns the Q/DQ pairs into its
own integer kernels), and bf16 by running the fp32 graph under OpenVINO's
``INFERENCE_PRECISION_HINT`` where the CPU has bf16 instructions. The fp32
precision is set explicitly: on bf16-capable CPUs OpenVINO would otherwise run
an fp32 model in bf16, and its figure would not be the fp32 candidate's.
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .backend import LocalCompiled
from .errors import BuildError, missing_engine
from .model import Model, describe, is_onnx, model_dtype, module_of, param_bytes_of, unsupported
from .onnx import export_onnx, onnx_param_bytes
from .target import Target

PRECISION = {"float32": "f32", "onnx": "f32", "bfloat16": "bf16"}
"""The inference precision OpenVINO runs each model dtype in (an ONNX file, fp32 or int8 QDQ, as given)."""


ZERO_COPY = {"share_inputs": True, "share_outputs": True}
"""How a frame is handed to OpenVINO and its outputs read back: in place, as a deployed NN reads its camera buffer. By
default the Python API copies every input into the request and every output into a new dict; for a 240x320 frame that
was 0.2 ms of each inference on a 2-core Xeon (0.53 against 0.34 ms for CropFollow's merged int8 NN at half the input,
``benchmarks/resize_cost.py``, docs/BENCHMARKS.md), measured as if it were the NN's."""


class OpenVinoCompiled(LocalCompiled):
    backend = "openvino"

    def __init__(self, compiled: Any, ir: Any, example_inputs: Sequence[Any], target: Target, param_bytes: int,
                 precision: str):
        super().__init__(target, example_inputs, param_bytes)
        self.compiled = compiled
        self.ir = ir
        self.precision = precision
        self.request = compiled.create_infer_request()
        self._feed = self._feed_of(self.example_inputs)

    @staticmethod
    def _feed_of(inputs: Sequence[np.ndarray]) -> dict[int, np.ndarray]:
        return {i: np.ascontiguousarray(x, dtype=np.float32 if x.dtype == np.float64 else x.dtype)
                for i, x in enumerate(inputs)}

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        self.request.infer(self._feed_of(inputs) if inputs else self._feed, **ZERO_COPY)
        return [self.request.get_output_tensor(i).data.copy() for i in range(len(self.compiled.outputs))]

    def inference(self) -> Callable[[], Any]:
        request, feed = self.request, self._feed
        return lambda: request.infer(feed, **ZERO_COPY)

    def export(self, path: str | Path) -> Path:
        """The OpenVINO IR (``.xml`` with its ``.bin`` beside it), loadable with ``openvino.Core().read_model``."""
        import openvino as ov

        path = Path(path).with_suffix(".xml")
        ov.save_model(self.ir, str(path))
        return path


class OpenVinoBackend:
    """OpenVINO's CPU plugin: one stream, ``target.threads`` inference threads, latency hint."""

    name = "openvino"

    def unavailable_reason(self, target: Target) -> str | None:
        missing = missing_engine("openvino", "openvino")
        if missing:
            return missing
        if target.device != "cpu":
            return "qaopt runs OpenVINO on this machine's CPU only; use backend 'tvm' for remote devices"
        return None

    def compile(self, model: Model, example_inputs: Sequence[Any], target: Target) -> OpenVinoCompiled:
        import openvino as ov

        start = time.perf_counter()
        dtype = model_dtype(model)
        if dtype not in PRECISION:
            raise unsupported(self.name, model, f"no {dtype} kernels on OpenVINO's CPU plugin; it runs fp32, bf16 "
                              "and int8 (QDQ ONNX)")
        core = ov.Core()
        precision = PRECISION[dtype]
        if precision == "bf16" and "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
            raise unsupported(self.name, model, "this CPU has no bf16 instructions, so OpenVINO would emulate bf16; "
                              "run bf16 candidates on backend 'torch' or drop bf16 from the dtypes")
        with tempfile.TemporaryDirectory(prefix="qaopt-ov-") as tmp:
            if is_onnx(model):
                path, param_bytes = Path(model), onnx_param_bytes(model)
            elif isinstance(model, (str, Path)):
                raise unsupported(self.name, model, "expected an .onnx file or a torch module")
            else:
                # bf16 runs the fp32 graph under the bf16 precision hint: OpenVINO rounds weights and activations itself.
                module = copy.deepcopy(module_of(model)).float() if dtype == "bfloat16" else model
                path = export_onnx(module, example_inputs, Path(tmp) / "model.onnx")
                param_bytes = param_bytes_of(module_of(model))
            config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_PRECISION_HINT": precision,
                      # qaopt pins the threads of every runtime while it measures (kernels.measure.pinned)
                      "ENABLE_CPU_PINNING": False}
            if target.threads:
                config["INFERENCE_NUM_THREADS"] = target.threads
            try:
                ir = core.read_model(str(path))
                compiled = core.compile_model(ir, "CPU", config)
            except Exception as exc:  # OpenVINO raises RuntimeError for every conversion or plugin failure
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise BuildError(f"{describe(model)}: backend '{self.name}' could not compile the model: {first}") from exc
        result = OpenVinoCompiled(compiled, ir, example_inputs, target, param_bytes, precision)
        result.compile_seconds = time.perf_counter() - start
        return result

