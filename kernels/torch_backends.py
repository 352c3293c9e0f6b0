"""PyTorch backends: eager (the vendor-library baseline: oneDNN on CPU, cuDNN on GPU) and Inductor.

Eager needs no compilation and is strong on this CPU (oneDNN reached 50-61 % of fp32
peak on the CropFollow NNs, and survey-tuned TVM 0.29-0.33x of its speed: docs/BENCHMARKS.md),
so it is the floor every tuned candidate must beat (Luthier's lesson).
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .backend import LocalCompiled
from .errors import BuildError
from .model import Model, as_numpy, module_of, param_bytes_of, require_torch_model, torch_inputs, unsupported
from .registry import BackendRef
from .target import Target

CHANNELS_LAST = "channels_last"
"""The variant of backend 'torch' that runs NHWC activations: ``torch[channels_last]``."""
CUDA_GRAPH = "cuda_graph"
"""The variant of backend 'torch' that replays the eager NN as one CUDA graph: ``torch[cuda_graph]``."""


def _torch_unavailable(target: Target) -> str | None:
    import torch

    if target.device == "rpc":
        return "it runs in this process only; use backend 'tvm' for remote devices"
    if target.device == "cuda" and not torch.cuda.is_available():
        return "target.device is cuda but this torch build sees no CUDA GPU"
    return None


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Apply ``threads`` to torch's intra-op pool (process-wide), and restore it after; ``None`` leaves it."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class TorchCompiled(LocalCompiled):
    """A torch module (eager or compiled by Inductor) placed on the target device."""

    def __init__(self, backend: str, fn: Callable[..., Any], module: Any, example_inputs: Sequence[Any], target: Target,
                 channels_last: bool, exported: Any):
        super().__init__(target, example_inputs, param_bytes_of(module))
        self.backend = backend
        self.fn = fn
        self.module = module
        self.channels_last = channels_last
        self._exported = exported
        self._device_inputs = self._to_device(torch_inputs(example_inputs, like=module))

    def _to_device(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        import torch

        device = "cuda" if self.target.device == "cuda" else "cpu"
        out = []
        for t in inputs:
            t = t.to(device)
            if self.channels_last and t.dim() == 4:
                t = t.contiguous(memory_format=torch.channels_last)
            out.append(t)
        return tuple(out)

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        import torch

        with torch.inference_mode(), self._threads():
            out = self.fn(*self._to_device(torch_inputs(inputs or self.example_inputs, like=self.module)))
        outs = out if isinstance(out, (tuple, list)) else [out]
        return [as_numpy(o) for o in outs]

    def inference(self) -> Callable[[], Any]:
        import torch

        fn, inputs = self.fn, self._device_inputs
        if self.target.device == "cuda":
            # One frame on a GPU ends when its result is ready: a robot waits for each before the next arrives,
            # so calls are not queued behind each other (that would time throughput, not latency).
            def frame() -> Any:
                with torch.inference_mode():
                    out = fn(*inputs)
                torch.cuda.synchronize()
                return out

            return frame

        def call() -> Any:
            with torch.inference_mode():
                return fn(*inputs)

        return call

    def _timer(self) -> CudaEventTimer | None:
        return CudaEventTimer() if self.target.device == "cuda" else None

    def _threads(self) -> Any:
        return torch_threads(self.target.threads)

    def _sync(self) -> Callable[[], None] | None:
        import torch

        return torch.cuda.synchronize if self.target.device == "cuda" else None

    def _cuda_peak(self) -> Any:
        import torch

        if self.target.device != "cuda":
            return None
        return lambda: (torch.cuda.reset_peak_memory_stats, lambda: torch.cuda.max_memory_allocated() - self.param_bytes)

    def export(self, path: str | Path) -> Path:
        """Eager: the torch.export program (.pt2). Inductor: an AOTInductor package, compiled ahead of time."""
        import torch

        path = Path(path)
        ep = self._exported()
        if BackendRef.parse(self.backend).name == "torch-compile":
            return Path(torch._inductor.aoti_compile_and_package(ep, package_path=str(path.with_suffix(".pt2"))))
        torch.export.save(ep, path.with_suffix(".pt2"))
        return path.with_suffix(".pt2")


class CudaEventTimer:
    """Times a sample with CUDA events in the current stream (:class:`~qaopt.kernels.measure.SampleTimer`)."""

    def __init__(self) -> None:
        import torch

        self._begin = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self._begin.record()

    def stop(self) -> float:
        self._end.record()
        self._end.synchronize()
        return float(self._begin.elapsed_time(self._end))


class TorchBackend:
    """Eager PyTorch under ``torch.inference_mode()``, in one of its variants.

    - ``torch[channels_last]``: NHWC activations (faster oneDNN convolutions on this CPU);
    - ``torch[cuda_graph]``: the eager NN captured once as a CUDA graph and replayed per frame. At batch 1 a
      GPU waits on the host's kernel launches; a replay launches the whole NN at once. Captured by hand from
      eager (cuDNN's kernels), it ran the compact CropFollow NNs in 0.15-0.16 ms on an H200, against 0.21-0.29
      for Inductor's CUDA graphs and 0.69-0.79 eager (docs/benchmarks/gpu.json).
    """

    def __init__(self, variant: str | None = None):
        self.channels_last = variant == CHANNELS_LAST
        self.cuda_graph = variant == CUDA_GRAPH
        self.name = str(BackendRef("torch", variant))

    @classmethod
    def factory(cls, variant: str | None = None, **_: Any) -> TorchBackend:
        """The registry's factory: ``torch``, ``torch[channels_last]`` or ``torch[cuda_graph]``."""
        return cls(variant)

    def unavailable_reason(self, target: Target) -> str | None:
        reason = _torch_unavailable(target)
        if reason is None and self.cuda_graph and target.device != "cuda":
            reason = "a CUDA graph replays on a GPU: it serves target.device cuda"
        return reason

    def compile(self, model: Model, example_inputs: Sequence[Any], target: Target) -> TorchCompiled:
        require_torch_model(model, self.name)
        module = _prepare(model, target, self.channels_last)
        compiled = TorchCompiled(self.name, module, module, example_inputs, target, self.channels_last,
                                 _exporter(module, example_inputs))
        if self.cuda_graph:
            start = time.perf_counter()
            try:
                compiled.fn = CudaGraphed(module, compiled._device_inputs)
            except Exception as exc:
                raise BuildError(f"backend '{self.name}' could not capture {type(module).__name__} as a CUDA graph: "
                                 f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
            compiled.compile_seconds = time.perf_counter() - start
        return compiled


class CudaGraphed:
    """An eager module captured once as a CUDA graph: a call copies its inputs into the captured ones and replays.

    The outputs are the graph's own tensors, overwritten by the next call (callers copy them out, as
    :meth:`TorchCompiled.run` does).
    """

    WARMUP_CALLS = 3
    """Eager calls on a side stream before capture: cuDNN picks its algorithms and the allocator settles."""

    def __init__(self, module: Any, inputs: Sequence[Any]):
        import torch

        self.inputs = [t.clone() for t in inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(self.WARMUP_CALLS):
                module(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph):
            self.outputs = module(*self.inputs)

    def __call__(self, *inputs: Any) -> Any:
        for captured, x in zip(self.inputs, inputs):
            if captured.data_ptr() != x.data_ptr():
                captured.copy_(x)
        self.graph.replay()
        return self.outputs


REDUCE_OVERHEAD, MAX_AUTOTUNE = "reduce-overhead", "max-autotune"
"""The variants of backend 'torch-compile': Inductor's modes, written ``torch-compile[reduce-overhead]``."""
COMPILE_MODES = (REDUCE_OVERHEAD, MAX_AUTOTUNE)


class TorchCompileBackend:
    """Inductor (``torch.compile``): CUDA graphs (``reduce-overhead``) on GPU, the default mode on CPU.

    At batch 1 a GPU is launch-bound: replaying the NN as one CUDA graph ran ResNet-18
    at 240x320 7-8x faster than eager on an H200 (0.35 against 2.74 ms fp32), so a plain
    ``torch-compile`` on a CUDA target is ``reduce-overhead``. ``max-autotune`` (Triton
    autotuning, CUDA graphs too) is a variant a spec names: it compiled the two
    CropFollow references in 147 s there, its cost is recorded as ``compile_s``, and
    the autotuner's tables are kept off the console. Compilation happens on the first
    call, so :meth:`compile` runs the model once; a compile error becomes a :class:`BuildError`.
    """

    def __init__(self, mode: str | None = None):
        self.mode = mode
        self.name = str(BackendRef("torch-compile", mode))

    @classmethod
    def factory(cls, variant: str | None = None, **_: Any) -> TorchCompileBackend:
        """The registry's factory: ``torch-compile``, ``torch-compile[reduce-overhead]`` or ``[max-autotune]``."""
        return cls(mode=variant)

    def unavailable_reason(self, target: Target) -> str | None:
        reason = _torch_unavailable(target)
        if reason is None and target.device == "cpu" and not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")):
            reason = ("Inductor compiles C++ for the CPU and found no compiler (g++, clang++ or $CXX); "
                      "install one (e.g. apt-get install g++) or use backend 'torch' or 'onnxruntime'")
        if reason is None and target.device == "cpu" and self.mode == REDUCE_OVERHEAD:
            reason = "reduce-overhead replays CUDA graphs: it serves target.device cuda; use 'torch-compile' on a CPU"
        return reason

    def compile(self, model: Model, example_inputs: Sequence[Any], target: Target) -> TorchCompiled:
        import torch

        require_torch_model(model, self.name)
        module = _prepare(model, target, channels_last=False)
        mode = self.mode or (REDUCE_OVERHEAD if target.device == "cuda" else "default")
        compiled = TorchCompiled(self.name, torch.compile(module, mode=mode), module, example_inputs, target, False,
                                 _exporter(module, example_inputs))
        start = time.perf_counter()
        try:
            with torch_threads(target.threads), _quiet_compile():
                call = compiled.inference()  # on a GPU each call ends with a synchronize
                for _ in range(CUDA_GRAPH_RECORDING_CALLS if mode != "default" else 1):
                    call()
        except Exception as exc:
            raise BuildError(f"backend '{self.name}' (mode {mode}) failed to compile {type(module).__name__}: "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
        compiled.compile_seconds = time.perf_counter() - start
        return compiled


CUDA_GRAPH_RECORDING_CALLS = 3
"""Calls that compile and record: cudagraph trees warm up on the first call and record on a later one, so the
recording's cost lands in ``compile_s`` rather than in the first measured samples."""


@contextlib.contextmanager
def _quiet_compile() -> Iterator[None]:
    """Keep Inductor's chatter off the user's console: max-autotune's per-kernel timing tables (written to stderr),
    and the advice to enable TensorFloat32 for float32 matrix products, which a fresh process (the side-by-side
    stage's) prints again. qaopt leaves TF32 off on purpose: an fp32 NN runs with the numerics its error was
    measured with."""
    import warnings

    from torch._inductor import config

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores", category=UserWarning)
        if not hasattr(config, "autotune_num_choices_displayed"):
            yield
            return
        with config.patch(autotune_num_choices_displayed=0):
            yield


def _prepare(model: Model, target: Target, channels_last: bool) -> Any:
    import torch

    module = module_of(model)
    if isinstance(module, torch.nn.Module) and hasattr(module, "eval") and not isinstance(module, torch.fx.GraphModule):
        module = module.eval()
    if isinstance(module, torch.nn.Module) and (target.device == "cuda" or channels_last):
        # nn.Module.to moves in place: a copy, so the caller's candidate stays on the CPU in its layout (export,
        # validation and the next backend read it).
        module = copy.deepcopy(module)
    if target.device == "cuda":
        module = module.to("cuda")
    if channels_last:
        module = module.to(memory_format=torch.channels_last)
    return module


def _exporter(module: Any, example_inputs: Sequence[Any]) -> Callable[[], Any]:
    def export() -> Any:
        import torch

        try:
            return torch.export.export(module, torch_inputs(example_inputs, like=module))
        except Exception as exc:
            raise unsupported("torch", module, f"torch.export failed: {type(exc).__name__}: {exc}") from exc

    return export

