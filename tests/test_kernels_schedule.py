"""Frames of several models under a schedule, and the quick untuned figure, all timed by the one protocol."""

from __future__ import annotations

import pickle
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from qaopt import kernels
from qaopt.kernels import BackendRef, Protocol, Target, Workload

QUICK = Protocol(warmup=1, repeats=4, min_sample_ms=1.0, max_seconds=5.0)


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 8 * 8, 1)).eval()


@pytest.fixture(scope="module")
def workloads():
    x = torch.rand(1, 1, 8, 8)
    return {"a": Workload(_net(0), (x,)), "b": Workload(_net(1), (x,), runnable_on=("torch",))}


def test_schedules_for():
    assert kernels.schedules_for(2, 2) == ("sequential", "parallel")
    assert kernels.schedules_for(2, 1) == ("sequential",) and kernels.schedules_for(1, 8) == ("sequential",)
    assert kernels.threads_of(Target(threads=3)) == 3 and kernels.threads_of(Target()) >= 1


def test_sequential_frame_sums_its_models(workloads, monkeypatch, tmp_path):
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    frame = kernels.measure_frame(workloads, "sequential", Target(backend="torch", threads=2), protocol=QUICK)
    assert set(frame.models) == {"a", "b"} and frame.schedule == "sequential"
    assert frame.latency_ms == pytest.approx(sum(m.measurement.median_ms for m in frame.models.values()))
    assert all(m.compiled.target.threads == 2 and m.backends_measured == {"torch": m.measurement.median_ms}
               for m in frame.models.values())
    assert frame.memory_bytes == sum(m.measurement.peak_mem_bytes for m in frame.models.values())


def test_parallel_frame_splits_threads_and_times_them_together(workloads, monkeypatch, tmp_path):
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    timed = []
    real = kernels.schedule.measure_callable
    monkeypatch.setattr(kernels.schedule, "measure_callable", lambda call, **kw: timed.append(kw) or real(call, **kw))
    frame = kernels.measure_frame(workloads, "parallel", Target(backend="torch", threads=2), protocol=QUICK)
    assert all(m.compiled.target.threads == 1 for m in frame.models.values())
    assert len(timed) == 1 and timed[0]["protocol"] == QUICK and timed[0]["threads"] == 1  # the one loop, one protocol
    assert frame.latency_ms > 0
    with pytest.raises(kernels.KernelsError, match="schedule: 'pipelined'"):
        kernels.measure_frame(workloads, "pipelined", Target(backend="torch"))


def test_concurrent_measurement_follows_the_protocol(workloads, monkeypatch, tmp_path):
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    target = Target(backend="torch", threads=1)
    compiled = [kernels.compile(w.model, w.example_inputs, target) for w in workloads.values()]
    m = kernels.measure_concurrent(compiled, target, QUICK)
    assert len(m.samples_ms) == QUICK.repeats and m.backend == "torch | torch" and m.threads == 1


def test_untuned_measurement_takes_onnxruntime_else_the_first_backend_of_the_dtype(workloads, monkeypatch, tmp_path):
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    onnx_path = kernels.export_onnx(workloads["a"].model, workloads["a"].example_inputs, tmp_path / "a.onnx")
    jobs = {"int8-like": Workload(onnx_path, workloads["a"].example_inputs, runnable_on=("onnxruntime",)),
            "fp32": Workload(workloads["b"].model, workloads["b"].example_inputs,
                             runnable_on=("torch", "torch-compile", "onnxruntime", "tvm"))}
    target = Target(backend="auto", threads=1, tuning=kernels.TuningBudget(trials=64))
    frame = kernels.measure_untuned(jobs, target)
    assert {n: m.backend for n, m in frame.models.items()} == {"int8-like": "onnxruntime", "fp32": "onnxruntime"}
    assert kernels.untuned_backends(Workload(workloads["b"].model, workloads["b"].example_inputs,
                                             runnable_on=("torch", "tvm")), target) == (BackendRef.parse("torch"),)
    assert all(m.compiled.target.tuning.trials == 0 for m in frame.models.values())
    assert frame.latency_ms == pytest.approx(sum(m.measurement.median_ms for m in frame.models.values()))
    assert len(frame.models["fp32"].measurement.samples_ms) <= kernels.QUICK.repeats
    with pytest.raises(kernels.KernelsError, match="no backend that runs this model can serve device 'rpc'"):
        kernels.untuned_backends(jobs["int8-like"], Target(device="rpc", rpc=kernels.RPCConfig(port=9190)))


