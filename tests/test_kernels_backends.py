"""Backends behind one protocol: same outputs as eager torch, measurements, exports, clear errors."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from qaopt import kernels
from qaopt.kernels import Protocol, Target

QUICK = Protocol(warmup=2, repeats=5, min_sample_ms=2.0, max_seconds=5.0)
HAS_TVM = importlib.util.find_spec("tvm") is not None
needs_tvm = pytest.mark.skipif(not HAS_TVM, reason="TVM is not installed here (the extra qaopt[tvm])")
"""TVM is an extra: a machine without it (the GPU host's plain install) runs the other backends' tests."""


class TinyNet(torch.nn.Module):
    """conv-BN-ReLU, strided conv, GAP, FC: the shape of a NavNet, small enough for tests."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(width)
        self.c2 = torch.nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(2 * width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.c1(x)))
        x = torch.relu(self.c2(x))
        return self.fc(x.mean((2, 3)))


class Bessel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.bessel_j0(x)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = TinyNet().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    x = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        return model, x, model(x).numpy()


@pytest.mark.parametrize("name", ["torch", "torch[channels_last]", "torch-compile", "onnxruntime",
                                  pytest.param("tvm", marks=needs_tvm)])
def test_backend_matches_eager_and_measures(tiny, name, tmp_path):
    model, x, ref = tiny
    compiled = kernels.get_backend(name, cache_dir=tmp_path).compile(model, [x], Target(threads=1))
    np.testing.assert_allclose(compiled.run()[0], ref, rtol=1e-4, atol=1e-5)
    other = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        np.testing.assert_allclose(compiled.run(other.numpy())[0], model(other).numpy(), rtol=1e-4, atol=1e-5)
    m = compiled.measure(QUICK)
    assert m.backend == name and m.device == "cpu" and m.threads == 1
    assert 2 <= len(m.samples_ms) <= 5 and min(m.samples_ms) <= m.median_ms <= max(m.samples_ms)
    assert m.spread_ms >= 0 and m.number >= 1
    assert m.peak_mem_bytes is not None and m.peak_mem_bytes >= model.c2.weight.numel() * 4  # BN may be folded
    assert (m.energy_mj is None) == m.energy_note.startswith("unavailable")


@needs_tvm
def test_exports_are_loadable(tiny, tmp_path):
    import onnxruntime as ort
    import tvm
    from tvm import relax

    model, x, ref = tiny
    onnx_path = kernels.get_backend("onnxruntime").compile(model, [x], Target(threads=1)).export(tmp_path / "m")
    out = ort.InferenceSession(str(onnx_path)).run(None, {"input": x.numpy()})[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)

    so = kernels.get_backend("tvm", cache_dir=tmp_path).compile(model, [x], Target(threads=1)).export(tmp_path / "m")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(so)), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x.numpy()))[0].numpy(), ref, rtol=1e-4, atol=1e-5)

    pt2 = kernels.get_backend("torch").compile(model, [x], Target(threads=1)).export(tmp_path / "m")
    with torch.no_grad():
        np.testing.assert_allclose(torch.export.load(pt2).module()(x).numpy(), ref, rtol=1e-5, atol=1e-6)


@needs_tvm
def test_cross_compiled_export_holds_aarch64_objects(tiny, tmp_path):
    import tarfile

    from qaopt.kernels.tvm_backend import TvmBackend
    from qaopt.kernels.tvm_build import build, export_library, prepare

    model, x, _ = tiny
    target = Target(mtriple="aarch64-linux-gnu", mcpu="cortex-a72", threads=4)
    prepared = prepare(model, [x], target)
    assert str(prepared.target.attrs["mtriple"]) == "aarch64-linux-gnu"
    path = export_library(build(prepared), tmp_path / "pi4", target)
    assert path.suffix == ".tar"
    with tarfile.open(path) as tar:
        objects = [tar.extractfile(m).read(20) for m in tar.getmembers() if m.name.endswith(".o")]
    assert objects and all(o[:4] == b"\x7fELF" and int.from_bytes(o[18:20], "little") == 183 for o in objects)  # EM_AARCH64
    assert TvmBackend().unavailable_reason(target) is None


