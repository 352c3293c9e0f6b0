"""TVM's integer path for int8 QDQ graphs: the rewrite keeps the graph's numbers, packs weights for VNNI, leaves
what it does not recognize in float, and the VNNI intrinsic it tensorizes with compiles and computes right."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qaopt import kernels
from qaopt.approx.quantize import quantize_int8
from qaopt.kernels import Target, TuningBudget
from qaopt.kernels import tvm_int8
from qaopt.kernels.target import host_cpu_info
from qaopt.kernels.tvm_build import prepare

X = np.random.default_rng(0).random((1, 3, 20, 24), dtype=np.float32)


def _quantized(tmp_path, net: torch.nn.Module):
    calibration = np.random.default_rng(1).random((8, *X.shape[1:]), dtype=np.float32)
    return quantize_int8(net.eval(), torch.from_numpy(X), calibration, tmp_path / "int8.onnx", "net", kernels.onnx)


def _convnet() -> torch.nn.Module:
    torch.manual_seed(0)  # stride, padding, a 1x1 convolution, channel counts that are not multiples of 4 or 16
    return torch.nn.Sequential(torch.nn.Conv2d(3, 20, 3, stride=2, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(20, 8, 1), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 16, (3, 5), padding=(1, 2)), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(16, 3))


def test_pack_weight_places_each_weight_where_the_intrinsic_reads_it():
    w = np.random.default_rng(0).integers(-128, 128, (20, 6, 3, 2), dtype=np.int8)
    packed = tvm_int8._pack_weight(w)
    assert packed.shape == (2, 2, 3, 2, 16, 4)
    o, i, y, x = np.meshgrid(*(np.arange(n) for n in w.shape), indexing="ij")
    np.testing.assert_array_equal(packed[o // 16, i // 4, y, x, o % 16, i % 4], w)
    assert not packed[1, :, :, :, 4:].any() and not packed[:, 1, :, :, :, 2:].any()  # padding adds nothing


def test_every_quantized_convolution_becomes_integer_and_the_output_matches_onnxruntime(tmp_path):
    path = _quantized(tmp_path, _convnet())
    assert prepare(path, [X], Target(threads=1)).integer_convolutions == 3
    tvm = kernels.compile(path, [X], Target(threads=1, backend="tvm")).run(X)[0]
    ort = kernels.compile(path, [X], Target(threads=1, backend="onnxruntime")).run(X)[0]
    step = np.abs(ort).max() / 50  # a few quantization steps of the output, not float-level agreement
    np.testing.assert_allclose(tvm, ort, atol=step)


def test_a_convolution_it_does_not_recognize_stays_float_and_correct(tmp_path):
    torch.manual_seed(0)
    depthwise = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1, groups=3), torch.nn.AdaptiveAvgPool2d(1),
                                    torch.nn.Flatten(), torch.nn.Linear(6, 2))
    path = _quantized(tmp_path, depthwise)
    assert prepare(path, [X], Target(threads=1)).integer_convolutions == 0
    tvm = kernels.compile(path, [X], Target(threads=1, backend="tvm")).run(X)[0]
    # The reference is the QDQ graph as written, each node on its own (no fusion into integer kernels): ONNX
    # Runtime's fused int8 kernels differ by ~8 % on a CPU without VNNI (AVX2's 16-bit saturating multiply-add).
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    exact = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(
        None, {kernels.INPUT_NAME: X})[0]
    np.testing.assert_allclose(tvm, exact, atol=np.abs(exact).max() / 50)


def test_float_models_are_not_touched(tmp_path):
    net = _convnet()
    assert prepare(net, [X], Target(threads=1)).integer_convolutions == 0


@pytest.mark.skipif("avx512_vnni" not in host_cpu_info().flags, reason="needs a CPU with AVX-512 VNNI")
def test_vnni_intrinsic_compiles_and_computes_the_integer_convolution():
    """Tensorize the integer convolution by hand with the (repaired) intrinsic and check it against numpy."""
    import tvm
    from tvm import te

    tvm_int8.load_tensor_intrinsics()
    rng = np.random.default_rng(0)
    x = te.placeholder((1, 8, 6, 6), "uint8", "x")
    w = rng.integers(-128, 128, (32, 8, 3, 3), dtype=np.int8)
    packed_w = te.placeholder(tvm_int8._pack_weight(w).shape, "int8", "w")
    offset, multiplier = te.placeholder((32,), "float32", "c"), te.placeholder((32,), "float32", "m")
    out = tvm_int8._integer_conv(x, packed_w, offset, multiplier, strides=(1, 1), padding=(1, 1, 1, 1),
                                 x_zero=7, out_zero=0, relu=False)
    acc = out.op.input_tensors[0]
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, packed_w, offset, multiplier, acc]))
    block = sch.get_sblock(tvm_int8.CONV_BLOCK)
    n, o, y, z, oi, rc, ry, rx, ri = sch.get_loops(block)
    sch.reorder(n, o, y, z, rc, ry, rx, oi, ri)
    sch.decompose_reduction(block, rc)
    sch.tensorize(oi, tvm_int8.VNNI_INTRIN)
    lib = tvm.compile(sch.mod, tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"}))
    assert "vpdpbusd" in lib.mod.inspect_source("asm")

    xs = rng.integers(0, 256, (1, 8, 6, 6), dtype=np.uint8)
    result = tvm.runtime.tensor(np.zeros((1, 2, 6, 6, 16), dtype=np.int32))
    args = [tvm.runtime.tensor(a) for a in (xs, tvm_int8._pack_weight(w), np.zeros(32, np.float32),
                                            np.ones(32, np.float32))]
    lib["main"](*args, result)
    padded = np.pad(xs[0].astype(np.int64), ((0, 0), (1, 1), (1, 1)), constant_values=7)
    expected = np.zeros((32, 6, 6), dtype=np.int64)
    for dy in range(3):
        for dx in range(3):
            expected += np.einsum("oi,iyx->oyx", w[:, :, dy, dx].astype(np.int64), padded[:, dy:dy + 6, dx:dx + 6])
    got = result.numpy()[0].transpose(0, 3, 1, 2).reshape(32, 6, 6)
    np.testing.assert_array_equal(got, expected)


def test_an_int8_graph_tunes_end_to_end_and_its_packed_weights_keep_their_layout(tmp_path):
    """MetaSchedule's layout rewrite of the packed weights once ended every int8 tuning run (TVM's ArgInfo check)."""
    import tvm

    path = _quantized(tmp_path, _convnet())
    prepared = prepare(path, [X], Target(threads=1))
    for gv, func in prepared.mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and tvm_int8._has_block(func, tvm_int8.CONV_BLOCK):
            assert "layout_free_buffers" not in (func.attrs or {}), gv.name_hint
    compiled = kernels.compile(path, [X], Target(threads=1, backend="tvm", tuning=TuningBudget(trials=16)),
                               cache_dir=tmp_path / "cache")
    assert compiled.tuning.trials > 0 and compiled.tuning.rounds
    ort = kernels.compile(path, [X], Target(threads=1, backend="onnxruntime")).run(X)[0]
    np.testing.assert_allclose(compiled.run(X)[0], ort, atol=np.abs(ort).max() / 50)


def test_a_database_whose_records_tensorize_registers_the_intrinsics_before_loading(tmp_path, monkeypatch):
    """A fresh process once failed to load a database holding int8 records ("TensorIntrin ... is not registered")."""
    from tvm.s_tir import meta_schedule as ms

    from qaopt.kernels import tuning

    events: list[str] = []
    monkeypatch.setattr(tuning, "load_tensor_intrinsics", lambda: events.append("intrinsics"))
    monkeypatch.setattr(ms.database, "JSONDatabase", lambda work_dir: events.append("load"))
    database = tuning.TuningDatabase(tmp_path / "db", target=None)
    records = database.path / "database_tuning_record.json"
    database.open()  # no records yet
    records.write_text('[0, [[[["GetSBlock", [], ["conv", "main"], ["b0"]]]]]]\n')
    database.open()  # records that do not tensorize: the 10-20 s of parsing are not paid
    records.write_text('[0, [[[["Tensorize", ["b0"], ["dot_16x4_vnni", 1]]]]]]\n')
    database.open()
    assert events == ["load", "load", "intrinsics", "load"]
