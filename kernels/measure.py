"""The measurement protocol: one way to time every backend, so that their figures compare and can be trusted.

Protocol (the same for every backend and device):

1. Take the device's lock (:func:`device_lock`), a file lock shared by every
   process on the machine, so parallel search workers (or a tuner's runner)
   never time two things on one device at once (RESONATOR's rule).
2. Pin every thread of this process to the target's cores (:func:`pinned`), so
   the intra-op pools run where the interference probe looks.
3. Warm up until stable: ``warmup`` calls, then rounds of them until two in a
   row agree within ``STABLE_WARMUP`` (caches, allocators, lazy compilation,
   the CPU's clock ramping up).
4. Take ``repeats`` samples; each is the mean of ``number`` back-to-back calls,
   with ``number`` chosen so a sample lasts at least ``min_sample_ms`` (timer
   resolution and launch jitter become negligible), while an
   :class:`InterferenceProbe` watches what else ran on those cores.
5. On CPU, a fixed reference kernel (:class:`SpeedReference`) is timed on the
   same cores before and after the samples. When other processes (or the
   hypervisor) took more than ``max_interference`` of the cores, or the machine
   ran the reference more than ``max_slowdown`` slower than its best since boot
   (a virtual machine slows down as a whole, for minutes, and ``/proc/stat``
   does not show it), measure again (``retries`` times, ``retry_wait_s`` apart);
   keep a clean attempt, else the least disturbed, and mark it untrusted when
   even that one was disturbed or slowed, or its median is uncertain by more
   than ``max_rel_ci``.
6. Report the median with its distribution-free confidence interval (order
   statistics), the inter-quartile range, the trust flag and why, the epoch
   (the process that measured), the peak memory of the model while it runs, and
   the energy per inference where the machine exposes a meter (RAPL on CPU,
   NVML on GPU), else the reason it is unavailable.

Why the interference check: with an intra-op pool as wide as the cores, every
operator's parallel region waits for its slowest thread, so one other runnable
process on those cores multiplies a latency instead of adding to it (measured
in docs/latency.md: ONNX Runtime int8 1.5-1.8x, torch bf16 2x to 200x). Such a
figure must never pass silently as the model's latency.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
import math
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol as TypingProtocol

import numpy as np
from filelock import FileLock

from .errors import MeasurementError


@dataclass(frozen=True)
class Measurement:
    """Figures of one compiled model on one device.

    ``spread_ms`` is the inter-quartile range of the samples; ``ci_ms`` the
    ``CONFIDENCE`` interval of their median (order statistics, no assumption on
    the distribution); ``trusted`` is False when the machine disturbed the
    measurement, ``untrusted`` says how; ``interference`` is the share of the
    measured cores other processes and the hypervisor took while it ran (``None``
    where it cannot be observed); ``epoch`` names the process that measured
    (figures of one epoch compare; see :data:`EPOCH`); ``peak_mem_bytes``
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
    ci_ms: tuple[float, float] | None = None
    trusted: bool = True
    untrusted: str = ""
    interference: float | None = None
    epoch: str = ""

    @property
    def rel_spread(self) -> float:
        return self.spread_ms / self.median_ms if self.median_ms else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Protocol:
    """Knobs of the measurement protocol (defaults suit models of 0.1-100 ms).

    ``repeats`` of 15 give a 96 % order-statistic interval of the median between
    the 4th and 12th sample; ``max_interference`` is the share of the cores other
    processes may take before a measurement is retried (``retries`` times, after
    ``retry_wait_s``) and, still disturbed, marked untrusted; ``max_rel_ci`` the
    relative half-width of the median's interval beyond which it is untrusted;
    ``max_slowdown`` how much slower than its best the machine may run the
    reference kernel (CPU) before a measurement is retried the same way and,
    still slowed, marked untrusted. ``ceiling_ms``: a model whose first warm-up
    round ends slower than this per call is not measured further
    (:class:`Abandoned`); ``auto`` sets it from the fastest backend so far, so a
    backend hundreds of times slower costs one round, not a full protocol.
    """

    warmup: int = 5
    repeats: int = 15
    min_sample_ms: float = 20.0
    max_seconds: float = 30.0
    max_interference: float = 0.10
    retries: int = 2
    retry_wait_s: float = 0.5
    max_rel_ci: float = 0.10
    max_slowdown: float = 0.25
    ceiling_ms: float | None = None


