"""The backend protocol: ``compile(model, example_inputs, target) -> Compiled``.

A backend takes a model (see :mod:`.model`) and returns a :class:`Compiled`,
which runs on numpy inputs, is timed by the shared measurement protocol
(:mod:`.measure`), and exports its artifact for deployment. Backends that run
in this process derive from :class:`LocalCompiled`, which does the timing.
Backends are found by name through :mod:`.registry`.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol as TypingProtocol, runtime_checkable

import numpy as np

from .measure import Measurement, Protocol, SampleTimer, measure_callable
from .model import Model, as_numpy
from .target import Target


@runtime_checkable
class Compiled(TypingProtocol):
    """A model compiled for one target by one backend; ``backend`` is the backend's reference as text."""

    backend: str
    target: Target

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]: ...

    def inference(self) -> Callable[[], Any]:
        """A zero-argument call that runs one inference on the example inputs, already on the device: what
        ``measure`` times, and what a frame of several compiled models chains (:func:`qaopt.kernels.compare_frames`),
        so that a frame and its models' own figures time the same work."""
        ...

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
    def inference(self) -> Callable[[], Any]:
        """A zero-argument call that runs one inference on the example inputs, already on the device (on a GPU it
        ends with a synchronize: a robot waits for each result)."""

    def _threads(self) -> Any:
        """A context that applies the target's thread count while running (default: nothing to do)."""
        return contextlib.nullcontext()

    def _sync(self) -> Callable[[], None] | None:
        return None

    def _cuda_peak(self) -> Any:
        return None

    def _timer(self) -> SampleTimer | None:
        """A timer on the device for each sample (default: the host's clock)."""
        return None

    def measure(self, protocol: Protocol = Protocol()) -> Measurement:
        with self._threads():
            return measure_callable(
                self.inference(),
                backend=self.backend,
                device=self.target.device,
                device_key=self.target.device_key,
                threads=self.target.threads,
                param_bytes=self.param_bytes,
                protocol=protocol,
                sync=self._sync(),
                cuda_peak=self._cuda_peak(),
                timer=self._timer(),
                extra={"compile_s": round(self.compile_seconds, 3)},
            )
