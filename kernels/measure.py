"""The measurement protocol: one way to time every backend, so that their figures compare.

Protocol (the same for every backend and device):

1. Take the device's lock (:func:`device_lock`), a file lock shared by every
   process on the machine, so parallel search workers (or a tuner's runner)
   never time two things on one device at once (RESONATOR's rule).
2. Warm up (``warmup`` calls: caches, allocators, lazy compilation).
3. Take ``repeats`` samples; each is the mean of ``number`` back-to-back calls,
   with ``number`` chosen so a sample lasts at least ``min_sample_ms`` (timer
   resolution and launch jitter become negligible).
4. Report the median and the inter-quartile range of the samples, the peak
   memory of the model while it runs, and the energy per inference where the
   machine exposes a meter (RAPL on CPU, NVML on GPU), else the reason it is
   unavailable.
"""

from __future__ import annotations

import abc
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from filelock import FileLock

from .errors import MeasurementError


@dataclass(frozen=True)
class Measurement:
    """Figures of one compiled model on one device.

    ``spread_ms`` is the inter-quartile range of the samples; ``peak_mem_bytes``
    is parameter bytes plus the peak extra memory seen while running (exact on
    CUDA; on CPU the growth of the resident set, which allocators that kept
    memory from earlier runs can understate); ``energy_mj`` is millijoules per
    inference, ``None`` when ``energy_note`` says why it is unavailable.
    """

    backend: str
    device: str
    median_ms: float
    spread_ms: float
    samples_ms: tuple[float, ...]
    number: int
    threads: int | None
    peak_mem_bytes: int | None
    energy_mj: float | None
    energy_note: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rel_spread(self) -> float:
        return self.spread_ms / self.median_ms if self.median_ms else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Protocol:
    """Knobs of the measurement protocol (defaults suit models of 0.1-100 ms)."""

    warmup: int = 5
    repeats: int = 15
    min_sample_ms: float = 20.0
    max_seconds: float = 30.0


def lock_dir() -> Path:
    """Machine-wide folder of device locks (``QAOPT_LOCK_DIR`` overrides), shared by all qaopt processes."""
    path = Path(os.environ.get("QAOPT_LOCK_DIR") or Path(tempfile.gettempdir()) / "qaopt-locks")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def device_lock(device_key: str, timeout: float = -1) -> Iterator[None]:
    """Hold the device's measurement lock: one measurement at a time per device, across processes."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in device_key)
    with FileLock(str(lock_dir() / f"{safe}.lock"), timeout=timeout):
        yield


# --------------------------------------------------------------------------- energy


class EnergyMeter(abc.ABC):
    """A cumulative energy counter in joules; ``None`` from :func:`energy_meter` when there is none."""

    source: str = ""

    @abc.abstractmethod
    def joules(self) -> float: ...


class RaplMeter(EnergyMeter):
    """Intel/AMD RAPL package counters under /sys/class/powercap (whole package, not only this process)."""

    def __init__(self, zones: list[Path]):
        self.zones = zones
        self.source = "RAPL " + ",".join(z.name for z in zones) + " (whole package)"
        self._ranges = [int((z / "max_energy_range_uj").read_text()) for z in zones]
        self._last = [0] * len(zones)
        self._wraps = [0] * len(zones)

    def joules(self) -> float:
        total = 0
        for i, zone in enumerate(self.zones):
            uj = int((zone / "energy_uj").read_text())
            if uj < self._last[i]:  # the counter wrapped around
                self._wraps[i] += 1
            self._last[i] = uj
            total += uj + self._wraps[i] * self._ranges[i]
        return total / 1e6


class NvmlMeter(EnergyMeter):
    """NVML's total-energy counter of one GPU (Volta and newer)."""

    def __init__(self, index: int):
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)  # raises where unsupported
        self.source = f"NVML GPU {index}"

    def joules(self) -> float:
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1e3


def energy_meter(device: str) -> tuple[EnergyMeter | None, str]:
    """The meter for ``device`` ('cpu' or 'cuda'), or ``None`` and the reason there is none."""
    if device == "cuda":
        try:
            return NvmlMeter(0), ""
        except Exception as exc:  # no pynvml, no driver support: report, do not fail
            return None, f"unavailable: NVML energy counter not readable ({type(exc).__name__}: {exc})"
    if device == "cpu":
        root = Path("/sys/class/powercap")
        zones = sorted(p for p in root.glob("*-rapl:*") if p.name.count(":") == 1) if root.exists() else []
        readable = [z for z in zones if os.access(z / "energy_uj", os.R_OK)]
        if readable:
            return RaplMeter(readable), ""
        why = "no /sys/class/powercap" if not root.exists() else "no readable RAPL zone under /sys/class/powercap"
        return None, f"unavailable: {why}"
    return None, f"unavailable: no energy meter for device '{device}'"


