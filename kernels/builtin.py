"""Registers the built-in backends under their spec names (imported lazily by :func:`get_backend`)."""

from .auto import AutoBackend
from .backend import register_backend
from .onnxruntime_backend import OnnxRuntimeBackend
from .torch_backends import TorchBackend, TorchCompileBackend
from .tvm_backend import TvmBackend

register_backend("torch", lambda **_: TorchBackend())
register_backend("torch[channels_last]", lambda **_: TorchBackend(channels_last=True))
register_backend("torch-compile", lambda mode=None, **_: TorchCompileBackend(mode))
register_backend("onnxruntime", lambda **_: OnnxRuntimeBackend())
register_backend("tvm", TvmBackend)
register_backend("auto", AutoBackend)
