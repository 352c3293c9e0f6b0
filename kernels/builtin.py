"""Registers the built-in backends under their spec names, with the dtypes and devices each runs.

``qaopt.kernels`` imports this module.
"""

from __future__ import annotations

from typing import Any

from .auto import AutoBackend
from .onnxruntime_backend import OnnxRuntimeBackend
from .openvino_backend import OpenVinoBackend
from .registry import register_backend
from .torch_backends import CHANNELS_LAST, COMPILE_MODES, CUDA_GRAPH, TorchBackend, TorchCompileBackend
from .tvm_backend import TvmBackend


def _onnxruntime(**_: Any) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend()


def _openvino(**_: Any) -> OpenVinoBackend:
    return OpenVinoBackend()


# What each runs (docs/quantization.md has the routes measured): every backend runs fp32. oneDNN runs bf16
# natively on AVX-512 BF16 CPUs and every recent GPU, as OpenVINO does under its bf16 precision hint; fp16 is
# native on GPUs (x86 CPUs without AVX-512 FP16 emulate it, slower than fp32). int8 runs integer (VNNI) kernels
# through the static QDQ graph on ONNX Runtime and OpenVINO, and on TVM, whose import qaopt rewrites into
# integer convolutions (docs/latency.md, "TVM and int8"); those are CPU (VNNI) kernels, so on a GPU TVM declares
# fp32 and fp16, which MetaSchedule tunes into CUDA kernels (docs/latency.md, "GPU targets").
register_backend("torch", TorchBackend.factory, variants=(CHANNELS_LAST, CUDA_GRAPH), package="torch",
                 dtypes=("fp32", "bf16", "fp16"), devices=("cpu", "cuda"))
register_backend("torch-compile", TorchCompileBackend.factory, variants=COMPILE_MODES, package="torch",
                 dtypes=("fp32", "bf16", "fp16"), devices=("cpu", "cuda"))
register_backend("onnxruntime", _onnxruntime, package="onnxruntime",
                 dtypes=("fp32", "int8"), devices=("cpu", "cuda"))
register_backend("openvino", _openvino, package="openvino", dtypes=("fp32", "bf16", "int8"), devices=("cpu",))
register_backend("tvm", TvmBackend, package="apache-tvm",
                 dtypes={"cpu": ("fp32", "int8"), "rpc": ("fp32", "int8"), "cuda": ("fp32", "fp16")})
# auto runs nothing itself: it measures the backends above that run the candidate's dtype on the device.
register_backend("auto", AutoBackend, dtypes=())
