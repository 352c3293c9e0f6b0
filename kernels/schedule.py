"""Measuring several models as one perception frame, under a schedule.

Luthier found that how the work is spread over the cores mattered more than which
kernel ran, so the schedule is measured, not assumed:

- ``sequential``: the models run one after another, each with all the target's
  threads; a frame costs the sum of their latencies.
- ``parallel``: the models run side by side, the threads split between them; a
  frame costs the wall time until the slowest finishes, measured with them
  running at once (:func:`measure_concurrent`).

Every figure here is taken by :func:`.measure.measure_callable`, the one timing
loop, under one :class:`.measure.Protocol`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from .auto import raced
from .compiler import compile
from .errors import KernelsError
from .measure import PROCESS_CORES, Measurement, Protocol, measure_callable, measure_interleaved, measurement_cores
from .model import Model, is_onnx
from .registry import BackendRef, get_backend
from .target import Target, TuningBudget
from .torch_backends import torch_threads

Schedule = Literal["sequential", "parallel"]
SCHEDULES: tuple[Schedule, ...] = ("sequential", "parallel")
QUICK = Protocol(warmup=1, repeats=3, max_seconds=5.0, retries=0)
"""The quick protocol of :func:`measure_untuned`: enough to rank, not to report (no retries: it only guides the
sampler, and its interference is still recorded)."""


@dataclass(frozen=True)
class Workload:
    """One model of a frame: what to compile, its example inputs, and the backends that have kernels for its dtype.

    ``runnable_on`` (backend names) limits ``auto`` to those backends and picks the
    backend of an untuned measurement; ``None``: any backend.
    """

    model: Model
    example_inputs: tuple[Any, ...]
    runnable_on: tuple[str, ...] | None = None


@dataclass
class MeasuredModel:
    """One model compiled for the target, with its measurement."""

    compiled: Any  # Compiled
    measurement: Measurement

    @property
    def backend(self) -> str:
        return self.compiled.backend

    @property
    def backends_measured(self) -> dict[str, float | str]:
        """Every backend's median latency (ms), or why it could not run (``auto`` measures several)."""
        outcomes = getattr(self.compiled, "outcomes", ())
        return ({o.backend: o.measurement.median_ms if o.measurement else str(o.error) for o in outcomes}
                or {self.compiled.backend: self.measurement.median_ms})


@dataclass
class FrameMeasurement:
    """A frame's models, compiled and measured under ``schedule``: latency per frame (ms) and memory (bytes).

    ``parts`` are the measurements whose medians add up to ``latency_ms`` (each model's
    in a sequential frame, the concurrent frame's in a parallel one): their samples give
    the frame's interval, and the frame is trusted only when every part is.
    """

    schedule: Schedule
    models: dict[str, MeasuredModel]
    latency_ms: float
    memory_bytes: int | None
    parts: tuple[Measurement, ...] = ()


def schedules_for(n_models: int, threads: int) -> tuple[Schedule, ...]:
    """Schedules worth measuring: side by side needs at least one thread per model."""
    return SCHEDULES if n_models > 1 and threads >= n_models else ("sequential",)


def threads_of(target: Target) -> int:
    """The target's thread count; all the cores this process may use when it sets none."""
    return target.threads or len(os.sched_getaffinity(0))


def measure_model(workload: Workload, target: Target, *, cache_dir: str | Path | None = None,
                  incumbent_ms: float | None = None, protocol: Protocol = Protocol()) -> MeasuredModel:
    """Compile (and tune, within the target's budget) one model and measure it alone."""
    compiled = compile(workload.model, workload.example_inputs, target, cache_dir=cache_dir, incumbent_ms=incumbent_ms,
                       runnable_on=workload.runnable_on)
    return MeasuredModel(compiled, compiled.measure(protocol))