def test_untuned_measurement_keeps_the_fastest_quick_backend_the_target_races(workloads, monkeypatch, tmp_path):
    """CropFollow's compact NN in int8 ran 1.4-1.7x faster on OpenVINO than on ONNX Runtime's QDQ kernels: an
    untuned figure from ONNX Runtime alone prices a dtype unlike the trial's measurement, which keeps the fastest."""
    if kernels.get_backend("openvino").unavailable_reason(Target()) is not None:
        pytest.skip("OpenVINO is not installed")
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    both = Workload(workloads["a"].model, workloads["a"].example_inputs,
                    runnable_on=("torch", "onnxruntime", "openvino"))
    auto = Target(backend="auto", threads=1)
    assert kernels.untuned_backends(both, auto) == (BackendRef.parse("onnxruntime"), BackendRef.parse("openvino"))
    assert kernels.untuned_backends(both, replace(auto, backends=(BackendRef.parse("openvino"),))) == (
        BackendRef.parse("openvino"),)
    pinned = Target(backend="onnxruntime", threads=1)
    assert kernels.untuned_backends(both, pinned) == (BackendRef.parse("onnxruntime"),)
    medians = {"onnxruntime": 5.0, "openvino": 1.0}
    original = kernels.schedule.measure_model

    def timed(workload, target, **kw):
        measured = original(workload, target, **kw)
        median = medians[BackendRef.parse(str(target.backend)).name]
        return replace(measured, measurement=replace(measured.measurement, median_ms=median))

    monkeypatch.setattr(kernels.schedule, "measure_model", timed)
    frame = kernels.measure_untuned({"a": both}, auto)
    assert frame.models["a"].backend == "openvino" and frame.latency_ms == 1.0


def test_interleaved_rounds_pool_their_samples(monkeypatch, tmp_path):
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    out = kernels.measure_interleaved({"sum": lambda: np.arange(1000).sum(), "noop": lambda: None}, rounds=3,
                                      protocol=Protocol(warmup=1, repeats=2, min_sample_ms=0.5))
    assert set(out) == {"sum", "noop"} and all(len(m.samples_ms) == 6 for m in out.values())
    assert out["noop"].median_ms <= out["sum"].median_ms


def test_compare_frames_times_compiled_frames_side_by_side(workloads, monkeypatch, tmp_path):
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    target = Target(backend="torch", threads=2)
    frames = {}
    for schedule in kernels.SCHEDULES:
        model_target = kernels.frame_target(target, schedule, len(workloads))
        assert model_target.threads == (1 if schedule == "parallel" else 2)
        frames[schedule] = ({n: kernels.compile(w.model, w.example_inputs, model_target) for n, w in workloads.items()},
                            schedule)
    frames["one model"] = ({"a": frames["sequential"][0]["a"]}, "sequential")
    calls = {}  # each frame's models counted: a frame runs every model of it once per call

    class Counted:
        def __init__(self, compiled, key):
            self.compiled, self.key = compiled, key
            calls[key] = 0

        def inference(self):
            run = self.compiled.inference()

            def call():
                calls[self.key] += 1
                return run()
            return call

    counted = {name: ({n: Counted(c, (name, n)) for n, c in models.items()}, schedule)
               for name, (models, schedule) in frames.items()}
    out = kernels.compare_frames(counted, target, rounds=2, protocol=QUICK)
    assert set(out) == set(frames) and all(len(m.samples_ms) == 2 * QUICK.repeats for m in out.values())
    assert len({m.epoch for m in out.values()}) == 1
    for schedule in kernels.SCHEDULES:
        assert calls[(schedule, "a")] == calls[(schedule, "b")] > 0
    assert calls[("one model", "a")] > 0
    with pytest.raises(kernels.KernelsError, match="schedule: 'zigzag'"):
        kernels.frame_target(target, "zigzag", 2)


