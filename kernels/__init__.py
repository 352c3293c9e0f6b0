"""qaopt.kernels: compile each candidate NN for the target, tune it cheaply, and measure its real latency.

Typical use::

    from qaopt import kernels

    target = kernels.Target.from_spec(spec.target)          # or kernels.Target(device="cpu", threads=2)
    compiled = kernels.compile(model, [example_input], target, cache_dir=cache)
    m = compiled.measure()                                  # Measurement: median_ms, spread_ms, peak_mem_bytes, …
    compiled.export("artifacts/heading")

``target.backend`` picks 'torch', 'torch-compile', 'tvm', 'onnxruntime' or
'auto' (every usable backend measured, the fastest kept: see :mod:`.auto`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .auto import AutoBackend, AutoCompiled, Outcome
from .backend import Backend, Compiled, backend_names, get_backend, register_backend
from .errors import (
    BackendUnavailableError,
    BuildError,
    KernelsError,
    MeasurementError,
    UnsupportedModelError,
    UnsupportedOperatorError,
)
from .measure import Measurement, Protocol, device_lock
from .target import RPCConfig, Target, TuningBudget


def compile(model: Any, example_inputs: Sequence[Any], target: Target, *, cache_dir: str | Path | None = None,
            incumbent_ms: float | None = None, runnable_on: Sequence[str] | None = None) -> Any:
    """Compile ``model`` with the target's backend (tuning within ``target.tuning`` where the backend tunes).

    ``incumbent_ms``: the best latency the caller already has for comparable
    candidates; tuning that cannot beat it is skipped. ``runnable_on``: the backends
    (spec names) that have kernels for this model's dtype; ``auto`` measures only those,
    so that it never spends compile or tuning time on a backend that would emulate the
    dtype in float (TVM importing an int8 QDQ graph, say).
    """
    options: dict[str, Any] = {"cache_dir": cache_dir, "incumbent_ms": incumbent_ms}
    if target.backend == "auto" and runnable_on is not None:
        options["runnable_on"] = tuple(runnable_on)
    backend = get_backend(target.backend, **options)
    reason = backend.unavailable_reason(target)
    if reason:
        raise BackendUnavailableError(f"target.backend: '{target.backend}' cannot serve device '{target.device}': {reason}")
    return backend.compile(model, example_inputs, target)


__all__ = [
    "AutoBackend", "AutoCompiled", "Backend", "BackendUnavailableError", "BuildError", "Compiled", "KernelsError",
    "Measurement", "MeasurementError", "Outcome", "Protocol", "RPCConfig", "Target", "TuningBudget",
    "UnsupportedModelError", "UnsupportedOperatorError", "backend_names", "compile", "device_lock", "get_backend",
    "register_backend",
]