def measure_frame(workloads: Mapping[str, Workload], schedule: Schedule, target: Target, *,
                  cache_dir: str | Path | None = None, incumbent_ms: float | None = None,
                  protocol: Protocol = Protocol()) -> FrameMeasurement:
    """Compile every model for ``schedule`` (its share of the threads) and measure the frame."""
    model_target = frame_target(target, schedule, len(workloads))
    compiled = {name: compile(w.model, w.example_inputs, model_target, cache_dir=cache_dir, incumbent_ms=incumbent_ms,
                              runnable_on=w.runnable_on) for name, w in workloads.items()}
    return _measured_frame(compiled, schedule, model_target, protocol)


def frame_target(target: Target, schedule: Schedule, n_models: int) -> Target:
    """The target each model of a frame is compiled for: all the threads (sequential) or its share (parallel)."""
    if schedule not in SCHEDULES:
        raise KernelsError(f"schedule: '{schedule}' is not one of {', '.join(SCHEDULES)}")
    threads = threads_of(target)
    return replace(target, threads=max(1, threads // n_models) if schedule == "parallel" else threads)


def _measured_frame(compiled: Mapping[str, Any], schedule: Schedule, model_target: Target,
                    protocol: Protocol = Protocol()) -> FrameMeasurement:
    """Measure models already compiled for ``model_target`` (:func:`frame_target`) as one frame, now.

    Each model is measured alone (its figures and memory); a parallel frame is then
    measured with them running at once.
    """
    models = {name: MeasuredModel(c, c.measure(protocol)) for name, c in compiled.items()}
    if schedule == "sequential":
        parts = tuple(m.measurement for m in models.values())
    else:
        parts = (measure_concurrent([m.compiled for m in models.values()], model_target, protocol),)
    return FrameMeasurement(schedule, models, sum(p.median_ms for p in parts),
                            _total([m.measurement.peak_mem_bytes for m in models.values()]), parts)


def measure_concurrent(compiled: Sequence[Any], target: Target, protocol: Protocol = Protocol()) -> Measurement:
    """One frame with all models started together, each on ``target.threads`` threads, timed by the protocol."""
    with _frame_call(compiled, "parallel", target.threads) as frame:
        return measure_callable(frame, backend=" | ".join(c.backend for c in compiled), device=target.device,
                                device_key=target.device_key, threads=target.threads,
                                param_bytes=sum(getattr(c, "param_bytes", 0) for c in compiled), protocol=protocol,
                                cores=measurement_cores(target.threads * len(compiled) if target.threads else None)
                                if target.device == "cpu" else None)


COMPARISON = Protocol(warmup=2, repeats=10)
"""Each round's protocol in :func:`compare_frames` (three rounds pool 30 samples per frame)."""


def compare_frames(frames: Mapping[str, tuple[Mapping[str, Any], Schedule]], target: Target, *, rounds: int = 3,
                   protocol: Protocol = COMPARISON) -> dict[str, Measurement]:
    """Frames of models already compiled (:func:`frame_target`) timed side by side, in interleaved rounds.

    A speedup is a ratio of two frames' latencies; measured minutes or machines apart, it
    carries whatever changed in between. Here every frame is timed in this process, round
    after round, so each sees the same machine and the same load
    (:func:`.measure.measure_interleaved`), pinned to the target's cores.
    """
    threads = threads_of(target)
    with contextlib.ExitStack() as stack:
        calls = {name: stack.enter_context(_frame_call(list(models.values()), schedule,
                                                       max(1, threads // len(models)) if schedule == "parallel" else threads))
                 for name, (models, schedule) in frames.items()}
        return measure_interleaved(calls, rounds=rounds, protocol=protocol, device=target.device,
                                   device_key=target.device_key, threads=threads if target.device == "cpu" else None)


@dataclass(frozen=True)
class FrameModel:
    """A model of a frame to compile in another process: its workload, on the backend its measurement chose."""

    workload: Workload
    backend: str


def compare_frames_fresh(frames: Mapping[str, tuple[Mapping[str, FrameModel], Schedule]], target: Target, *,
                         rounds: int = 3, cache_dir: str | Path | None = None,
                         imports: Sequence[str] = ()) -> dict[str, Measurement]:
    """:func:`compare_frames` in a fresh process: every model compiled there again on its backend, then the frames
    timed side by side.

    A ratio of frames is the product's headline, so it is taken where nothing of the run's state can reach it: a
    run's process that has trained NNs, compiled dozens of candidates and driven closed-loop runs can time a frame of
    two models well above the sum of its models (``benchmarks/side_by_side_fresh.py`` compares the two:
    docs/BENCHMARKS.md, "The side-by-side stage in a fresh process"). A library that binds the main thread to one
    core (TVM does, unless told not to) puts 2-thread models and every child the process starts on that core, so
    the child starts on this process's cores (:data:`.measure.PROCESS_CORES`) and TVM binds nothing. The process is
    a new interpreter started with ``subprocess``, not multiprocessing's ``spawn``, which imports the caller's main
    module again and so fails in a user's script that calls ``qaopt.optimize`` without a main guard;
    it gets the caller's import path and environment. The models travel pickled (torch modules and tensors by value,
    ONNX files by path), the figures come back as :class:`Measurement` figures of one epoch. ``imports`` are modules
    to import there first: those that register the backends named (a spec's plugins).
    """
    with tempfile.TemporaryDirectory(prefix="qaopt-frames-") as folder:
        job, out = Path(folder) / "job.pickle", Path(folder) / "measured.pickle"
        payload = pickle.dumps((dict(frames), target, rounds, None if cache_dir is None else str(cache_dir)))
        job.write_bytes(pickle.dumps((list(sys.path), tuple(imports), payload)))
        # On this process's cores before anything is imported there: a child starts on its calling thread's cores,
        # which a runtime may have narrowed (measure.PROCESS_CORES), and kernels reads its cores on import.
        pin = f"import os; os.sched_setaffinity(0, {list(PROCESS_CORES)!r}); " if PROCESS_CORES else ""
        code = f"{pin}from {__name__} import _compare_job; _compare_job({str(job)!r}, {str(out)!r})"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if not out.exists():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise KernelsError(f"the fresh process that times the frames side by side ended with exit code "
                               f"{proc.returncode} ({last}); run again, the stages before it are kept")
        result = pickle.loads(out.read_bytes())
    if isinstance(result, BaseException):
        raise result
    return result


def _compare_job(job: str, out: str) -> None:
    """The fresh process's work: the caller's import path and modules, then every model compiled and the frames
    timed; the figures (or the error) pickled to ``out``."""
    path, imports, payload = pickle.loads(Path(job).read_bytes())
    sys.path[:] = path
    try:
        for module in imports:
            importlib.import_module(module)
        frames, target, rounds, cache_dir = pickle.loads(payload)
        # A model that several frames share (the caller passed one FrameModel; pickling kept it one object) is
        # compiled once per thread count: a frame and its models timed alone then run the same compiled model.
        built: dict[tuple[int, int | None], Any] = {}

        def compiled_for(model: FrameModel, model_target: Target) -> Any:
            key = (id(model), model_target.threads)
            if key not in built:
                built[key] = compile(model.workload.model, model.workload.example_inputs,
                                     model_target.with_backend(model.backend), cache_dir=cache_dir)
            return built[key]

        compiled = {}
        for name, (models, schedule) in frames.items():
            model_target = frame_target(target, schedule, len(models))
            compiled[name] = ({n: compiled_for(m, model_target) for n, m in models.items()}, schedule)
        result: Any = compare_frames(compiled, target, rounds=rounds)
    except Exception as exc:  # handed back to the caller, which raises it
        result = exc if _picklable(exc) else KernelsError(f"{type(exc).__name__}: {exc}")
    Path(out).write_bytes(pickle.dumps(result))


def _picklable(value: Any) -> bool:
    try:
        pickle.loads(pickle.dumps(value))
    except Exception:
        return False
    return True


@contextlib.contextmanager
def _frame_call(compiled: Sequence[Any], schedule: Schedule, share: int | None) -> Iterator[Callable[[], None]]:
    """One frame of compiled models as a callable: one after another, or started together on a thread pool.

    Each model runs its :meth:`~qaopt.kernels.Compiled.inference` (inputs already on the device), the call its own
    measurement times, so a frame and the sum of its models' figures time the same work. Torch's process-wide pool
    is set to the models' ``share`` of threads for the whole frame, so that two models starting together do not
    resize it under each other.
    """
    calls = [c.inference() for c in compiled]
    if schedule == "sequential":
        with torch_threads(share):
            def frame() -> None:
                for call in calls:
                    call()
            yield frame
        return
    with ThreadPoolExecutor(len(compiled)) as pool, torch_threads(share):
        def frame() -> None:
            for future in [pool.submit(call) for call in calls]:
                future.result()
        yield frame


QUICK_BACKENDS = ("onnxruntime", "openvino", "torch[cuda_graph]")
"""Backends of a quick untuned figure: each builds in seconds and runs the whole graph on its own kernels, where torch
eager was many times slower on an AVX2-only CPU (docs/BENCHMARKS.md, "Knobs"), and on a GPU at batch 1 waits on the
host's launches: an untuned figure on eager ranks configurations by torch's overhead, not by their work. Every one of
them that runs the model and that the target races is timed and the fastest kept, as a trial's measurement keeps its
fastest backend: from ONNX Runtime alone an int8 NN is priced at ONNX Runtime's QDQ kernels (CropFollow's compact NN:
1.8-2.0 ms, against 1.2-1.3 ms on OpenVINO, which its trials then chose). A variant counts as its own backend: a
scaled or merged NN probed on eager while the reference was timed replayed as a CUDA graph measured 8-14x slower than
the reference on an H100, and the GPU search then proposed neither knob."""


def untuned_backends(workload: Workload, target: Target) -> tuple[BackendRef, ...]:
    """The backends an untuned figure of the model times: those of :data:`QUICK_BACKENDS` that run its dtype, that the
    target races (``auto``: its ``backends``, else the device's; else its one backend, variant included) and that can
    serve it; else the target's own backend where it runs the model; else the first backend that runs the dtype and
    can serve the target (ONNX Runtime first, then torch, ...)."""
    names = workload.runnable_on or (("onnxruntime",) if is_onnx(workload.model) else ("torch",))
    auto = target.backend == "auto"
    allowed = set(raced(target)) if auto else {BackendRef.parse(target.backend)}
    reasons: dict[str, str] = {}

    def serves(ref: BackendRef) -> bool:
        try:
            reason = get_backend(ref).unavailable_reason(target)
        except KernelsError as exc:
            reason = str(exc)
        if reason is not None:
            reasons[str(ref)] = reason
        return reason is None

    candidates = [BackendRef.parse(n) for n in QUICK_BACKENDS]
    quick = tuple(r for r in candidates if r.name in names and r in allowed and serves(r))
    if quick:
        return quick
    own = None if auto else BackendRef.parse(target.backend)
    if own is not None and own.name in names and serves(own):
        return (own,)
    first = next((r for r in (*candidates, *map(BackendRef.parse, names)) if r.name in names and serves(r)), None)
    if first is None:
        raise KernelsError(f"target.backend: no backend that runs this model can serve device '{target.device}': "
                           + "; ".join(f"{n}: {r}" for n, r in reasons.items()))
    return (first,)


def measure_untuned(workloads: Mapping[str, Workload], target: Target, *, cache_dir: str | Path | None = None,
                    protocol: Protocol = QUICK) -> FrameMeasurement:
    """A quick sequential frame: each model untuned on each of :func:`untuned_backends`, the fastest kept, timed by
    ``protocol``."""
    untuned = replace(target, tuning=TuningBudget())
    models = {}
    for name, w in workloads.items():
        measured = [measure_model(w, untuned.with_backend(ref), cache_dir=cache_dir, protocol=protocol)
                    for ref in untuned_backends(w, target)]
        models[name] = min(measured, key=lambda m: m.measurement.median_ms)
    return FrameMeasurement("sequential", models, sum(m.measurement.median_ms for m in models.values()),
                            _total([m.measurement.peak_mem_bytes for m in models.values()]),
                            tuple(m.measurement for m in models.values()))


def _total(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else int(sum(v for v in values if v is not None))