CONFIDENCE = 0.95
"""Confidence of every latency interval qaopt reports."""
STABLE_WARMUP = 0.05
"""Warm-up goes on until two rounds in a row agree within this share (at most ``MAX_WARMUP_ROUNDS`` rounds)."""
MAX_WARMUP_ROUNDS = 10
EPOCH = f"{socket.gethostname()}:{os.getpid()}:{int(time.time())}"
"""This process's measurement epoch: decisions compare only figures measured in one epoch, since the machine's
load (and so every latency) drifts between processes and hours."""


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


# --------------------------------------------------------------------------- isolation and interference


PROCESS_CORES: tuple[int, ...] = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
"""The cores this process may use, read when kernels is imported. Read later from the calling thread, they may be
fewer: a runtime can bind that thread to one core natively and leave it there (TVM's pool did, see
:func:`.tvm_build.configure_threads`), and a measurement on those cores would run its threads on one."""


def measurement_cores(threads: int | None) -> tuple[int, ...]:
    """The cores a measurement with ``threads`` threads runs on: the first ``threads`` this process may use."""
    allowed = list(PROCESS_CORES) or sorted(os.sched_getaffinity(0))
    return tuple(allowed[:threads] if threads else allowed)


@contextlib.contextmanager
def pinned(cores: Sequence[int]) -> Iterator[None]:
    """Pin every thread of this process (the pools of every backend included) to ``cores``, restoring each after.

    ``os.sched_setaffinity(0, ...)`` moves only the calling thread; the runtime pools
    (ONNX Runtime's, torch's OpenMP, TVM's, OpenVINO's) are other threads, so each
    task of the process is moved. Threads started while pinned inherit the cores.
    """
    before: dict[int, set[int]] = {}
    for tid in _threads():
        try:
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cores)
        except OSError:  # the thread ended meanwhile, or the kernel refuses: measure unpinned rather than fail
            before.pop(tid, None)
    try:
        yield
    finally:
        for tid, mask in before.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, mask)


def _threads() -> list[int]:
    tasks = Path("/proc/self/task")
    return [int(t.name) for t in tasks.iterdir()] if tasks.exists() else [0]


@dataclass(frozen=True)
class Interference:
    """What else ran on the measured cores while a measurement took its samples (shares of their capacity)."""

    others: float
    """CPU time of other processes on these cores."""
    steal: float
    """Time the hypervisor gave these cores to other machines."""

    @property
    def total(self) -> float:
        return self.others + self.steal

    def describe(self) -> str:
        return f"other processes took {self.others:.0%} and the hypervisor {self.steal:.0%} of the measured cores"


class InterferenceProbe(TypingProtocol):
    """Watches the measured cores between ``start`` and ``stop``; ``stop`` returns ``None`` where it cannot see."""

    def start(self) -> None: ...

    def stop(self) -> Interference | None: ...


CpuTimes = dict[int, tuple[float, float]]
"""Per core: (busy seconds, stolen seconds) since boot."""


