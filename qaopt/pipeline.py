"""Measuring a configuration: every NN compiled for the target, timed per perception frame.

Luthier found that how the work is spread over the cores mattered more than which
kernel ran, so the schedule is measured, not assumed:

- ``sequential``: the NNs run one after another, each with all the target's threads;
  a frame costs the sum of their latencies.
- ``parallel``: the NNs run side by side, the threads split between them; a frame
  costs the wall time until the slowest finishes, measured with them running at once.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from qaopt import kernels
from qaopt.kernels.torch_backends import torch_threads  # torch's pool is process-wide: one share per NN
from qaopt.approx import Candidate
from qaopt.result import NNChoice, Schedule

SCHEDULES: tuple[Schedule, ...] = ("sequential", "parallel")


@dataclass
class MeasuredNN:
    """One NN's candidate compiled on the target, with its measured figures."""

    candidate: Candidate
    compiled: Any
    choice: NNChoice


def schedules_for(n_nns: int, threads: int) -> tuple[Schedule, ...]:
    """Schedules worth measuring: side by side needs at least one thread per NN."""
    return SCHEDULES if n_nns > 1 and threads >= n_nns else ("sequential",)


def threads_of(target: kernels.Target) -> int:
    import os

    return target.threads or len(os.sched_getaffinity(0))


def model_of(candidate: Candidate) -> Any:
    """What the kernels backends compile: the int8 ONNX graph, else the torch module."""
    return candidate.onnx_path if candidate.onnx_path is not None else candidate.module


def compile_nn(
    candidate: Candidate,
    example: np.ndarray,
    target: kernels.Target,
    cache_dir: Path,
    incumbent_ms: float | None = None,
    protocol: kernels.Protocol = kernels.Protocol(),
) -> MeasuredNN:
    """Compile (and tune, within the target's budget) one candidate and measure it alone."""
    compiled = kernels.compile(model_of(candidate), [example], target, cache_dir=cache_dir, incumbent_ms=incumbent_ms,
                               runnable_on=candidate.runnable_on)
    measurement = compiled.measure(protocol)
    measured: dict[str, float | str] = {}
    for outcome in getattr(compiled, "outcomes", ()):
        measured[outcome.backend] = outcome.measurement.median_ms if outcome.measurement else str(outcome.error)
    choice = NNChoice(
        knobs=candidate.knobs.model_dump(mode="json"),
        candidate=candidate.key,
        error=candidate.error,
        metric=candidate.metric,
        backend=compiled.backend,
        latency_ms=measurement.median_ms,
        memory_bytes=measurement.peak_mem_bytes,
        macs=candidate.macs,
        params=candidate.params,
        backends_measured=measured or {compiled.backend: measurement.median_ms},
    )
    return MeasuredNN(candidate, compiled, choice)


def measure_configuration(
    candidates: Mapping[str, Candidate],
    examples: Mapping[str, np.ndarray],
    schedule: Schedule,
    target: kernels.Target,
    cache_dir: Path,
    incumbent_ms: float | None = None,
) -> tuple[dict[str, MeasuredNN], float, int | None]:
    """Compile every NN for ``schedule`` and return them with the frame latency (ms) and memory (bytes)."""
    threads = threads_of(target)
    share = max(1, threads // len(candidates)) if schedule == "parallel" else threads
    nn_target = replace(target, threads=share)
    measured = {
        name: compile_nn(c, examples[name], nn_target, cache_dir, incumbent_ms) for name, c in candidates.items()
    }
    memory = _total([m.choice.memory_bytes for m in measured.values()])
    if schedule == "sequential":
        return measured, sum(m.choice.latency_ms for m in measured.values()), memory
    frame_ms = concurrent_frame_ms([m.compiled for m in measured.values()], [examples[n] for n in measured], share,
                                   target.device_key)
    return measured, frame_ms, memory


def concurrent_frame_ms(compiled: list[Any], inputs: list[np.ndarray], threads_each: int, device_key: str,
                        protocol: kernels.Protocol = kernels.Protocol()) -> float:
    """Median wall time of one frame with all NNs started together, each on its share of threads."""

    def frame(pool: ThreadPoolExecutor) -> float:
        start = time.perf_counter()
        for future in [pool.submit(c.run, x) for c, x in zip(compiled, inputs, strict=True)]:
            future.result()
        return (time.perf_counter() - start) * 1e3

    with kernels.device_lock(device_key), torch_threads(threads_each), ThreadPoolExecutor(len(compiled)) as pool:
        for _ in range(protocol.warmup):
            frame(pool)
        samples = []
        deadline = time.perf_counter() + protocol.max_seconds
        while len(samples) < protocol.repeats and (len(samples) < 3 or time.perf_counter() < deadline):
            samples.append(frame(pool))
    return statistics.median(samples)


def _total(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else int(sum(v for v in values if v is not None))
