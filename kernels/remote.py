"""Remote devices over TVM RPC: build on the host, upload the library, run and time it on the board.

Boards drop off the network and RPC servers restart, so every remote step runs
through :func:`with_retries`: a lost session is reopened and the step repeated
``rpc.retries`` times; then the measurement fails with a :class:`MeasurementError`
that says which device, what was tried, and the last reason.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .errors import MeasurementError
from .measure import EPOCH, Measurement, Protocol, device_lock, median_and_spread, median_interval, untrusted_reason
from .model import as_numpy
from .target import RPCConfig, Target
from .tvm_build import Prepared, export_library, flatten

T = TypeVar("T")


def connect(rpc: RPCConfig) -> Any:
    """Open an RPC session: directly to ``host:port``, or through the tracker for a device with ``key``."""
    from tvm import rpc as tvm_rpc

    if rpc.tracker:
        return tvm_rpc.connect_tracker(rpc.host, rpc.port).request(rpc.key, session_timeout=int(rpc.timeout_s))
    return tvm_rpc.connect(rpc.host, rpc.port, key=rpc.key or "", session_timeout=int(rpc.timeout_s))


class RemoteTvmCompiled:
    """A TVM executable on a remote device; the session is (re)opened lazily."""

    backend = "tvm"

    def __init__(self, executable: Any, prepared: Prepared, example_inputs: Sequence[Any], target: Target,
                 tuning: Any = None):
        assert target.rpc is not None
        self.executable = executable
        self.prepared = prepared
        self.target = target
        self.rpc = target.rpc
        self.tuning = tuning
        self.example_inputs = [as_numpy(x) for x in example_inputs]
        self.param_bytes = prepared.param_bytes
        self.compile_seconds = 0.0
        self._tmp = tempfile.TemporaryDirectory(prefix="qaopt-rpc-")
        self._lib_path = export_library(executable, Path(self._tmp.name) / "model.so", target)
        self._session: Any = None
        self.failures: list[str] = []  # every lost session, with its reason (retried ones too)

    # -- session handling

    def _vm(self) -> tuple[Any, Any]:
        from tvm import relax

        if self._session is None:
            session = connect(self.rpc)
            session.upload(str(self._lib_path))
            lib = session.load_module(self._lib_path.name)
            self._session = (session, relax.VirtualMachine(lib, session.cpu()))
        return self._session

    def _drop(self) -> None:
        self._session = None

    def with_retries(self, step: Callable[[], T], what: str) -> T:
        """Run ``step``; on a lost or failing session reopen it and retry, then fail cleanly."""
        reasons = []
        for attempt in range(self.rpc.retries + 1):
            try:
                return step()
            except Exception as exc:  # TVMError, ConnectionError, OSError: all mean the device is gone
                reasons.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}")
                self.failures.append(f"{what}: {reasons[-1]}")
                self._drop()
                if attempt < self.rpc.retries:
                    time.sleep(min(2.0 ** attempt, 8.0))  # 1, 2, 4, 8, 8 s: time for a board or server to restart
        raise MeasurementError(
            f"remote device {self.rpc}: {what} failed {len(reasons)} times "
            f"(1 try + {self.rpc.retries} retries); last reason: {reasons[-1]}")

    # -- Compiled protocol

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        import tvm

        def step() -> list[np.ndarray]:
            session, vm = self._vm()
            dev = session.cpu()
            args = [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in (inputs or self.example_inputs)]
            vm.set_input("main", *args)  # tuples cannot cross RPC: fetch the outputs one by one
            vm.invoke_stateful("main")
            return flatten(vm.get_outputs("main"))

        return self.with_retries(step, "running the model")

    def inference(self) -> Callable[[], Any]:
        """One run on the board with the example inputs (each crosses the RPC link, as a frame's would)."""
        return self.run

    def measure(self, protocol: Protocol = Protocol()) -> Measurement:
        import tvm

        def step() -> list[float]:
            session, vm = self._vm()
            dev = session.cpu()
            args = [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in self.example_inputs]
            once = vm.time_evaluator("main", dev, number=1, repeat=max(1, protocol.warmup))(*args)
            number = max(1, int(protocol.min_sample_ms / max(min(once.results) * 1e3, 1e-3) + 0.999))
            timed = vm.time_evaluator("main", dev, number=number, repeat=protocol.repeats)(*args)
            return [number] + [r * 1e3 for r in timed.results]

        with device_lock(self.target.device_key):
            number, *samples = self.with_retries(step, "timing the model")
        median, spread = median_and_spread(samples)
        ci = median_interval(samples)
        # The remote board's load is not observable from here: only the median's spread can make it untrusted.
        why = untrusted_reason(None, median, ci, protocol, 1)
        return Measurement(
            backend=self.backend, device=f"rpc {self.rpc}", median_ms=median, ci_ms=ci, trusted=not why, untrusted=why,
            epoch=EPOCH, spread_ms=spread, samples_ms=tuple(samples), number=int(number), threads=self.target.threads,
            peak_mem_bytes=None, energy_mj=None, energy_note="unavailable: no energy meter is read over TVM RPC",
            extra={"compile_s": round(self.compile_seconds, 3), "param_bytes": self.param_bytes,
                   "rpc_failures": list(self.failures)})

    def export(self, path: str | Path) -> Path:
        return export_library(self.executable, Path(path), self.target)
