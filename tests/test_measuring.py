"""Measuring from the candidate: each model of a frame is compiled on an input of its own shape, and a candidate
that serves several NNs runs once per frame, its figures shared by every NN it serves."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from qaopt import kernels
from qaopt import measuring
from qaopt.approx import Knobs


def _candidate(nn: str, key: str, shape: tuple[int, ...], serves: tuple[str, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(nn=nn, key=key, knobs=Knobs(), module=f"module-{key}", onnx_path=None,
                           runnable_on=("torch",), error=0.1, metric="l1", macs=1, params=1, bytes_hash=f"bytes-{key}",
                           serves=serves or (nn,), example=lambda: np.zeros(shape, np.float32))


def test_a_shared_candidate_runs_once_per_frame_on_its_own_input(monkeypatch):
    seen: dict[str, kernels.Workload] = {}

    def measure_frame(workloads, schedule, target, cache_dir=None, incumbent_ms=None):
        seen.update(workloads)
        measurement = SimpleNamespace(median_ms=2.0, peak_mem_bytes=10, samples_ms=(2.0, 2.0), trusted=True,
                                      untrusted="", backend="torch", epoch="e")
        models = {n: SimpleNamespace(backend="torch", measurement=measurement, backends_measured={}, compiled=None)
                  for n in workloads}
        return SimpleNamespace(models=models, latency_ms=2.0 * len(workloads), memory_bytes=10,
                               parts=tuple(measurement for _ in workloads))

    monkeypatch.setattr(kernels, "measure_frame", measure_frame)
    monkeypatch.setattr(kernels, "sum_interval", lambda samples: (1.0, 3.0))
    shared = _candidate("heading", "both", (1, 3, 60, 80), serves=("heading", "distance"))
    alone = _candidate("stop", "stop-key", (1, 3, 120, 160))
    frame = measuring.measure_configuration({"heading": shared, "distance": shared, "stop": alone}, "sequential",
                                            target=None, cache_dir=None)
    assert sorted(seen) == ["distance", "stop"], "one model for the two NNs the shared candidate serves"
    assert seen["distance"].example_inputs[0].shape == (1, 3, 60, 80), "its own (reduced) input, not the spec's"
    assert seen["stop"].example_inputs[0].shape == (1, 3, 120, 160)
    assert frame.latency_ms == 4.0 and set(frame.nns) == {"heading", "distance", "stop"}
    assert frame.nns["heading"].choice.candidate == frame.nns["distance"].choice.candidate == "both"