# --------------------------------------------------------------------------- memory


class ResidentPeak:
    """Peak growth of this process's resident set between start() and stop() (Linux: VmHWM reset via clear_refs)."""

    def start(self) -> None:
        self.supported = _reset_hwm()
        self.base = _status_kb("VmRSS")

    def stop(self) -> int | None:
        return max(0, _status_kb("VmHWM") - self.base) * 1024 if self.supported else None


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


# --------------------------------------------------------------------------- timing


def measure_callable(
    call: Callable[[], Any],
    *,
    backend: str,
    device: str,
    device_key: str,
    threads: int | None,
    param_bytes: int,
    protocol: Protocol = Protocol(),
    sync: Callable[[], None] | None = None,
    cuda_peak: Callable[[], tuple[Callable[[], None], Callable[[], int]]] | None = None,
    extra: dict[str, Any] | None = None,
) -> Measurement:
    """Time ``call`` (one inference on prepared inputs) under the protocol above.

    ``sync`` waits for asynchronous work (CUDA); ``cuda_peak`` returns (reset,
    read) of the device allocator's peak, used instead of the resident set.
    Any exception from ``call`` becomes a :class:`MeasurementError` naming the backend.
    """
    sync = sync or (lambda: None)
    meter, note = energy_meter(device)
    resident = ResidentPeak()
    try:
        with device_lock(device_key):
            reset, read = cuda_peak() if cuda_peak is not None else (resident.start, resident.stop)
            reset()
            for _ in range(protocol.warmup):
                call()
            sync()
            peak = read()
            number = _calls_per_sample(call, sync, protocol.min_sample_ms)
            deadline = time.perf_counter() + protocol.max_seconds
            samples: list[float] = []
            e0 = meter.joules() if meter else 0.0
            for _ in range(protocol.repeats):
                start = time.perf_counter_ns()
                for _ in range(number):
                    call()
                sync()
                samples.append((time.perf_counter_ns() - start) / 1e6 / number)
                if time.perf_counter() > deadline and len(samples) >= 3:
                    break
            energy = (meter.joules() - e0) * 1e3 / (number * len(samples)) if meter else None
    except MeasurementError:
        raise
    except Exception as exc:
        raise MeasurementError(f"backend '{backend}': running the model on {device} failed: {type(exc).__name__}: {exc}") from exc
    median, spread = median_and_spread(samples)
    return Measurement(
        backend=backend,
        device=device,
        median_ms=median,
        spread_ms=spread,
        samples_ms=tuple(samples),
        number=number,
        threads=threads,
        peak_mem_bytes=None if peak is None else param_bytes + peak,
        energy_mj=energy,
        energy_note=meter.source if meter else note,
        extra=dict(extra or {}),
    )


def median_and_spread(samples: list[float] | tuple[float, ...]) -> tuple[float, float]:
    """The median of the samples and their inter-quartile range (0 for a single sample)."""
    if len(samples) < 2:
        return float(samples[0]), 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return statistics.median(samples), q3 - q1


def measure_interleaved(
    calls: Mapping[str, Callable[[], Any]],
    *,
    rounds: int = 5,
    protocol: Protocol = Protocol(warmup=2, repeats=10),
    device: str = "cpu",
    device_key: str = "cpu",
    threads: int | None = None,
) -> dict[str, Measurement]:
    """Time several callables in interleaved rounds, each round one :func:`measure_callable` per callable.

    On a machine shared with other jobs the load changes from minute to minute;
    interleaving makes every callable see the same mix, so their ratios hold even
    when absolute times drift. Each result pools the samples of all its rounds.
    """
    rounds_of: dict[str, list[Measurement]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            rounds_of[name].append(measure_callable(call, backend=str(name), device=device, device_key=device_key,
                                                    threads=threads, param_bytes=0, protocol=protocol))
    out = {}
    for name, ms in rounds_of.items():
        samples = tuple(s for m in ms for s in m.samples_ms)
        median, spread = median_and_spread(samples)
        out[name] = replace(ms[-1], median_ms=median, spread_ms=spread, samples_ms=samples,
                            peak_mem_bytes=max((m.peak_mem_bytes or 0 for m in ms), default=None))
    return out


def _calls_per_sample(call: Callable[[], Any], sync: Callable[[], None], min_sample_ms: float) -> int:
    start = time.perf_counter()
    call()
    sync()
    once_ms = max((time.perf_counter() - start) * 1e3, 1e-3)
    return max(1, int(min_sample_ms / once_ms + 0.999))
