"""Where a candidate runs: the device, the backend, threads, tuning budget, remote link.

A :class:`Target` is the kernels-side view of the spec's ``target:`` section
(``device: cpu|cuda|rpc, backend, threads, tuning: {trials, seconds},
rpc: {host, port, key, tracker}``). It is a frozen dataclass so that it can be
hashed into cache keys and passed between processes, and it is built from the
spec with :meth:`Target.from_spec`, which accepts the pydantic model or a
plain mapping, so kernels works with or without a loaded spec.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from .errors import KernelsError

Device = Literal["cpu", "cuda", "rpc"]


@dataclass(frozen=True)
class TuningBudget:
    """How much auto-tuning one candidate may cost: trials and/or wall seconds (0 / None: no limit on that axis).

    ``database`` is a folder for the shared tuning database (default: under the cache dir).
    """

    trials: int = 0
    seconds: float | None = None
    database: str | None = None


@dataclass(frozen=True)
class RPCConfig:
    """A remote device reached over TVM RPC (the spec's ``target.rpc``).

    ``tracker: false``: an RPC server listens at host:port. ``tracker: true``:
    host:port is a TVM RPC tracker, asked for a device registered under ``key``.
    """

    host: str = "127.0.0.1"
    port: int = 9090
    key: str | None = None
    tracker: bool = False
    retries: int = 2
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.tracker and not self.key:
            raise KernelsError("target.rpc.key: a device key is required with target.rpc.tracker; set rpc.key")

    def __str__(self) -> str:
        return f"tracker {self.host}:{self.port} key '{self.key}'" if self.tracker else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Target:
    """A compilation and measurement target.

    ``mcpu`` / ``mtriple`` pick the LLVM CPU for TVM (``None``: the host's own
    CPU, so code is vectorized for it); ``cc`` is the cross compiler TVM uses to
    export a library for another architecture (e.g. ``aarch64-linux-gnu-g++``).
    """

    device: Device = "cpu"
    backend: str = "auto"
    threads: int | None = None
    tuning: TuningBudget = field(default_factory=TuningBudget)
    rpc: RPCConfig | None = None
    mcpu: str | None = None
    mtriple: str | None = None
    cc: str | None = None

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda", "rpc"):
            raise KernelsError(f"target.device: '{self.device}' is not one of cpu, cuda, rpc")
        if self.device == "rpc" and self.rpc is None:
            raise KernelsError("target.rpc: device 'rpc' needs rpc: {host, port} (or tracker and key)")
        if self.threads is not None and self.threads < 1:
            raise KernelsError(f"target.threads: {self.threads} must be at least 1")

    @classmethod
    def from_spec(cls, spec_target: Any) -> Target:
        """Build from the spec's ``target`` section (a pydantic model or a mapping)."""
        data = spec_target.model_dump() if hasattr(spec_target, "model_dump") else dict(spec_target or {})
        tuning = data.pop("tuning", None) or {}
        rpc = data.pop("rpc", None)
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and v is not None}
        return cls(
            tuning=TuningBudget(**_known(TuningBudget, tuning)),
            rpc=RPCConfig(**_known(RPCConfig, rpc)) if rpc else None,
            **known,
        )

    def with_backend(self, backend: str) -> Target:
        return replace(self, backend=backend)

    @property
    def device_key(self) -> str:
        """Names the physical device, so that measurements on it can be serialized across processes."""
        if self.device == "rpc" and self.rpc is not None:
            return f"rpc-{self.rpc.host}-{self.rpc.port}-{self.rpc.key or ''}"
        if self.device == "cuda":
            return f"cuda-{os.environ.get('CUDA_VISIBLE_DEVICES', '0')}"
        return "cpu"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in dict(data).items() if k in cls.__dataclass_fields__ and v is not None}
