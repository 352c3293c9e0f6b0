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
from .tvm_build import Prepared, build, configure_threads, export_library, flatten, prepare


class TvmCompiled(LocalCompiled):
    """A Relax VM executable running on this machine's CPU."""

    backend = "tvm"

    def __init__(self, executable: Any, prepared: Prepared, example_inputs: Sequence[Any], target: Target,
                 tuning: Any = None):
        super().__init__(target, example_inputs, prepared.param_bytes)
        import tvm
        from tvm import relax

        self.executable = executable
        self.prepared = prepared
        self.tuning = tuning  # the TuningReport when it was tuned
        self.device = tvm.cpu()
        self.vm = relax.VirtualMachine(executable, self.device)
        self._args = self._tensors(self.example_inputs)

    def _tensors(self, inputs: Sequence[np.ndarray]) -> list[Any]:
        import tvm

        return [tvm.runtime.tensor(np.ascontiguousarray(x), self.device) for x in inputs]

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        configure_threads(self.target.threads)
        out = self.vm["main"](*(self._tensors(inputs) if inputs else self._args))
        return flatten(out)

    def inference(self) -> Callable[[], Any]:
        configure_threads(self.target.threads)
        main, args = self.vm["main"], self._args
        return lambda: main(*args)

    def export(self, path: str | Path) -> Path:
        """The compiled library (.so, loadable with ``tvm.runtime.load_module``; .tar of objects for a cross target)."""
        return export_library(self.executable, Path(path), self.target)


class TvmBackend:
    """TVM Relax: untuned (default schedules) when ``target.tuning.trials`` is 0, else survey-tuned.

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
        if missing:
            return missing
        if target.device == "cuda":
            return ("qaopt builds TVM for CPUs (here or over RPC); on a GPU use 'torch-compile' (CUDA graphs) or "
                    "'torch-compile[max-autotune]'")
        return None

    def compile(self, model: Model, example_inputs: Sequence[Any], target: Target) -> Any:
        start = time.perf_counter()
        prepared = prepare(model, example_inputs, target, self.name)
        report, database = None, None
        if target.tuning.trials > 0 or target.tuning.seconds:
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
