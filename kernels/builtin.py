"""Registers the built-in backends under their spec names (``qaopt.kernels`` imports this module)."""

from __future__ import annotations

from typing import Any

from .auto import AutoBackend
from .onnxruntime_backend import OnnxRuntimeBackend
from .openvino_backend import OpenVinoBackend
from .registry import register_backend
from .torch_backends import CHANNELS_LAST, TorchBackend, TorchCompileBackend
from .tvm_backend import TvmBackend


def _torch_compile(mode: str | None = None, **_: Any) -> TorchCompileBackend:
    return TorchCompileBackend(mode)


def _onnxruntime(**_: Any) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend()


def _openvino(**_: Any) -> OpenVinoBackend:
    return OpenVinoBackend()


register_backend("torch", TorchBackend.factory, variants=(CHANNELS_LAST,), package="torch")
register_backend("torch-compile", _torch_compile, package="torch")
register_backend("onnxruntime", _onnxruntime, package="onnxruntime")
register_backend("openvino", _openvino, package="openvino")
register_backend("tvm", TvmBackend, package="apache-tvm")
register_backend("auto", AutoBackend)