def read_proc_stat(path: Path = Path("/proc/stat")) -> CpuTimes:
    """Busy and stolen seconds of every core from ``/proc/stat`` (Linux; empty elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: CpuTimes = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *values = line.split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in values[:8])
        out[int(name[3:])] = ((user + nice + system + irq + softirq) / tick, steal / tick)
    return out


class CpuLoadProbe:
    """Other processes' CPU time on the measured cores: their busy time in ``/proc/stat`` less this process's own.

    This process's threads are pinned to the cores while measuring, so its own CPU
    time (``time.process_time``) is all spent there; whatever else the cores were
    busy with is interference. ``read`` and ``own`` are injectable, so tests can
    simulate a loaded machine without timing anything.
    """

    def __init__(self, cores: Sequence[int], read: Callable[[], CpuTimes] = read_proc_stat,
                 own: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.perf_counter):
        self.cores = tuple(cores)
        self._read, self._own, self._clock = read, own, clock

    def start(self) -> None:
        self._start = (self._read(), self._own(), self._clock())

    def stop(self) -> Interference | None:
        times, own, now = self._read(), self._own(), self._clock()
        before, own0, start = self._start
        cores = [c for c in self.cores if c in times and c in before]
        capacity = (now - start) * len(cores)
        if not cores or capacity <= 0:
            return None
        busy = sum(times[c][0] - before[c][0] for c in cores)
        steal = sum(times[c][1] - before[c][1] for c in cores)
        return Interference(others=max(0.0, busy - (own - own0)) / capacity, steal=max(0.0, steal) / capacity)


class SpeedReference:
    """How much slower than its best this machine runs a fixed kernel now: a check the load probe cannot make.

    A virtual machine can run slower as a whole for minutes (its host is busy, its
    clock is lowered) with no steal time and no other process in ``/proc/stat``;
    on the project's 2-core VM a 256x256 float32 matrix product took 0.14 ms in one
    process and 0.28 ms in another within a minute, and NNs of about a millisecond
    measured then spread by up to 44 %. The reference kernel's work never changes, so its time is the
    machine's speed of the moment. The best (lowest) time is kept per CPU model,
    core count and boot in the lock folder, shared by every qaopt process, so the
    first measurements of a boot set it and later ones are compared with it.

    The kernel is timed on each measured core in turn and the slowest counts: a
    parallel NN runs at the pace of its slowest thread, and on a VM one virtual core
    can be slowed alone (its host thread's sibling busy with another machine) while
    the others run at full speed. ``kernel`` (the reference's median ms) and
    ``folder`` are injectable for tests.
    """

    def __init__(self, cores: Sequence[int], kernel: Callable[[], float] | None = None, folder: Path | None = None):
        self.cores = tuple(cores)
        self.kernel = kernel or matmul_reference_ms
        self.path = (folder or lock_dir()) / f"speed-reference-{_machine_key(len(self.cores))}.json"

    def slowdown(self) -> float:
        """The slowest core's reference time now over the best kept (updated when faster), less 1."""
        times = [self._on(core) for core in self.cores]
        with FileLock(str(self.path) + ".lock"):
            try:
                best = float(json.loads(self.path.read_text())["best_ms"])
            except (OSError, ValueError, KeyError, TypeError):
                best = math.inf
            if min(times) < best:
                best = min(times)
                with contextlib.suppress(OSError):  # a read-only lock folder costs the memory, not the measurement
                    self.path.write_text(json.dumps({"best_ms": best}))
        return max(times) / best - 1.0

    def _on(self, core: int) -> float:
        """The kernel's time with the calling thread on ``core`` alone (its cores restored after)."""
        try:
            before = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {core})
        except (OSError, AttributeError):  # no affinity here (not Linux) or refused: time it where it runs
            return self.kernel()
        try:
            return self.kernel()
        finally:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, before)


REFERENCE_SIZE = 256
"""Side of the reference kernel's float32 matrices (a product of well under a millisecond on one core)."""


