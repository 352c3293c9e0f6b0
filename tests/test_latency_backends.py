"""OpenVINO beside the other backends; a backend that is not installed is skipped by auto and named by the spec's
``target.backend`` with the install hint; records are keyed by the machine."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from qaopt import kernels
from qaopt.kernels import AutoBackend, BackendUnavailableError, Protocol, Target
from qaopt.kernels.errors import UnsupportedModelError
from qaopt.kernels.tuning import TuningDatabase

QUICK = Protocol(warmup=1, repeats=3, min_sample_ms=1.0, retries=0)


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(8, 2)).eval()


X = np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)


def test_openvino_compiles_runs_and_matches_torch(tmp_path):
    pytest.importorskip("openvino")
    net = _net()
    compiled = kernels.compile(net, [X], Target(threads=1, backend="openvino"))
    with torch.no_grad():
        expected = net(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(compiled.run(X)[0], expected, rtol=1e-4, atol=1e-5)
    assert compiled.precision == "f32"  # fp32 stays fp32 on bf16-capable CPUs too
    assert compiled.measure(QUICK).median_ms > 0
    assert compiled.export(tmp_path / "net").with_suffix(".bin").exists()


def test_openvino_reads_frames_in_place_and_returns_outputs_of_their_own():
    """The frame is handed over without a copy (what the latency measures), yet each run's outputs stay its own."""
    pytest.importorskip("openvino")
    net = _net()
    compiled = kernels.compile(net, [X], Target(threads=1, backend="openvino"))
    other = np.ascontiguousarray(X[..., ::-1])
    first, second = compiled.run(X)[0], compiled.run(other)[0]
    with torch.no_grad():
        np.testing.assert_allclose(first, net(torch.from_numpy(X)).numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(second, net(torch.from_numpy(other)).numpy(), rtol=1e-4, atol=1e-5)
    assert not np.shares_memory(first, second)
    frame = X.copy()
    compiled.run(frame)
    assert np.shares_memory(compiled.request.get_input_tensor(0).data, frame)  # in place: no copy per inference


def test_openvino_runs_the_int8_qdq_graph_like_onnxruntime(tmp_path):
    pytest.importorskip("openvino")
    from qaopt.approx.quantize import quantize_int8

    path = quantize_int8(_net(), torch.from_numpy(X), np.random.default_rng(1).random((8, 3, 16, 16), dtype=np.float32),
                         tmp_path / "int8.onnx", "net", kernels.onnx)
    ov = kernels.compile(path, [X], Target(threads=1, backend="openvino")).run(X)[0]
    ort = kernels.compile(path, [X], Target(threads=1, backend="onnxruntime")).run(X)[0]
    np.testing.assert_allclose(ov, ort, atol=0.05)


def test_openvino_bf16_runs_under_its_precision_hint_or_says_why_not():
    pytest.importorskip("openvino")
    import openvino

    net = _net().to(torch.bfloat16)
    if "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        compiled = kernels.compile(net, [X], Target(threads=1, backend="openvino"))
        assert compiled.precision == "bf16" and np.isfinite(compiled.run(X)[0]).all()
    else:
        with pytest.raises(UnsupportedModelError, match="no bf16 instructions"):
            kernels.compile(net, [X], Target(threads=1, backend="openvino"))


def test_a_missing_backend_named_in_the_spec_is_a_clear_error_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now raises ImportError
    with pytest.raises(BackendUnavailableError) as err:
        kernels.compile(_net(), [X], Target.from_spec({"backend": "openvino", "threads": 1}))
    assert "target.backend" in str(err.value) and "pip install 'qaopt[openvino]'" in str(err.value)


def test_auto_skips_a_missing_backend_and_records_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)
    compiled = AutoBackend(backends=["onnxruntime", "openvino"], protocol=QUICK).compile(_net(), [X], Target(threads=1))
    outcomes = {o.backend: o for o in compiled.outcomes}
    assert compiled.backend == "onnxruntime"
    assert outcomes["openvino"].measurement is None
    assert "not installed" in outcomes["openvino"].error and "qaopt[openvino]" in outcomes["openvino"].error


def test_auto_measures_openvino_by_default_on_cpu():
    assert "openvino" in [str(r) for r in kernels.auto.CPU_BACKENDS]


def test_auto_races_tvm_on_cpu_only_where_the_target_tunes_or_the_spec_lists_it(monkeypatch):
    """Untuned, TVM's default schedules ran CropFollow's NNs 70x slower than ONNX Runtime: the device's own list
    leaves TVM out then, and the outcomes say so; a tuning budget, or a spec that names it, races it."""
    from qaopt.kernels.auto import raced
    from qaopt.kernels.target import TuningBudget

    untuned, tuned = Target(threads=1), Target(threads=1, tuning=TuningBudget(trials=8))
    assert "tvm" not in [r.name for r in raced(untuned)] and "openvino" in [r.name for r in raced(untuned)]
    assert "tvm" in [r.name for r in raced(tuned)]
    assert [r.name for r in raced(Target(threads=1, backends=(kernels.BackendRef("tvm"),)))] == ["tvm"]
    monkeypatch.setitem(kernels.auto.DEVICE_BACKENDS, "cpu", (kernels.BackendRef("onnxruntime"),
                                                             kernels.BackendRef("tvm")))
    outcomes = {o.backend: o for o in AutoBackend(protocol=QUICK).compile(_net(), [X], untuned).outcomes}
    assert outcomes["onnxruntime"].measurement is not None
    assert outcomes["tvm"].measurement is None and outcomes["tvm"].error.startswith("not raced: the target tunes no")


def test_measurement_records_are_keyed_by_the_machine(monkeypatch, tmp_path):
    auto = AutoBackend(backends=["onnxruntime"], cache_dir=tmp_path, protocol=QUICK)
    here = auto._cache_file(_net(), [X], Target(threads=1), auto._refs(Target(threads=1)))
    monkeypatch.setattr(Target, "machine_key", lambda self: {"model": "another CPU", "isa": ["avx2"], "threads": 1})
    elsewhere = auto._cache_file(_net(), [X], Target(threads=1), auto._refs(Target(threads=1)))
    assert here != elsewhere


def test_tuning_databases_are_keyed_by_the_machine(tmp_path):
    one = TuningDatabase.for_target("llvm -mcpu=znver5", tmp_path, machine={"model": "AMD EPYC", "isa": ["avx512f"]})
    other = TuningDatabase.for_target("llvm -mcpu=znver5", tmp_path, machine={"model": "Intel Xeon", "isa": ["avx512f"]})
    assert one.path != other.path


def test_the_machine_key_names_the_cpu_its_features_and_threads():
    key = Target(threads=2).machine_key()
    assert key["model"] and key["threads"] == 2 and isinstance(key["isa"], list)
    assert kernels.backend_version("onnxruntime").startswith("onnxruntime==")


def test_a_missing_tvm_is_one_line_naming_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tvm", None)  # as on an install without qaopt[tvm]
    compiled = AutoBackend(backends=["onnxruntime", "tvm"], protocol=QUICK).compile(_net(), [X], Target(threads=1))
    outcomes = {o.backend: o for o in compiled.outcomes}
    assert compiled.backend == "onnxruntime"
    assert outcomes["tvm"].error == "unavailable: tvm is not installed; install it with: pip install 'qaopt[tvm]'"