def test_frames_compared_in_a_fresh_process_are_compiled_there_on_their_backends(workloads, monkeypatch, tmp_path):
    """The side-by-side stage's timing: the models travel by value, each is compiled on its own backend in a fresh
    process, and the frames come back timed there, in one epoch that is not this process's."""
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    both = {n: kernels.FrameModel(w, "torch") for n, w in workloads.items()}
    frames = {"two": (both, "sequential"), "one": ({"a": both["a"]}, "sequential")}
    out = kernels.compare_frames_fresh(frames, Target(backend="auto", threads=1), rounds=1)
    assert set(out) == {"one", "two"}
    assert len({m.epoch for m in out.values()}) == 1 and out["one"].epoch != kernels.EPOCH
    assert out["one"].median_ms < out["two"].median_ms
    with pytest.raises(kernels.KernelsError, match="no_such_backend"):
        kernels.compare_frames_fresh({"x": ({"a": kernels.FrameModel(workloads["a"], "no_such_backend")},
                                            "sequential")}, Target(threads=1), rounds=1)


def test_a_model_several_frames_share_is_compiled_once_in_the_fresh_process(workloads, monkeypatch, tmp_path):
    """The side-by-side stage times a frame and each of its NNs alone: one FrameModel in both is one compile there
    (and one compiled model timed in both), so the NN's figure is of the model the frame ran."""
    from qaopt.kernels import schedule

    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    compiled, real = [], schedule.compile

    def counted(model, *args, **kwargs):
        compiled.append(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(schedule, "compile", counted)
    monkeypatch.setattr(schedule, "compare_frames", lambda frames, target, rounds: {
        name: [id(c) for c in models.values()] for name, (models, _) in frames.items()})
    a, b = (kernels.FrameModel(workloads[n], "torch") for n in "ab")
    payload = pickle.dumps(({"ab": ({"a": a, "b": b}, "sequential"), "a": ({"a": a}, "sequential"),
                             "b": ({"b": b}, "sequential")}, Target(threads=1), 1, None))
    job, out = tmp_path / "job.pickle", tmp_path / "out.pickle"
    job.write_bytes(pickle.dumps((list(sys.path), (), payload)))
    schedule._compare_job(str(job), str(out))
    ids = pickle.loads(out.read_bytes())
    assert len(compiled) == 2 and ids["ab"] == ids["a"] + ids["b"]


class _Staged:
    """A compiled model whose ``run`` (host inputs copied in, outputs copied out) costs more than its inference on
    inputs already on the device, as a GPU model's does."""

    backend, param_bytes = "staged", 0

    def __init__(self, inference_s: float, run_s: float):
        self.inference_s, self.run_s = inference_s, run_s

    def inference(self):
        import time

        return lambda: time.sleep(self.inference_s)

    def run(self, *inputs):
        import time

        time.sleep(self.run_s)
        return []


def test_a_frame_times_what_its_models_own_figures_time(monkeypatch, tmp_path):
    """Side by side, a frame chains its models' inferences, not their full runs: a full run adds its host copies,
    which on a GPU can cost as much as the inference itself."""
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    frames = {s: ({"a": _Staged(0.002, 0.02), "b": _Staged(0.002, 0.02)}, s) for s in kernels.SCHEDULES}
    out = kernels.compare_frames(frames, Target(threads=2), rounds=1, protocol=QUICK)
    assert 3.5 < out["sequential"].median_ms < 15
    assert 1.5 < out["parallel"].median_ms < 15


def test_an_untuned_figure_on_a_gpu_replays_the_graph_the_trial_runs(workloads, monkeypatch):
    """A GPU search timed its reference replayed as a CUDA graph (0.18 ms on an H100) and its scaled and merged probes
    on eager torch (1.4-2.6 ms): the knobs looked 8-14x slower than the reference and were never proposed. The quick
    figure is taken on the variant the target names, and ``auto`` on a GPU takes the graph replay (no CUDA here: the
    backends are made to serve it)."""
    from qaopt.kernels.torch_backends import TorchBackend

    monkeypatch.setattr(TorchBackend, "unavailable_reason", lambda self, target: None)
    plain = Workload(workloads["a"].model, workloads["a"].example_inputs,
                     runnable_on=("torch", "torch-compile", "onnxruntime"))
    graph = BackendRef("torch", "cuda_graph")
    assert kernels.untuned_backends(plain, Target(device="cuda", backend="torch[cuda_graph]")) == (graph,)
    assert kernels.untuned_backends(plain, Target(device="cuda", backend="auto")) == (graph,)
    assert kernels.untuned_backends(plain, Target(device="cpu", backend="torch[channels_last]")) == (
        BackendRef("torch", "channels_last"),)  # a pinned backend's own variant where no quick one serves
