"""``compile``: the backend a target names, checked against the target, applied to one model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import BackendUnavailableError
from .registry import get_backend
from .target import Target


def compile(model: Any, example_inputs: Sequence[Any], target: Target, *, cache_dir: str | Path | None = None,
            incumbent_ms: float | None = None, runnable_on: Sequence[str] | None = None) -> Any:
    """Compile ``model`` with the target's backend (tuning within ``target.tuning`` where the backend tunes).

    ``incumbent_ms``: the best latency the caller already has for comparable
    candidates; tuning that cannot beat it is skipped. ``runnable_on``: the backends
    (spec names) that have kernels for this model's dtype; ``auto`` measures only those,
    so that it never spends compile or tuning time on a backend that cannot run the
    dtype or would emulate it in float.
    """
    options: dict[str, Any] = {"cache_dir": cache_dir, "incumbent_ms": incumbent_ms}
    if target.backend == "auto" and runnable_on is not None:
        options["runnable_on"] = tuple(runnable_on)
    backend = get_backend(target.backend, **options)
    reason = backend.unavailable_reason(target)
    if reason:
        raise BackendUnavailableError(f"target.backend: '{target.backend}' cannot serve device '{target.device}': {reason}")
    return backend.compile(model, example_inputs, target)
