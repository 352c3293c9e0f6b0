"""TVM's CUDA target: it builds CUDA kernels anywhere (CI has no GPU), and on a GPU it runs, is timed, tunes with
MetaSchedule and exports a library that reloads with the same outputs.

The GPU tests are skipped where TVM cannot run CUDA kernels (:func:`cuda_unavailable_reason`); they run on the
GPU machine (docs/BENCHMARKS.md, "TVM's CUDA target").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qaopt import kernels
from qaopt.kernels import Protocol, Target, TuningBudget, backends_running, tvm_build

tvm = pytest.importorskip("tvm")

from qaopt.kernels.tvm_backend import cuda_unavailable_reason  # noqa: E402 - after the skip: it imports tvm

X = np.random.default_rng(0).random((1, 3, 24, 32), dtype=np.float32)
QUICK = Protocol(warmup=3, repeats=5, min_sample_ms=1.0, max_seconds=5.0)
H100 = {"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": 49152, "max_threads_per_block": 1024,
        "thread_warp_size": 32, "registers_per_block": 65536, "l2_cache_size_bytes": 52428800}


def _convnet() -> torch.nn.Module:
    torch.manual_seed(0)  # batch norm (folded at import), stride, a 1x1 convolution, a pooled head
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16),
                               torch.nn.ReLU(), torch.nn.Conv2d(16, 24, 1), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(24, 2)).eval()


def _kinds(module) -> set[str]:
    kinds = {module.kind}
    for imported in module.imports:
        kinds |= _kinds(imported)
    return kinds


def test_tvm_declares_gpu_dtypes_on_cuda_and_integer_kernels_on_cpus():
    assert "tvm" in backends_running("fp16", "cuda") and "tvm" in backends_running("fp32", "cuda")
    assert "tvm" not in backends_running("int8", "cuda") and "tvm" not in backends_running("bf16", "cuda")
    assert "tvm" in backends_running("int8", "cpu") and "tvm" not in backends_running("fp16", "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_cuda_build_compiles_its_kernels_without_a_gpu(dtype, monkeypatch):
    """Import, GPU schedules (dlight), CUDA graph rewriting and CUDA code generation need no GPU: a build error
    on the GPU machine is then a real one, not this machine's."""
    monkeypatch.setattr(tvm_build, "cuda_target", lambda: H100)
    target = Target(device="cuda", backend="tvm", threads=1)
    prepared = tvm_build.prepare(_convnet().to(dtype), [X], target)
    assert str(prepared.target.kind.name) == "cuda" and prepared.target.attrs["arch"] == "sm_90"
    # An fp16 NN reads the application's fp32 frame and computes in fp16 (weights and convolutions).
    assert prepared.input_dtypes == ("float32",)
    assert ('"float16"' in prepared.mod.script()) == (dtype == torch.float16)
    executable = tvm_build.build(prepared)
    assert "cuda" in _kinds(executable.mod)


_NO_GPU = "torch sees no CUDA GPU" if not torch.cuda.is_available() else cuda_unavailable_reason()
gpu = pytest.mark.skipif(_NO_GPU is not None, reason=f"TVM cannot run CUDA kernels here: {_NO_GPU}")


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_each_gpu_dtype_compiles_runs_is_timed_and_exports(dtype, tmp_path):
    from tvm import relax

    model = _convnet()
    expected = model(torch.from_numpy(X)).detach().numpy()
    compiled = kernels.compile(model.to(dtype), [X], Target(device="cuda", backend="tvm", threads=1))
    assert compiled.backend == "tvm" and str(compiled.device).startswith("cuda")
    out = compiled.run(X)[0]
    tolerance = 1e-3 if dtype == torch.float32 else 3e-2
    np.testing.assert_allclose(out.astype(np.float32), expected, atol=tolerance)
    m = compiled.measure(QUICK)
    assert m.device == "cuda" and 0 < m.median_ms < 50 and m.peak_mem_bytes is None
    library = compiled.export(tmp_path / "nn")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cuda(0))
    reloaded = tvm_build.flatten(vm["main"](tvm.runtime.tensor(X, tvm.cuda(0))))
    np.testing.assert_array_equal(reloaded[0], out)


@gpu
def test_metaschedule_tunes_on_the_gpu_and_keeps_the_faster_build(tmp_path):
    backend = kernels.get_backend("tvm", cache_dir=tmp_path)
    target = Target(device="cuda", backend="tvm", threads=1, tuning=TuningBudget(trials=32))
    compiled = backend.compile(_convnet(), [X], target)
    report = compiled.tuning
    assert report.tasks > 0 and report.trials > 0 and report.rounds
    assert report.chosen == ("tuned" if min(r.latency_ms for r in report.rounds) < report.untuned_ms else "untuned")
    np.testing.assert_allclose(compiled.run(X)[0], _convnet()(torch.from_numpy(X)).detach().numpy(), atol=1e-3)
    again = backend.compile(_convnet(), [X], target)  # the shared database now knows every task
    assert again.tuning.hits == again.tuning.tasks