@needs_tvm
def test_int8_qdq_onnx_runs_on_onnxruntime_and_tvm(tiny, tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    model, x, ref = tiny
    fp32 = kernels.export_onnx(model, [x], tmp_path / "fp32.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"input": torch.rand(1, 3, 32, 32).numpy()} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    int8 = tmp_path / "int8.onnx"
    quantize_static(str(fp32), str(int8), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    for name in ("onnxruntime", "tvm"):
        out = kernels.get_backend(name, cache_dir=tmp_path).compile(int8, [x], Target(threads=1)).run()[0]
        assert np.abs(out - ref).max() < 0.1 * (np.abs(ref).max() + 0.1), name  # int8 error, not garbage


@pytest.mark.parametrize(("name", "operator"), [pytest.param("tvm", "special_bessel_j0", marks=needs_tvm),
                                                ("onnxruntime", "bessel_j0")])
def test_unsupported_operator_is_named_with_backend(tmp_path, name, operator):
    with pytest.raises(kernels.UnsupportedOperatorError) as err:
        kernels.get_backend(name, cache_dir=tmp_path).compile(Bessel(), [torch.rand(1, 8)], Target())
    assert operator in str(err.value) and f"'{name}'" in str(err.value)
    assert err.value.backend == name


def test_onnxruntime_names_an_operator_without_kernel(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Conv", ["x", "w"], ["y"])
    # A valid graph (float64 Conv) for which ONNX Runtime's CPU provider has no kernel.
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
                              [helper.make_tensor("w", TensorProto.DOUBLE, [1, 1, 1, 1], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "f64_conv.onnx"
    onnx.save(model, str(path))
    with pytest.raises(kernels.UnsupportedOperatorError) as err:
        kernels.get_backend("onnxruntime").compile(path, [np.zeros((1, 1, 4, 4))], Target())
    assert "Conv" in str(err.value) and "onnxruntime" in str(err.value)


def test_backends_refuse_what_they_cannot_run(tiny, tmp_path):
    model, x, _ = tiny
    with pytest.raises(kernels.UnsupportedModelError, match="'torch'.*onnxruntime"):
        kernels.get_backend("torch").compile(tmp_path / "m.onnx", [x], Target())
    with pytest.raises(kernels.UnsupportedModelError, match="bf16"):
        kernels.get_backend("onnxruntime").compile(TinyNet().to(torch.bfloat16), [x], Target())
    if HAS_TVM and not torch.cuda.is_available():  # TVM builds CUDA kernels, but runs them only where a GPU is
        assert "CUDA" in kernels.get_backend("tvm").unavailable_reason(Target(device="cuda"))
    with pytest.raises(kernels.BackendUnavailableError, match="no backend named 'tensorrt'"):
        kernels.get_backend("tensorrt")


def test_bf16_candidate_runs_on_torch(tiny):
    model, x, ref = tiny
    bf16 = TinyNet().eval()
    bf16.load_state_dict(model.state_dict())
    out = kernels.get_backend("torch").compile(bf16.to(torch.bfloat16), [x], Target(threads=1)).run()[0]
    assert out.dtype == np.float32 and np.abs(out - ref).max() < 0.05 * (np.abs(ref).max() + 0.1)


class _Crashing:
    """A backend whose compiled model dies while being measured."""

    name = "crashing"

    def unavailable_reason(self, target):
        return None

    def compile(self, model, example_inputs, target):
        compiled = kernels.get_backend("torch").compile(model, example_inputs, target)
        compiled.fn = lambda *a: (_ for _ in ()).throw(RuntimeError("segfault in vendor kernel"))
        return compiled


class _Slow:
    """A backend that runs the model correctly, 50 ms a call: far slower than any other."""

    name = "slow"

    def __init__(self):
        self.calls = 0

    def unavailable_reason(self, target):
        return None

    def compile(self, model, example_inputs, target):
        import time

        compiled = kernels.get_backend("torch").compile(model, example_inputs, target)
        fn = compiled.fn

        def slowly(*a):
            self.calls += 1
            time.sleep(0.05)
            return fn(*a)

        compiled.fn = slowly
        return compiled


class _FailingBuild:
    name = "failing"

    def unavailable_reason(self, target):
        return None

    def compile(self, model, example_inputs, target):
        raise kernels.BuildError("failing: LLVM ran out of registers")


@pytest.fixture
def broken_backends():
    """Two backends that fail to build, registered for one test only: later tests list what the registry holds."""
    kernels.register_backend("crashing", lambda **_: _Crashing())
    kernels.register_backend("failing", lambda **_: _FailingBuild())
    kernels.register_backend("slow", lambda **_: SLOW)
    yield
    kernels.unregister_backend("crashing")
    kernels.unregister_backend("failing")
    kernels.unregister_backend("slow")


SLOW = _Slow()


def test_auto_races_the_targets_backends_when_it_names_them(tiny):
    """``target.backends`` (the spec's list) replaces the device's default list; auto's own list wins over both."""
    model, x, _ = tiny
    listed = Target(threads=1, backends=("onnxruntime", "torch"))
    compiled = kernels.AutoBackend(protocol=QUICK).compile(model, [x], listed)
    assert [o.backend for o in compiled.outcomes] == ["onnxruntime", "torch"]
    own = kernels.AutoBackend(["torch"], protocol=QUICK).compile(model, [x], listed)
    assert [o.backend for o in own.outcomes] == ["torch"]


def test_auto_keeps_fastest_and_records_failures(tiny, tmp_path, monkeypatch, broken_backends):
    model, x, ref = tiny
    names = ["crashing", "torch", "failing", "onnxruntime"] + (["tvm"] if HAS_TVM else [])
    auto = kernels.AutoBackend(names, cache_dir=tmp_path, protocol=QUICK)
    compiled = auto.compile(model, [x], Target(threads=1))
    by = {o.backend: o for o in compiled.outcomes}
    assert "segfault in vendor kernel" in by["crashing"].error and by["crashing"].measurement is None
    assert "out of registers" in by["failing"].error
    measured = {n: o.measurement.median_ms for n, o in by.items() if o.measurement}
    # A working backend far slower than the fastest so far (untuned TVM on a loaded machine) may be abandoned.
    abandoned = {n for n, o in by.items() if o.measurement is None and "not measured further" in (o.error or "")}
    assert measured and set(measured) | abandoned == set(names) - {"crashing", "failing"}
    assert compiled.backend == min(measured, key=measured.get)
    np.testing.assert_allclose(compiled.run()[0], ref, rtol=1e-4, atol=1e-5)
    assert [r["backend"] for r in compiled.table()] == names

    # A resumed run reads the recorded outcomes instead of measuring again.
    calls = []
    monkeypatch.setattr(kernels.auto.AutoBackend, "_try", lambda *a, **k: calls.append(a) or (None, None))
    again = auto.compile(model, [x], Target(threads=1))
    assert calls == [] and again.backend == compiled.backend
    assert [o.to_dict() for o in again.outcomes] == [o.to_dict() for o in compiled.outcomes]


def test_auto_abandons_a_backend_far_slower_than_the_fastest_so_far(tiny, broken_backends):
    model, x, _ = tiny
    SLOW.calls = 0
    compiled = kernels.AutoBackend(["torch", "slow"], protocol=QUICK).compile(model, [x], Target(threads=1))
    by = {o.backend: o for o in compiled.outcomes}
    assert compiled.backend == "torch" and by["slow"].measurement is None
    assert "not measured further" in by["slow"].error and "ms per call after warm-up" in by["slow"].error
    assert SLOW.calls == QUICK.warmup  # one warm-up round, then left
    # First, with nothing faster measured yet, it is measured in full.
    SLOW.calls = 0
    first = kernels.AutoBackend(["slow", "torch"], protocol=QUICK).compile(model, [x], Target(threads=1))
    assert {o.backend: o for o in first.outcomes}["slow"].measurement is not None and SLOW.calls > QUICK.warmup


def test_auto_fails_clearly_when_nothing_runs(tiny, broken_backends):
    model, x, _ = tiny
    with pytest.raises(kernels.KernelsError, match="no backend could run the model: failing: failing: LLVM"):
        kernels.AutoBackend(["failing"]).compile(model, [x], Target())


def test_auto_measures_only_the_backends_that_run_the_dtype(tiny, monkeypatch):
    model, x, _ = tiny
    tried = []
    real_try = kernels.auto.AutoBackend._try
    monkeypatch.setattr(kernels.auto.AutoBackend, "_try", lambda self, name, *a: tried.append(name) or real_try(self, name, *a))
    compiled = kernels.compile(model, [x], Target(backend="auto", threads=1), runnable_on=("onnxruntime",))
    assert tried == ["onnxruntime"] and compiled.backend == "onnxruntime"
    with pytest.raises(kernels.KernelsError, match="none of the backends .* can run this model .*runs on fp8-engine"):
        kernels.compile(model, [x], Target(backend="auto", threads=1), runnable_on=("fp8-engine",))


def test_torch_compile_without_a_cxx_compiler_says_what_to_install(monkeypatch):
    from qaopt.kernels import torch_backends

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(torch_backends.shutil, "which", lambda name: None)
    reason = kernels.get_backend("torch-compile").unavailable_reason(Target())
    assert "no compiler" in reason and "g++" in reason and "'onnxruntime'" in reason
    assert kernels.get_backend("torch-compile").unavailable_reason(Target(device="rpc", rpc=kernels.RPCConfig(port=9190))) is not None


def test_auto_recomputes_a_torn_or_stale_outcomes_file(tiny, tmp_path, monkeypatch):
    import json

    model, x, _ = tiny
    auto = kernels.AutoBackend(["torch", "onnxruntime"], cache_dir=tmp_path, protocol=QUICK)
    first = auto.compile(model, [x], Target(threads=1))
    (cache,) = (tmp_path / "kernels" / "outcomes").glob("*.json")
    assert json.loads(cache.read_text())["artifact"] == "kernels-outcomes"  # written through the versioned store
    assert not list(cache.parent.glob(".*.tmp"))
    tried = []
    real_try = kernels.auto.AutoBackend._try
    monkeypatch.setattr(kernels.auto.AutoBackend, "_try", lambda self, ref, *a: tried.append(ref) or real_try(self, ref, *a))
    for broken in (cache.read_text()[:40], json.dumps([o.to_dict() for o in first.outcomes])):  # torn; old format
        cache.write_text(broken)
        tried.clear()
        again = auto.compile(model, [x], Target(threads=1))
        assert tried == ["torch", "onnxruntime"] and [o.backend for o in again.outcomes] == ["torch", "onnxruntime"]


class Centred(torch.nn.Module):
    """Subtracts a buffer from its input, as a normalizing NN does: the op that met two devices on the GPU target."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.register_buffer("mean", torch.zeros(1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x - self.mean)


def test_export_traces_a_module_with_inputs_on_its_own_device():
    # On a CUDA target the compiled module sits on the GPU while the example inputs are numpy (the CPU): torch.export
    # then failed with "found two different devices cpu, cuda:0". The meta device reproduces that on a CPU machine.
    from qaopt.kernels.torch_backends import _exporter

    module = Centred().eval().to("meta")
    program = _exporter(module, [np.zeros((1, 3, 8, 8), np.float32)])()
    [traced] = [n.meta["val"] for n in program.graph.nodes if n.name in program.graph_signature.user_inputs]
    assert traced.device.type == "meta" and tuple(traced.shape) == (1, 3, 8, 8)


def test_compiling_for_another_device_or_layout_leaves_the_callers_module_alone(tiny):
    # nn.Module.to moves in place: a candidate compiled for the GPU (or NHWC) must stay as it was for export and
    # validation, which read it after the measurement.
    model, x, _ = tiny
    before = model.c1.weight.data_ptr()
    kernels.compile(model, [x], Target(threads=1, backend="torch[channels_last]"))
    assert model.c1.weight.data_ptr() == before and model.c1.weight.is_contiguous()
    assert model.c1.weight.device.type == "cpu"


def test_cuda_graphs_are_a_gpu_mode_and_say_so_on_a_cpu():
    reason = kernels.get_backend("torch-compile[reduce-overhead]").unavailable_reason(Target())
    assert "CUDA graphs" in reason and "cuda" in reason
    assert "CUDA graph" in kernels.get_backend("torch[cuda_graph]").unavailable_reason(Target())
    assert kernels.get_backend("torch-compile[max-autotune]").name == "torch-compile[max-autotune]"


def test_a_device_timer_gives_the_samples():
    class ScriptedTimer:  # a device that reports 3 ms for every sample, whatever the host's clock says
        def start(self) -> None:
            pass

        def stop(self) -> float:
            return 3.0

    m = kernels.measure_callable(lambda: None, backend="test", device="cpu", device_key="test-timer", threads=1,
                                 param_bytes=0, protocol=QUICK, timer=ScriptedTimer())
    assert m.median_ms == pytest.approx(3.0 / m.number)


def test_compiling_keeps_inductors_tf32_advice_off_the_console():
    """A fresh process (the side-by-side stage's) compiling fp32 NNs on a GPU printed Inductor's TF32 advice between
    the run's console lines; qaopt leaves TF32 off on purpose, so the advice is not the user's to act on."""
    import warnings

    from qaopt.kernels.torch_backends import _quiet_compile

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with _quiet_compile():
            warnings.warn("TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled.",
                          UserWarning, stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else"]


@needs_tvm
def test_running_a_tvm_model_leaves_the_calling_thread_on_its_cores(tiny, tmp_path):
    """TVM's pool bound the thread that ran a module to one core, natively and for good, and every later measurement
    of that thread ran its threads there; qaopt turns the binding off (it pins threads itself while measuring)."""
    import os

    model, x, _ = tiny
    cores = os.sched_getaffinity(0)
    compiled = kernels.get_backend("tvm", cache_dir=tmp_path).compile(model, [x], Target(threads=len(cores)))
    compiled.measure(QUICK)
    compiled.run(x.numpy())
    assert os.sched_getaffinity(0) == cores
