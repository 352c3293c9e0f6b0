"""The backend protocol: ``compile(model, example_inputs, target) -> Compiled``.

A *model* is what the approximation step hands over: a ``torch.nn.Module``
(fp32 or bf16), a ``torch.export.ExportedProgram``, or the path of an ONNX file
(e.g. an int8 QDQ model). Each backend says which of these it can run; one
that cannot raises :class:`UnsupportedModelError` naming itself and the fix.

A :class:`Compiled` runs on numpy inputs, is timed by the shared measurement
protocol (:mod:`.measure`), and exports its artifact for deployment.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol as TypingProtocol, runtime_checkable

import numpy as np

from .errors import BackendUnavailableError, UnsupportedModelError
from .measure import Measurement, Protocol, measure_callable
from .target import Target

if TYPE_CHECKING:
    import torch

Model = Any  # torch.nn.Module | torch.export.ExportedProgram | str | Path (ONNX file)


@runtime_checkable
class Compiled(TypingProtocol):
    """A model compiled for one target by one backend."""

    backend: str
    target: Target

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]: ...

    def measure(self, protocol: Protocol = Protocol()) -> Measurement: ...

    def export(self, path: str | Path) -> Path: ...


@runtime_checkable
class Backend(TypingProtocol):
    """Turns a model into a :class:`Compiled` for a target."""

    name: str

    def unavailable_reason(self, target: Target) -> str | None:
        """``None`` when the backend can serve ``target`` here, else why not (shown to the user)."""
        ...

    def compile(self, model: Model, example_inputs: Sequence[Any], target: Target) -> Compiled: ...


class LocalCompiled(abc.ABC):
    """Shared part of compiled models that run in this process: input handling and measurement."""

    backend: str

    def __init__(self, target: Target, example_inputs: Sequence[Any], param_bytes: int):
        self.target = target
        self.example_inputs = [as_numpy(x) for x in example_inputs]
        self.param_bytes = param_bytes
        self.compile_seconds = 0.0

    @abc.abstractmethod
    def run(self, *inputs: np.ndarray) -> list[np.ndarray]: ...

    @abc.abstractmethod
    def export(self, path: str | Path) -> Path: ...

    @abc.abstractmethod
    def _bind(self) -> Callable[[], Any]:
        """A zero-argument call that runs one inference on the example inputs, already on the device."""

    def _threads(self) -> Any:
        """A context that applies the target's thread count while running (default: nothing to do)."""
        return contextlib.nullcontext()

    def _sync(self) -> Callable[[], None] | None:
        return None

    def _cuda_peak(self) -> Any:
        return None

    def measure(self, protocol: Protocol = Protocol()) -> Measurement:
        with self._threads():
            return measure_callable(
                self._bind(),
                backend=self.backend,
                device=self.target.device,
                device_key=self.target.device_key,
                threads=self.target.threads,
                param_bytes=self.param_bytes,
                protocol=protocol,
                sync=self._sync(),
                cuda_peak=self._cuda_peak(),
                extra={"compile_s": round(self.compile_seconds, 3)},
            )


# --------------------------------------------------------------------------- model helpers


def as_numpy(x: Any) -> np.ndarray:
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


def model_dtype(model: Model) -> str:
    """'float32', 'bfloat16', … of a torch model's first floating parameter; 'onnx' for ONNX files."""
    if is_onnx(model):
        return "onnx"
    module = model.module() if isinstance(model, _exported_program_type()) else model
    for p in module.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return "float32"


def unsupported(backend: str, model: Model, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{describe(model)}: backend '{backend}' cannot run this model: {why}")


def require_torch_model(model: Model, backend: str) -> None:
    if is_onnx(model):
        raise unsupported(backend, model, "it runs torch models only; use backend 'onnxruntime' or 'tvm' for ONNX files")
    if isinstance(model, (str, Path)):
        raise unsupported(backend, model, "expected a torch.nn.Module, an ExportedProgram or an .onnx file")


def _exported_program_type() -> type:
    import torch

    return torch.export.ExportedProgram


def torch_inputs(example_inputs: Sequence[Any], like: torch.nn.Module | None = None) -> tuple[Any, ...]:
    """Example inputs as torch tensors (cast to the model's floating dtype, e.g. bf16)."""
    import torch

    dtype = None
    if like is not None:
        dtype = next((p.dtype for p in like.parameters() if p.is_floating_point()), None)
    out = []
    for x in example_inputs:
        t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))
        out.append(t.to(dtype) if dtype is not None and t.is_floating_point() else t)
    return tuple(out)


def param_bytes_of(module: Any) -> int:
    return int(sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers())))


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[str, Callable[..., Backend]] = {}


def register_backend(name: str, factory: Callable[..., Backend]) -> None:
    """Add a backend (a team's own compiler, say) under ``name``."""
    _REGISTRY[name] = factory


def get_backend(name: str, **options: Any) -> Backend:
    """The backend registered under ``name`` ('torch', 'torch-compile', 'tvm', 'onnxruntime', 'auto', …).

    ``options`` go to the backend's constructor (e.g. ``cache_dir`` for 'tvm' and 'auto').
    """
    from . import builtin  # noqa: F401 - registers the built-in backends

    if name not in _REGISTRY:
        raise BackendUnavailableError(f"target.backend: no backend named '{name}'; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**options)


def backend_names() -> list[str]:
    from . import builtin  # noqa: F401

    return sorted(_REGISTRY)


def model_key(model: Model, example_inputs: Sequence[Any]) -> str:
    """Content hash of a model (architecture and weights, or the ONNX file's bytes) and its input shapes."""
    from qaopt.app_spec.hashing import content_hash, file_hash

    shapes = [[list(np.shape(as_numpy(x))), str(as_numpy(x).dtype)] for x in example_inputs]
    if isinstance(model, (str, Path)):
        return content_hash(file_hash(model), shapes)
    module = model.module() if isinstance(model, _exported_program_type()) else model
    state = module.state_dict()
    weights = b"".join(t.detach().cpu().contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes()
                       for t in state.values())
    return content_hash(str(module), list(state), weights, shapes)
