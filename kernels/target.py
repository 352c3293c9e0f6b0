"""Where a candidate runs: the device, the backend, threads, tuning budget, remote link.

A :class:`Target` is the kernels-side view of the spec's ``target:`` section
(``device: cpu|cuda|rpc, backend, threads, tuning: {trials, seconds},
rpc: {host, port, key, tracker}``). It is a frozen dataclass so that it can be
hashed into cache keys and passed between processes.

:meth:`Target.from_spec` is the one conversion from the spec: it validates a
mapping with the spec's own schema (:class:`~qaopt.app_spec.schema.TargetSpec`),
so kernels works with or without a loaded spec and both read the same defaults,
and it checks that ``backend`` names a registered backend.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from qaopt.app_spec.schema import RPCSpec, TargetSpec

from .errors import KernelsError
from .registry import BackendRef, resolve

Device = Literal["cpu", "cuda", "rpc"]

ISA_FEATURES = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",  # x86
    "asimd", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "sve2",  # Arm
)
"""The CPU features that change which kernels a backend runs (vector width, integer dot products, bf16/fp16)."""


@dataclass(frozen=True)
class CpuInfo:
    """This machine's CPU as kernels see it: its model name and the features of :data:`ISA_FEATURES` it has."""

    model: str
    isa: tuple[str, ...]
    flags: frozenset[str]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "isa": list(self.isa)}


@functools.cache
def host_cpu_info(path: str = "/proc/cpuinfo") -> CpuInfo:
    """The host CPU from ``/proc/cpuinfo`` (x86 ``model name``/``flags``; Arm ``CPU implementer``/``CPU part``/``Features``)."""
    text = Path(path).read_text() if Path(path).exists() else ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    # A hypervisor may report only "AMD EPYC": family, model and stepping tell the generations apart.
    generation = ", ".join(f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields)
    model = (fields.get("model name", "") + (f" ({generation})" if generation else "")).strip() or " ".join(
        f"{k} {fields[k]}" for k in ("CPU implementer", "CPU part", "CPU variant") if k in fields) or os.uname().machine
    flags = frozenset((fields.get("flags") or fields.get("Features") or "").split())
    return CpuInfo(model, tuple(f for f in ISA_FEATURES if f in flags), flags)


NATIVE_FLOAT16 = {"bf16": ("avx512_bf16", "amx_bf16", "bf16"), "fp16": ("avx512_fp16", "amx_fp16", "fphp")}
"""CPU flags (x86 ``flags``, Arm ``Features``) that give a 16-bit float dtype arithmetic of its own; without one
it is emulated through fp32, many times slower than fp32 itself."""


def emulated_dtypes(device: str, cpu: CpuInfo | None = None) -> dict[str, str]:
    """Dtype -> why it would only be emulated on ``device`` (a local CPU without the dtype's instructions).

    Empty for a GPU and for a remote device, whose CPU this machine cannot see.
    """
    if device != "cpu":
        return {}
    cpu = cpu or host_cpu_info()
    return {dtype: f"this CPU ({cpu.model}) has none of {', '.join(flags)}: {dtype} would run emulated"
            for dtype, flags in NATIVE_FLOAT16.items() if not cpu.flags & set(flags)}


def missing_device(device: str) -> str | None:
    """Why this machine cannot serve ``device`` (``None`` when it can), so a run fails before it spends anything.

    Only a CUDA target is checked: its kernels need a GPU this torch sees. A remote
    device answers only when a backend connects to it.
    """
    if device != "cuda":
        return None
    import torch

    if torch.cuda.is_available():
        return None
    why = "built without CUDA" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}, no GPU or driver"
    return f"torch sees no CUDA GPU here (torch {torch.__version__}, {why})"


@dataclass(frozen=True)
class TuningBudget:
    """How much auto-tuning one candidate may cost: trials and/or wall seconds (0 / None: no limit on that axis).

    ``database`` is a folder for the shared tuning database (default: under the cache dir).
    """

    trials: int = 0
    seconds: float | None = None
    database: str | None = None

    @property
    def tunes(self) -> bool:
        """Whether any tuning runs: a trial or a second budgeted (both 0/None: default schedules only)."""
        return self.trials > 0 or bool(self.seconds)


class RPCConfig(RPCSpec):
    """A remote device reached over TVM RPC: the spec's ``target.rpc`` section, with this machine as default host.

    ``tracker: false``: an RPC server listens at host:port. ``tracker: true``:
    host:port is a TVM RPC tracker, asked for a device registered under ``key``.
    """

    host: str = "127.0.0.1"