def matmul_reference_ms(repeats: int = 30) -> float:
    """Median ms of a fixed float32 matrix product on one BLAS thread (a pool as wide as the machine, pinned
    to a measurement's few cores, would time its own contention)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a, b = (rng.random((REFERENCE_SIZE, REFERENCE_SIZE), dtype=np.float32) for _ in range(2))
    times = []
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(3):
            np.matmul(a, b)
        for _ in range(repeats):
            start = time.perf_counter_ns()
            np.matmul(a, b)
            times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times)


def _machine_key(cores: int) -> str:
    """CPU model, core count and boot: a reference best is only compared within one of each."""
    from .target import host_cpu_info

    boot = ""
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return hashlib.sha256(f"{host_cpu_info().model}|{cores}|{boot}".encode()).hexdigest()[:16]


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


class SampleTimer(TypingProtocol):
    """Times one sample on the device itself (CUDA events), where the host's clock would also count its queue.

    ``start`` marks the sample's beginning in the device's stream; ``stop`` (after the
    sample's calls and ``sync``) returns the milliseconds the device saw between the marks.
    """

    def start(self) -> None: ...

    def stop(self) -> float: ...



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
    probe: InterferenceProbe | None = None,
    cores: Sequence[int] | None = None,
    reference: SpeedReference | None = None,
    timer: SampleTimer | None = None,
) -> Measurement:
    """Time ``call`` (one inference on prepared inputs) under the protocol above.

    ``sync`` waits for asynchronous work (CUDA); ``cuda_peak`` returns (reset,
    read) of the device allocator's peak, used instead of the resident set;
    ``probe`` watches for interference (default on CPU: :class:`CpuLoadProbe` of
    the measured cores); ``cores`` are the cores to pin to (default on CPU:
    :func:`measurement_cores` of ``threads``; several models side by side need
    the cores of all of them; on a GPU: one core, for the thread that launches its
    kernels); ``reference`` times the machine's speed before and
    after the samples (default: a :class:`SpeedReference` for these
    cores); ``timer`` times each sample on the device (default: the host's clock). Any exception from ``call`` becomes a :class:`MeasurementError`
    naming the backend.
    """
    sync = sync or (lambda: None)
    meter, note = energy_meter(device)
    resident = ResidentPeak()
    if cores is None:
        cores = measurement_cores(threads if device == "cpu" else 1) if device in ("cpu", "cuda") else ()
    if probe is None and cores:
        probe = CpuLoadProbe(cores)
    if reference is None and cores:
        reference = SpeedReference(cores)
    try:
        with device_lock(device_key), pinned(cores) if cores else contextlib.nullcontext():
            reset, read = cuda_peak() if cuda_peak is not None else (resident.start, resident.stop)
            reset()
            _warm_up(call, sync, protocol)
            peak = read()
            number = _calls_per_sample(call, sync, protocol.min_sample_ms)
            attempts: list[_Attempt] = []
            for attempt in range(1 + max(0, protocol.retries)):
                if attempt:
                    time.sleep(protocol.retry_wait_s)
                before = reference.slowdown() if reference is not None else None
                sampled = _sample(call, sync, number, protocol, meter, probe, timer)
                after = reference.slowdown() if reference is not None else None
                attempts.append(replace(sampled, slowdown=None if before is None else max(before, after)))
                if not _spoiled(attempts[-1], protocol):
                    break
    except MeasurementError:
        raise
    except Exception as exc:
        raise MeasurementError(f"backend '{backend}': running the model on {device} failed: {type(exc).__name__}: {exc}") from exc
    # A clean attempt if there is one; among the spoiled ones, the least disturbed, then the least slowed.
    best = min(attempts, key=lambda a: (_spoiled(a, protocol), a.interference.total if a.interference is not None
                                        else 0.0, a.slowdown or 0.0))
    median, spread = median_and_spread(best.samples)
    ci = median_interval(best.samples)
    slowdown = best.slowdown
    why = untrusted_reason(best.interference, median, ci, protocol, len(attempts), slowdown=slowdown)
    return Measurement(
        backend=backend,
        device=device,
        median_ms=median,
        spread_ms=spread,
        samples_ms=tuple(best.samples),
        number=number,
        threads=threads,
        peak_mem_bytes=None if peak is None else param_bytes + peak,
        energy_mj=best.energy_mj,
        energy_note=meter.source if meter else note,
        extra={**(extra or {}), "attempts": len(attempts),
               **({"slowdown": round(slowdown, 4)} if slowdown is not None else {})},
        ci_ms=ci,
        trusted=not why,
        untrusted=why,
        interference=None if best.interference is None else round(best.interference.total, 4),
        epoch=EPOCH,
    )


class Abandoned(MeasurementError):
    """A model slower per call than the protocol's ceiling, left after its first warm-up round."""

    def __init__(self, per_call_ms: float, ceiling_ms: float):
        super().__init__(f"not measured further: {per_call_ms:.2f} ms per call after warm-up, over the ceiling of "
                         f"{ceiling_ms:.2f} ms")


@dataclass(frozen=True)
class _Attempt:
    samples: list[float]
    energy_mj: float | None
    interference: Interference | None
    slowdown: float | None = None
    """The speed reference's worst slowdown just before and just after the samples (``None``: no reference)."""


def _warm_up(call: Callable[[], Any], sync: Callable[[], None], protocol: Protocol) -> None:
    """Rounds of ``warmup`` calls until two in a row agree within :data:`STABLE_WARMUP` (at most ``MAX_WARMUP_ROUNDS``).

    The first round's last call is timed alone against ``protocol.ceiling_ms`` (the earlier calls of a round may
    still be compiling or allocating): over it, :class:`Abandoned`.
    """
    calls = max(1, protocol.warmup)
    previous = None
    for round_ in range(MAX_WARMUP_ROUNDS):
        start = time.perf_counter()
        for _ in range(calls - 1):
            call()
        sync()
        last = time.perf_counter()
        call()
        sync()
        end = time.perf_counter()
        if round_ == 0 and protocol.ceiling_ms is not None and (end - last) * 1e3 > protocol.ceiling_ms:
            raise Abandoned((end - last) * 1e3, protocol.ceiling_ms)
        elapsed = end - start
        if previous is not None and abs(elapsed - previous) <= STABLE_WARMUP * previous:
            return
        previous = elapsed


def _sample(call: Callable[[], Any], sync: Callable[[], None], number: int, protocol: Protocol,
            meter: EnergyMeter | None, probe: InterferenceProbe | None, timer: SampleTimer | None = None) -> _Attempt:
    """One attempt: ``repeats`` samples of ``number`` calls each, with the interference seen meanwhile."""
    deadline = time.perf_counter() + protocol.max_seconds
    samples: list[float] = []
    e0 = meter.joules() if meter else 0.0
    if probe is not None:
        probe.start()
    for _ in range(protocol.repeats):
        start = time.perf_counter_ns()
        if timer is not None:
            timer.start()
        for _ in range(number):
            call()
        sync()
        elapsed_ms = timer.stop() if timer is not None else (time.perf_counter_ns() - start) / 1e6
        samples.append(elapsed_ms / number)
        if time.perf_counter() > deadline and len(samples) >= 3:
            break
    interference = probe.stop() if probe is not None else None
    energy = (meter.joules() - e0) * 1e3 / (number * len(samples)) if meter else None
    return _Attempt(samples, energy, interference)


def _disturbed(interference: Interference | None, protocol: Protocol) -> bool:
    return interference is not None and interference.total > protocol.max_interference


def _spoiled(attempt: _Attempt, protocol: Protocol) -> bool:
    """Worth measuring again: other work took the cores, or the whole machine ran slower than its best."""
    slowed = attempt.slowdown is not None and attempt.slowdown > protocol.max_slowdown
    return _disturbed(attempt.interference, protocol) or slowed


def untrusted_reason(interference: Interference | None, median: float, ci: tuple[float, float], protocol: Protocol,
                     attempts: int, *, slowdown: float | None = None) -> str:
    """Why a measurement cannot be trusted ('' when it can): a disturbed or slowed machine, or a median too uncertain."""
    reasons = []
    if interference is not None and _disturbed(interference, protocol):
        reasons.append(f"{interference.describe()} (limit {protocol.max_interference:.0%}) in each of {attempts} "
                       "attempt(s)")
    if slowdown is not None and slowdown > protocol.max_slowdown:
        reasons.append(f"the machine ran a fixed reference kernel {slowdown:.0%} slower than its best since boot "
                       f"(limit {protocol.max_slowdown:.0%})")
    half = (ci[1] - ci[0]) / 2 / median if median > 0 else math.inf
    if half > protocol.max_rel_ci:
        reasons.append(f"the median is uncertain by +-{half:.0%} (limit {protocol.max_rel_ci:.0%})")
    return "; ".join(reasons)


def median_and_spread(samples: list[float] | tuple[float, ...]) -> tuple[float, float]:
    """The median of the samples and their inter-quartile range (0 for a single sample)."""
    if len(samples) < 2:
        return float(samples[0]), 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return statistics.median(samples), q3 - q1


def median_interval(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free interval of the median: the sorted samples at ranks j and n+1-j.

    j is the largest rank whose interval covers the median with at least ``confidence``
    (each sample falls below the median with probability 1/2, so the coverage is
    binomial). With too few samples for ``confidence`` it is (min, max), whose
    coverage is 1 - 2^(1-n) (75 % for 3 samples).
    """
    xs = sorted(samples)
    n = len(xs)
    j = 1
    while j + 1 <= n // 2 and 1 - 2 * _below(j + 1, n) >= confidence:
        j += 1
    return float(xs[j - 1]), float(xs[n - j])


def _below(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) < k): the chance that fewer than k of n samples fall below the median."""
    return sum(math.comb(n, i) for i in range(k)) / 2**n


BOOTSTRAP_RESAMPLES = 2000


def _median_sums(sample_sets: Sequence[Sequence[float]], rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates of the sum of the sets' medians (each set resampled on its own)."""
    total = np.zeros(BOOTSTRAP_RESAMPLES)
    for samples in sample_sets:
        xs = np.asarray(samples, dtype=float)
        total += np.median(xs[rng.integers(0, len(xs), (BOOTSTRAP_RESAMPLES, len(xs)))], axis=1)
    return total


def sum_interval(sample_sets: Sequence[Sequence[float]], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile-bootstrap interval of a sum of medians (a sequential frame: each NN's median, added).

    One set needs no bootstrap: its interval is :func:`median_interval`'s.
    """
    if len(sample_sets) == 1:
        return median_interval(sample_sets[0], confidence)
    sums = _median_sums(sample_sets, np.random.default_rng(0))
    return float(np.quantile(sums, (1 - confidence) / 2)), float(np.quantile(sums, (1 + confidence) / 2))


def ratio_interval(numerator: Sequence[Sequence[float]], denominator: Sequence[Sequence[float]],
                   confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile-bootstrap interval of (sum of medians of ``numerator``) / (sum of medians of ``denominator``).

    A speedup is such a ratio (reference latency over candidate latency); both sides
    are resampled independently from their own samples, with a fixed seed, so the
    same result gives the same interval.
    """
    rng = np.random.default_rng(0)
    ratios = _median_sums(numerator, rng) / _median_sums(denominator, rng)
    return float(np.quantile(ratios, (1 - confidence) / 2)), float(np.quantile(ratios, (1 + confidence) / 2))


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
        why = "; ".join(dict.fromkeys(m.untrusted for m in ms if m.untrusted))
        out[name] = replace(ms[-1], median_ms=median, spread_ms=spread, samples_ms=samples, ci_ms=median_interval(samples),
                            peak_mem_bytes=max((m.peak_mem_bytes or 0 for m in ms), default=None), trusted=not why,
                            untrusted=why, interference=max((m.interference or 0.0 for m in ms), default=None))
    return out


def _calls_per_sample(call: Callable[[], Any], sync: Callable[[], None], min_sample_ms: float) -> int:
    start = time.perf_counter()
    call()
    sync()
    once_ms = max((time.perf_counter() - start) * 1e3, 1e-3)
    return max(1, int(min_sample_ms / once_ms + 0.999))
