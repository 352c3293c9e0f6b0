"""Measuring candidates on the target: approx's candidates handed to kernels, the figures returned as NNChoices.

The timing itself (protocol, schedules, the quick untuned figure, intervals and
the trust flag) is :mod:`qaopt.kernels`'; this module only translates between
the two components, and carries each figure's :class:`~qaopt.result.Latency`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qaopt import kernels
from qaopt.approx import Candidate
from qaopt.result import Latency, NNChoice


@dataclass
class MeasuredNN:
    """One NN's candidate compiled on the target, with its measured figures."""

    candidate: Candidate
    compiled: Any  # kernels.Compiled
    choice: NNChoice


@dataclass(frozen=True)
class MeasuredConfiguration:
    """A configuration's NNs compiled and measured as one frame: latency per frame (ms), its trust, memory (bytes)."""

    nns: dict[str, MeasuredNN]
    latency_ms: float
    memory_bytes: int | None
    latency: Latency


def latency_of(parts: Sequence[kernels.Measurement]) -> Latency:
    """The interval and trust of a latency that is the sum of ``parts``' medians (one part: its own interval)."""
    samples = [list(p.samples_ms) for p in parts]
    why = "; ".join(f"{p.backend}: {p.untrusted}" for p in parts if not p.trusted)
    return Latency(ci_ms=kernels.sum_interval(samples), samples_ms=samples, trusted=not why, untrusted=why,
                   epoch=" + ".join(dict.fromkeys(p.epoch for p in parts)))


def workload_of(candidate: Candidate) -> kernels.Workload:
    """What kernels compiles for a candidate: the int8 ONNX graph, else the torch module, on the backends of its dtype,
    with an input of the candidate's own shape."""
    model = candidate.onnx_path if candidate.onnx_path is not None else candidate.module
    return kernels.Workload(model, (candidate.example(),), tuple(candidate.runnable_on))


def frame_models(candidates: Mapping[str, Candidate]) -> dict[str, Candidate]:
    """The models a frame runs: one per distinct candidate, named by the first of the NNs it serves here.

    A candidate that serves several of the configuration's NNs (one module in place of them)
    runs once per frame, not once per NN.
    """
    first: dict[str, str] = {}
    for name in sorted(candidates):
        first.setdefault(candidates[name].key, name)
    return {name: candidates[name] for name in first.values()}


def _measured(candidate: Candidate, measured: kernels.MeasuredModel) -> MeasuredNN:
    choice = NNChoice(
        knobs=candidate.knobs.model_dump(mode="json"),
        candidate=candidate.key,
        bytes_hash=candidate.bytes_hash,
        error=candidate.error,
        metric=candidate.metric,
        backend=measured.backend,
        latency_ms=measured.measurement.median_ms,
        memory_bytes=measured.measurement.peak_mem_bytes,
        macs=candidate.macs,
        params=candidate.params,
        backends_measured=measured.backends_measured,
        latency=latency_of([measured.measurement]),
        serves=list(candidate.serves) if len(candidate.serves) > 1 else [],
    )
    return MeasuredNN(candidate, measured.compiled, choice)


def _by_nn(candidates: Mapping[str, Candidate], models: Mapping[str, kernels.MeasuredModel]) -> dict[str, MeasuredNN]:
    """Each NN of the configuration with the measurement of the frame model that serves it."""
    served = {c.key: models[name] for name, c in frame_models(candidates).items()}
    return {n: _measured(c, served[c.key]) for n, c in candidates.items()}


def measure_configuration(
    candidates: Mapping[str, Candidate],
    schedule: kernels.Schedule,
    target: kernels.Target,
    cache_dir: Path,
    incumbent_ms: float | None = None,
) -> MeasuredConfiguration:
    """Compile every model of the frame for ``schedule``; return each NN's figures with the frame latency (ms, with
    its interval) and memory."""
    frame = kernels.measure_frame({n: workload_of(c) for n, c in frame_models(candidates).items()}, schedule, target,
                                  cache_dir=cache_dir, incumbent_ms=incumbent_ms)
    return MeasuredConfiguration(_by_nn(candidates, frame.models), frame.latency_ms, frame.memory_bytes,
                                 latency_of(frame.parts))


def quick_latency(candidates: Mapping[str, Candidate], target: kernels.Target, cache_dir: Path
                  ) -> tuple[float, int | None]:
    """The quick untuned figure of a configuration (sequential): :func:`qaopt.kernels.measure_untuned`."""
    frame = kernels.measure_untuned({n: workload_of(c) for n, c in frame_models(candidates).items()}, target,
                                    cache_dir=cache_dir)
    return frame.latency_ms, frame.memory_bytes


def compile_choice(candidate: Candidate, choice: NNChoice, target: kernels.Target, cache_dir: Path) -> Any:
    """The candidate compiled again on the backend its measurement chose (``choice.backend``), for export."""
    workload = workload_of(candidate)
    return kernels.compile(workload.model, workload.example_inputs, target.with_backend(choice.backend),
                           cache_dir=cache_dir)


def untuned_latency(candidate: Candidate, target: kernels.Target, cache_dir: Path | None = None,
                    protocol: kernels.Protocol = kernels.Protocol()) -> tuple[str, float]:
    """``(backend, median ms)`` of one candidate, untuned: the fastest of :func:`qaopt.kernels.untuned_backends`.

    ``protocol`` defaults to the one ``optimize`` measures with, so a sweep's figures compare with a run's.
    """
    frame = kernels.measure_untuned({candidate.nn: workload_of(candidate)}, target, cache_dir=cache_dir,
                                    protocol=protocol)
    measured = frame.models[candidate.nn]
    return measured.backend, measured.measurement.median_ms
