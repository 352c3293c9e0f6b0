"""Registers the built-in backends under their spec names (``qaopt.kernels`` imports this module)."""

from __future__ import annotations

from typing import Any

from .auto import AutoBackend
from .onnxruntime_backend import OnnxRuntimeBackend
from .registry import register_backend
from .torch_backends import CHANNELS_LAST, TorchBackend, TorchCompileBackend
from .tvm_backend import TvmBackend


def _torch_compile(mode: str | None = None, **_: Any) -> TorchCompileBackend:
    return TorchCompileBackend(mode)


def _onnxruntime(**_: Any) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend()


register_backend("torch", TorchBackend.factory, variants=(CHANNELS_LAST,))
register_backend("torch-compile", _torch_compile)
register_backend("onnxruntime", _onnxruntime)
register_backend("tvm", TvmBackend)
register_backend("auto", AutoBackend)
