"""What a target can run: the dtypes its backends declare on its device, less those it would only emulate.

A run asks this once, before its first trial, so that a knob value the target cannot
run never reaches one: it would otherwise fail in the middle of a trial (no backend
to compile it for the device) or take minutes to measure emulated. The answer comes
from the backends' declarations (:func:`.registry.register_backend`'s ``dtypes`` and
``devices``), never from their names, so a variant or a plugin's backend counts as
it declares.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .auto import raced
from .registry import BackendRef, backends_running, get_backend
from .target import CpuInfo, Target, emulated_dtypes


@dataclass(frozen=True)
class Unrunnable:
    """A dtype the target cannot run, and why; ``emulated``: a backend declares it, but this device has no
    arithmetic for it (nothing to declare, only to drop)."""

    dtype: str
    reason: str
    emulated: bool


def target_backends(target: Target) -> tuple[BackendRef, ...]:
    """The backends a candidate for ``target`` may run on: the one ``target.backend`` names, else those ``auto``
    measures (``target.backends``, or the device's own list)."""
    return raced(target) if target.backend == "auto" else (target.backend,)


def unrunnable_dtypes(target: Target, dtypes: Iterable[str], cpu: CpuInfo | None = None,
                      unavailable: Callable[[BackendRef], str | None] | None = None) -> dict[str, Unrunnable]:
    """Each of ``dtypes`` that no usable backend of ``target`` declares on its device, or that it would only emulate
    (:func:`.target.emulated_dtypes`; ``cpu``: the local CPU, this machine's by default).

    A backend that cannot serve the target on this machine (its ``unavailable_reason``: an engine not installed,
    ONNX Runtime without its CUDA provider) runs nothing here, whatever it declares. ``unavailable`` says why a
    backend cannot (default: the backend's own answer on this machine).
    """
    backends = target_backends(target)
    unavailable = unavailable or (lambda ref: get_backend(ref).unavailable_reason(target))
    unusable = {b: why for b in backends if (why := unavailable(b))}
    usable = [b for b in backends if b not in unusable]
    emulated = emulated_dtypes(target.device, cpu)
    out = {}
    for dtype in dict.fromkeys(dtypes):
        runners = backends_running(dtype, target.device)
        if not any(b.name in runners for b in usable):
            named = ", ".join(str(b) if b not in unusable else f"{b}: {unusable[b]}" for b in backends)
            out[dtype] = Unrunnable(dtype, f"no backend here runs {dtype} on {target.device} (backends: {named})",
                                    emulated=False)
        elif dtype in emulated:
            out[dtype] = Unrunnable(dtype, emulated[dtype], emulated=True)
    return out
