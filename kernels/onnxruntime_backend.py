"""ONNX Runtime: the CPU vendor runtime edge teams already ship (it runs on a Raspberry Pi too).

Takes ONNX files (fp32, or int8 QDQ from static quantization) as they are, and
torch modules after exporting them with :func:`.onnx.export_onnx`; sessions come
from :func:`.onnx.ort_session`.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .backend import LocalCompiled
from .errors import BuildError, UnsupportedOperatorError
from .model import Model, describe, is_onnx, model_dtype, unsupported
from .onnx import export_onnx, onnx_param_bytes, ort_session
from .target import Target

_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\((\d+)\)")


class OrtCompiled(LocalCompiled):
    backend = "onnxruntime"

    def __init__(self, session: Any, onnx_path: Path, example_inputs: Sequence[Any], target: Target, tmp: Any):
        super().__init__(target, example_inputs, onnx_param_bytes(onnx_path))
        self.session = session
        self.onnx_path = onnx_path
        # The exported file lives as long as the session; its folder goes with this object, quietly (a
        # TemporaryDirectory left to the garbage collector warns "Implicitly cleaning up" for every candidate).
        self._tmp = weakref.finalize(self, shutil.rmtree, tmp, ignore_errors=True) if tmp is not None else None
        self._names = [i.name for i in session.get_inputs()]
        self._feed = self._feed_of(self.example_inputs)

    def _feed_of(self, inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        return {n: np.ascontiguousarray(x, dtype=np.float32 if x.dtype == np.float64 else x.dtype)
                for n, x in zip(self._names, inputs)}

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return list(self.session.run(None, self._feed_of(inputs) if inputs else self._feed))

    def inference(self) -> Callable[[], Any]:
        session, feed = self.session, self._feed
        return lambda: session.run(None, feed)

    def export(self, path: str | Path) -> Path:
        path = Path(path).with_suffix(".onnx")
        shutil.copyfile(self.onnx_path, path)
        return path


class OnnxRuntimeBackend:
    """ONNX Runtime's CPU execution provider (CUDA provider when the target is cuda and it is installed)."""

    name = "onnxruntime"

    def unavailable_reason(self, target: Target) -> str | None:
        try:
            import onnxruntime as ort
        except ImportError:
            return "onnxruntime is not installed"
        if target.device == "rpc":
            return "it runs in this process only; use backend 'tvm' for remote devices"
        if target.device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            return "this onnxruntime build has no CUDA execution provider"
        return None

    def compile(self, model: Model, example_inputs: Sequence[Any], target: Target) -> OrtCompiled:
        tmp = None
        if is_onnx(model):
            path = Path(model)
        elif isinstance(model, (str, Path)):
            raise unsupported(self.name, model, "expected an .onnx file or a torch module")
        else:
            if model_dtype(model) == "bfloat16":
                raise unsupported(self.name, model, "onnxruntime's CPU provider has no bf16 convolution kernels; "
                                  "run bf16 candidates on backend 'torch', or give an fp32/int8 ONNX model")
            tmp = tempfile.mkdtemp(prefix="qaopt-ort-")
            path = export_onnx(model, example_inputs, Path(tmp) / "model.onnx")
        try:
            session = ort_session(path, target.threads, target.device)
        except Exception as exc:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            match = _NO_KERNEL.search(str(exc))
            if match:
                raise UnsupportedOperatorError(f"{match.group(1)} (opset {match.group(2)})", self.name, describe(model),
                                               "no kernel for these input types; choose backend torch or tvm") from exc
            raise BuildError(f"{describe(model)}: backend '{self.name}' could not load the model: {exc}") from exc
        return OrtCompiled(session, path, example_inputs, target, tmp)
