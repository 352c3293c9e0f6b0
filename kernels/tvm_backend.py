"""TVM: Relax + MetaSchedule tuning against a shared database, run locally or over RPC.

The compilation steps are in :mod:`.tvm_build`, tuning in :mod:`.tuning`, remote
execution in :mod:`.remote`; this module is the backend that strings them together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import tuning
from .backend import LocalCompiled
from .errors import missing_engine
from .measure import Protocol
from .model import Model
from .remote import RemoteTvmCompiled
from .target import Target
from .torch_backends import CudaEventTimer
from .tvm_build import Prepared, build, configure_threads, export_library, flatten, prepare


class TvmCompiled(LocalCompiled):
    """A Relax VM executable running in this process: on this machine's CPU, or on its GPU for a CUDA target."""

    backend = "tvm"

    def __init__(self, executable: Any, prepared: Prepared, example_inputs: Sequence[Any], target: Target,
                 tuning: Any = None):
        super().__init__(target, example_inputs, prepared.param_bytes)
        import tvm
        from tvm import relax

        self.executable = executable
        self.prepared = prepared
        self.tuning = tuning  # the TuningReport when it was tuned
        self.device = tvm.cuda(0) if target.device == "cuda" else tvm.cpu()
        self.vm = relax.VirtualMachine(executable, self.device)
        self._args = self._tensors(self.example_inputs)

    def _tensors(self, inputs: Sequence[np.ndarray]) -> list[Any]:
        import tvm

        return [tvm.runtime.tensor(np.ascontiguousarray(x, dtype=dtype), self.device)
                for x, dtype in zip(inputs, self.prepared.input_dtypes)]

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        configure_threads(self.target.threads)
        out = self.vm["main"](*(self._tensors(inputs) if inputs else self._args))
        return flatten(out)

    def inference(self) -> Callable[[], Any]:
        configure_threads(self.target.threads)
        main, args = self.vm["main"], self._args
        if self.target.device == "cuda":
            sync = self.device.sync

            def frame() -> Any:  # a frame on a GPU ends when its result is ready (as torch's, .torch_backends)
                out = main(*args)
                sync()
                return out

            return frame
        return lambda: main(*args)

    def _sync(self) -> Callable[[], None] | None:
        return self.device.sync if self.target.device == "cuda" else None

    def _timer(self) -> Any:
        """CUDA events on the null stream, which TVM launches on, as torch's GPU backends are timed."""
        return CudaEventTimer() if self.target.device == "cuda" else None

    def _cuda_peak(self) -> Any:
        """On a GPU, memory TVM's allocator holds is invisible to torch's counters and the host's resident set:
        left unmeasured (``None``) rather than reported as the host's."""
        if self.target.device != "cuda":
            return None
        return lambda: ((lambda: None), (lambda: None))

    def export(self, path: str | Path) -> Path:
        """The compiled library (.so, loadable with ``tvm.runtime.load_module``; .tar of objects for a cross target;
        for a GPU, the .so carries the CUDA kernels)."""
        return export_library(self.executable, Path(path), self.target)


def cuda_unavailable_reason() -> str | None:
    """Why TVM cannot build and run CUDA kernels in this process (``None`` when it can).

    TVM's PyPI wheel carries its CUDA runtime as a side library that loads, silently or not at all, when ``tvm`` is
    imported; it needs the CUDA runtime a CUDA torch brings, so torch is imported first. Kernels are compiled by
    NVRTC through the ``cuda-bindings`` package, against the CUDA toolkit's headers (nvcc itself is not run).
    """
    import importlib.util

    import torch  # noqa: F401 - loads the CUDA runtime libraries TVM's CUDA runtime links against
    import tvm

    if not tvm.runtime.enabled("cuda"):
        return ("TVM's CUDA runtime did not load here (its wheel's libtvm_runtime_cuda.so needs libcudart and "
                "libcuda of CUDA 13: a CUDA 13 torch brings the first, the NVIDIA driver the second)")
    if not tvm.cuda(0).exist:
        return "TVM sees no CUDA GPU here"
    if importlib.util.find_spec("cuda.bindings") is None:
        return ("TVM compiles CUDA kernels with NVRTC through the cuda-bindings package, not installed: "
                "pip install 'qaopt[tvm-cuda]'")
    from tvm.support.nvcc import find_cuda_path

    try:
        find_cuda_path()
    except RuntimeError:
        return ("TVM's NVRTC compiles against the CUDA toolkit's headers, not found: set CUDA_PATH to a CUDA "
                "toolkit (or put its nvcc on PATH)")
    return None


class TvmBackend:
    """TVM Relax: untuned (default schedules) when ``target.tuning.trials`` is 0, else survey-tuned.

    On a CPU (here or over RPC) it compiles with LLVM for the host's vector units; on a CUDA target with NVRTC for
    the GPU, the untuned schedules being TVM's generic GPU rules (dlight) and the VM replaying the kernels as one
    CUDA graph.

    Tuning uses one MetaSchedule database per target under ``cache_dir``, shared by
    all candidates and runs (see :mod:`.tuning`), and never returns a tuned build
    slower than the untuned one.
    """

    name = "tvm"

    def __init__(self, cache_dir: str | Path | None = None, incumbent_ms: float | None = None, **tuner_options: Any):
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.incumbent_ms = incumbent_ms
        self.tuner_options = tuner_options

    def unavailable_reason(self, target: Target) -> str | None:
        missing = missing_engine("tvm", "tvm")
        if missing or target.device != "cuda":
            return missing
        return cuda_unavailable_reason()

    def compile(self, model: Model, example_inputs: Sequence[Any], target: Target) -> Any:
        start = time.perf_counter()
        prepared = prepare(model, example_inputs, target, self.name)
        report, database = None, None
        if target.tuning.tunes:
            report, database = self._tune(prepared, example_inputs, target)
        executable = build(prepared, database)
        if target.device == "rpc":
            compiled: Any = RemoteTvmCompiled(executable, prepared, example_inputs, target, report)
        else:
            compiled = TvmCompiled(executable, prepared, example_inputs, target, report)
        compiled.compile_seconds = time.perf_counter() - start
        return compiled

    def _tune(self, prepared: Prepared, example_inputs: Sequence[Any], target: Target) -> tuple[Any, Any]:
        quick = Protocol(warmup=2, repeats=7, min_sample_ms=10.0, max_seconds=10.0)

        def evaluate(database: Any) -> float:
            executable = build(prepared, database)
            if target.device == "rpc":
                return RemoteTvmCompiled(executable, prepared, example_inputs, target).measure(quick).median_ms
            return TvmCompiled(executable, prepared, example_inputs, target).measure(quick).median_ms

        runner = (tuning.rpc_runner(target.rpc, target.device_key) if target.device == "rpc"
                  else tuning.local_runner(target.device_key))
        tuner = tuning.SurveyTuner(tuning.TuningDatabase.for_target(
            prepared.target, self.cache_dir, target.tuning.database, target.machine_key()), **self.tuner_options)
        return tuner.tune(prepared, evaluate, trials=target.tuning.trials, seconds=target.tuning.seconds,
                          runner=runner, threads=target.threads, incumbent_ms=self.incumbent_ms)