@dataclass(frozen=True)
class Target:
    """A compilation and measurement target.

    ``backend`` is a :class:`BackendRef` (a string such as ``"torch[channels_last]"``
    is parsed). ``mcpu`` / ``mtriple`` pick the LLVM CPU for TVM (``None``: the
    host's own CPU, so code is vectorized for it); ``cc`` is the cross compiler TVM
    uses to export a library for another architecture (e.g. ``aarch64-linux-gnu-g++``).
    """

    device: Device = "cpu"
    backend: BackendRef = BackendRef("auto")
    threads: int | None = None
    backends: tuple[BackendRef, ...] | None = None
    """With backend ``auto``: the backends it measures (``None``: the device's own list, :mod:`.auto`)."""
    tuning: TuningBudget = field(default_factory=TuningBudget)
    rpc: RPCConfig | None = None
    mcpu: str | None = None
    mtriple: str | None = None
    cc: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", BackendRef.parse(self.backend))
        if self.backends is not None:
            object.__setattr__(self, "backends", tuple(BackendRef.parse(b) for b in self.backends))
        if self.device not in ("cpu", "cuda", "rpc"):
            raise KernelsError(f"target.device: '{self.device}' is not one of cpu, cuda, rpc")
        if self.device == "rpc" and self.rpc is None:
            raise KernelsError("target.rpc: device 'rpc' needs rpc: {host, port} (or tracker and key)")
        if self.threads is not None and self.threads < 1:
            raise KernelsError(f"target.threads: {self.threads} must be at least 1")

    @classmethod
    def from_spec(cls, spec_target: TargetSpec | Any) -> Target:
        """Build from the spec's ``target`` section (the pydantic model, or a mapping validated as one).

        The backend must be registered: an unknown name fails here, listing the
        registered ones and how to register another.
        """
        if not isinstance(spec_target, TargetSpec):
            try:
                spec_target = TargetSpec.model_validate(dict(spec_target or {}))
            except ValidationError as exc:
                raise KernelsError("\n".join(
                    f"target{''.join(f'.{p}' for p in e['loc'])}: {e['msg']}" for e in exc.errors())) from None
        tuning, rpc = spec_target.tuning, spec_target.rpc
        return cls(
            device=spec_target.device,
            backend=resolve(spec_target.backend),
            threads=spec_target.threads,
            backends=tuple(resolve(b) for b in spec_target.backends) if spec_target.backends else None,
            tuning=TuningBudget(tuning.trials, tuning.seconds, str(tuning.database) if tuning.database else None),
            rpc=RPCConfig.model_validate(rpc.model_dump()) if rpc is not None else None,
            mcpu=spec_target.mcpu,
            mtriple=spec_target.mtriple,
            cc=spec_target.cc,
        )

    def with_backend(self, backend: BackendRef | str) -> Target:
        return replace(self, backend=BackendRef.parse(backend))

    @property
    def device_key(self) -> str:
        """Names the physical device, so that measurements on it can be serialized across processes."""
        if self.device == "rpc" and self.rpc is not None:
            return f"rpc-{self.rpc.host}-{self.rpc.port}-{self.rpc.key or ''}"
        if self.device == "cuda":
            return f"cuda-{os.environ.get('CUDA_VISIBLE_DEVICES', '0')}"
        return "cpu"

    def machine_key(self) -> dict[str, Any]:
        """What makes a measurement or a tuning record of this target valid only here.

        The CPU model and its ISA features and the thread count for a local CPU;
        the remote device's key and address for RPC; the GPU's name for CUDA. Cache
        keys hold it (with the backend's version), so a record from one machine is
        never reused on another.
        """
        if self.device == "rpc" and self.rpc is not None:
            return {"rpc": self.device_key, "mcpu": self.mcpu, "mtriple": self.mtriple, "threads": self.threads}
        if self.device == "cuda":
            import torch

            return {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
                    "device": self.device_key}
        return {**host_cpu_info().to_dict(), "threads": self.threads or len(os.sched_getaffinity(0))}

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the backend as spelled in a spec), for cache keys and JSON."""
        return {"device": self.device, "backend": str(self.backend), "threads": self.threads,
                "tuning": asdict(self.tuning), "rpc": self.rpc.model_dump() if self.rpc else None,
                "mcpu": self.mcpu, "mtriple": self.mtriple, "cc": self.cc,
                # only when given, so that the keys of every target without the list stay what they were
                **({"backends": [str(b) for b in self.backends]} if self.backends else {})}
