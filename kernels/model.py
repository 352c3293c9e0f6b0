"""What a backend is handed, and helpers every backend uses on it.

A *model* is what the approximation step hands over: a ``torch.nn.Module``
(fp32 or bf16), a ``torch.export.ExportedProgram``, or the path of an ONNX file
(e.g. an int8 QDQ model). Each backend says which of these it can run; one that
cannot raises :class:`UnsupportedModelError` naming itself and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qaopt.app_spec.hashing import content_hash, file_hash

from .errors import UnsupportedModelError

Model = Any  # torch.nn.Module | torch.export.ExportedProgram | str | Path (ONNX file)


def as_numpy(x: Any) -> np.ndarray:
    """A tensor or array as numpy (bf16 tensors as float32, which numpy lacks)."""
    if hasattr(x, "detach"):
        x = x.detach()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.cpu().numpy()
    return np.asarray(x)


def is_onnx(model: Model) -> bool:
    return isinstance(model, (str, Path)) and str(model).endswith(".onnx")


def describe(model: Model) -> str:
    """A short name of the model for error messages."""
    if isinstance(model, (str, Path)):
        return str(model)
    return type(model).__name__


def module_of(model: Model) -> Any:
    """The torch module of a module or of an ``ExportedProgram``."""
    return model.module() if hasattr(model, "graph_signature") else model


def model_dtype(model: Model) -> str:
    """'float32', 'bfloat16', … of a torch model's first floating parameter; 'onnx' for ONNX files."""
    if is_onnx(model):
        return "onnx"
    for p in module_of(model).parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return "float32"


def unsupported(backend: str, model: Model, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{describe(model)}: backend '{backend}' cannot run this model: {why}")


def require_torch_model(model: Model, backend: str) -> None:
    if is_onnx(model):
        raise unsupported(backend, model, "it runs torch models only; use backend 'onnxruntime', 'openvino' or 'tvm' for ONNX files")
    if isinstance(model, (str, Path)):
        raise unsupported(backend, model, "expected a torch.nn.Module, an ExportedProgram or an .onnx file")


def torch_inputs(example_inputs: Sequence[Any], like: Any = None) -> tuple[Any, ...]:
    """Example inputs as torch tensors like the model's: cast to its floating dtype (e.g. bf16), on its device.

    The device matters where the model has moved (a GPU target): tracing it with inputs left on the CPU
    fails ("found two different devices cpu, cuda:0").
    """
    import torch

    dtype = device = None
    if like is not None:
        dtype = next((p.dtype for p in like.parameters() if p.is_floating_point()), None)
        device = next((t.device for t in [*like.parameters(), *like.buffers()]), None)
    out = []
    for x in example_inputs:
        t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))
        t = t.to(dtype) if dtype is not None and t.is_floating_point() else t
        out.append(t.to(device) if device is not None else t)
    return tuple(out)


def param_bytes_of(module: Any) -> int:
    """Bytes of a torch module's parameters and buffers."""
    return int(sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers())))


def model_key(model: Model, example_inputs: Sequence[Any]) -> str:
    """Content hash of a model (architecture and weights, or the ONNX file's bytes) and its input shapes."""
    import torch

    shapes = [[list(np.shape(as_numpy(x))), str(as_numpy(x).dtype)] for x in example_inputs]
    if isinstance(model, (str, Path)):
        return content_hash(file_hash(model), shapes)
    module = module_of(model)
    state = module.state_dict()
    weights = b"".join(t.detach().cpu().contiguous().view(-1).view(dtype=torch.uint8).numpy().tobytes()
                       for t in state.values())
    return content_hash(str(module), list(state), weights, shapes)
