"""TVM's integer path for int8 QDQ graphs: integer convolutions that MetaSchedule tensorizes with VNNI.

Relax's ONNX frontend imports a static QDQ graph as ``quantize``/``dequantize``
around *float* convolutions, and Relax has no pass that folds them back into
integer arithmetic (Relay's QNN canonicalization did). Tuning such a graph only
makes a float emulation faster. :func:`integer_convolutions` is that pass for the
layer shape ONNX Runtime's quantizer writes::

    quantize(relu?(conv2d(dequantize(x_u8), dequantize(W_i8)) + dequantize(b_i32)))

Each match becomes one TIR function that reads the uint8 activations and writes
the uint8 result, as ONNX Runtime's ``QLinearConv`` does:

* the input padded with its zero point (so padding dequantizes to 0.0, as in the
  float graph) and packed channels-last in groups of 4 (``NCHW4c``);
* an ``int32`` convolution of uint8 x int8 whose innermost loops (16 output
  channels x 4 input channels, the weights packed ``OIHW16o4i`` at compile time)
  are the shape of x86's ``vpdpbusd``: MetaSchedule's ``MultiLevelTilingWithIntrin``
  rule tensorizes them on CPUs with AVX-512 VNNI;
* a requantizing epilogue, ``round((acc + c[o]) * m[o]) + z_out`` clipped to
  uint8, where ``c`` folds the bias and the input zero point's correction
  (``-z_x * sum(W[o])``) and ``m = s_x * s_w[o] / s_out``.

Convolutions of other shapes (grouped, dilated, another layout, a non-constant
weight, a result used in float) keep the float form: the pass changes nothing it
does not recognize.
"""

from __future__ import annotations

import inspect
import linecache
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

VNNI_INTRIN = "dot_16x4_vnni"
"""The tensor intrinsic MetaSchedule's x86 rules tensorize with on VNNI CPUs (``ScheduleRule::DefaultX86``)."""
CONV_BLOCK = "conv2d_int8"
OC_BLOCK, IC_BLOCK = 16, 4
"""The intrinsic's shape: 16 int32 accumulators, each a dot product of 4 uint8 x int8 pairs."""


@dataclass(frozen=True)
class _Layer:
    """One matched quantized convolution, with its weights already packed for the intrinsic."""

    x: Any  # relax.Var: the uint8 input
    weight: np.ndarray  # int8, (OCp/16, ICp/4, KH, KW, 16, 4)
    offset: np.ndarray  # float32 (OC,): bias and zero-point correction, in accumulator units
    multiplier: np.ndarray  # float32 (OC,): s_x * s_w / s_out
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, left, bottom, right
    x_zero: int
    out_zero: int
    relu: bool


def integer_convolutions(mod: Any) -> tuple[Any, int]:
    """Rewrite every quantized convolution of ``mod``'s Relax functions into an integer one.

    Returns the new module and how many convolutions became integer.
    """
    from tvm import relax

    rewriter = _make_rewriter(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    # The float convolutions and dequantized weights the rewrite left unused; prepare canonicalizes after.
    return relax.transform.DeadCodeElimination()(rewriter.builder_.get()), rewriter.count


def _make_rewriter(mod: Any) -> Any:
    from tvm import relax
    from tvm.relax import PyExprMutator, expr_functor

    @expr_functor.mutator
    class Rewriter(PyExprMutator):  # type: ignore[misc]
        def __init__(self, mod: Any):
            super().__init__(mod)
            self.count = 0
            self.bindings: dict[Any, Any] = {}
            for func in mod.functions.values():
                if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                    for block in func.body.blocks:
                        self.bindings.update((b.var, b.value) for b in block.bindings if isinstance(b, relax.VarBinding))

        def visit_call_(self, call: Any) -> Any:
            layer = _match(call, self.bindings)
            if layer is None:
                return super().visit_call_(call)
            self.count += 1
            return self.builder_.call_te(
                _integer_conv, self.visit_expr(layer.x), relax.const(layer.weight), relax.const(layer.offset),
                relax.const(layer.multiplier), strides=layer.strides, padding=layer.padding,
                x_zero=layer.x_zero, out_zero=layer.out_zero, relu=layer.relu, primfunc_name_hint="qconv2d_int8")

    return Rewriter(mod)


def keep_packed_weights(mod: Any) -> Any:
    """Drop ``layout_free_buffers`` from the fused functions holding an integer convolution.

    Their weights are packed for the intrinsic already. Left marked, MetaSchedule's
    layout-rewrite postprocessor repacks them to its tiling, and TVM 0.27 then fails
    to read the tuned function's arguments back (``ArgInfo``: "Check failed:
    ind.as<PrimVar>()"), ending the whole tuning run.
    """
    import tvm

    for gv, func in list(mod.functions_items()):
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs and "layout_free_buffers" in func.attrs \
                and _has_block(func, CONV_BLOCK):
            mod[gv] = func.without_attr("layout_free_buffers")
    return mod


def _has_block(func: Any, name: str) -> bool:
    import tvm

    try:
        tvm.s_tir.Schedule(func).get_sblock(name)
    except Exception:  # the schedule raises when no block has that name
        return False
    return True


# --------------------------------------------------------------------------- matching


def _op(expr: Any, bindings: dict[Any, Any], name: str) -> Any:
    """The call of operator ``relax.<name>`` that ``expr`` is or is bound to, else None."""
    import tvm
    from tvm import relax

    value = bindings.get(expr, expr) if isinstance(expr, relax.Var) else expr
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == f"relax.{name}":
        return value
    return None


def _constant(expr: Any, bindings: dict[Any, Any]) -> np.ndarray | None:
    import tvm
    from tvm import relax

    value = bindings.get(expr, expr) if isinstance(expr, relax.Var) else expr
    return value.value.numpy() if isinstance(value, tvm.ir.expr.Constant) else None


def _scalar(expr: Any, bindings: dict[Any, Any]) -> float | None:
    value = _constant(expr, bindings)
    return None if value is None or value.size != 1 else float(value.reshape(()))


def _match(call: Any, bindings: dict[Any, Any]) -> _Layer | None:
    quant = _op(call, bindings, "quantize")
    if quant is None or str(quant.attrs.out_dtype) != "uint8":
        return None
    out_scale, out_zero = _scalar(quant.args[1], bindings), _scalar(quant.args[2], bindings)
    if out_scale is None or out_zero is None:
        return None
    body, relu = quant.args[0], False
    if (r := _op(body, bindings, "nn.relu")) is not None:
        body, relu = r.args[0], True
    bias_of, conv = None, _op(body, bindings, "nn.conv2d")
    if conv is None and (add := _op(body, bindings, "add")) is not None:
        for a, b in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
            if (c := _op(a, bindings, "nn.conv2d")) is not None:
                conv, bias_of = c, b
                break
    if conv is None or not _plain(conv.attrs):
        return None
    x_dq, w_dq = _op(conv.args[0], bindings, "dequantize"), _op(conv.args[1], bindings, "dequantize")
    if x_dq is None or w_dq is None or str(getattr(x_dq.args[0].ty, "dtype", "")) != "uint8":
        return None
    x_scale, x_zero = _scalar(x_dq.args[1], bindings), _scalar(x_dq.args[2], bindings)
    w = _constant(w_dq.args[0], bindings)
    w_scale, w_zero = _constant(w_dq.args[1], bindings), _constant(w_dq.args[2], bindings)
    if x_scale is None or x_zero is None or w is None or w.dtype != np.int8 or w_scale is None or w_zero is None:
        return None
    if np.any(w_zero != 0) or (w_scale.size != 1 and int(w_dq.attrs.axis) != 0):
        return None
    oc = w.shape[0]
    w_scale = np.broadcast_to(w_scale.astype(np.float64).reshape(-1), (oc,))
    bias = _bias(bias_of, bindings, oc) if bias_of is not None else np.zeros(oc)
    if bias is None:
        return None
    acc_scale = x_scale * w_scale
    offset = bias / acc_scale - x_zero * w.astype(np.int64).sum(axis=(1, 2, 3))
    pad = [int(p) for p in conv.attrs.padding]
    return _Layer(x=x_dq.args[0], weight=_pack_weight(w), offset=offset.astype(np.float32),
                  multiplier=(acc_scale / out_scale).astype(np.float32),
                  strides=(int(conv.attrs.strides[0]), int(conv.attrs.strides[1])),
                  padding=(pad[0], pad[1], pad[2], pad[3]), x_zero=int(x_zero), out_zero=int(out_zero), relu=relu)


def _plain(attrs: Any) -> bool:
    """An ungrouped, undilated NCHW/OIHW convolution: the layout the packing below assumes."""
    return (int(attrs.groups) == 1 and all(int(d) == 1 for d in attrs.dilation) and attrs.data_layout == "NCHW"
            and attrs.kernel_layout == "OIHW" and attrs.out_layout == "NCHW" and len(attrs.padding) == 4)


def _bias(expr: Any, bindings: dict[Any, Any], oc: int) -> np.ndarray | None:
    """The float bias per output channel, from ``reshape?(dequantize(b))`` or a float constant; else None."""
    if (reshape := _op(expr, bindings, "reshape")) is not None:
        expr = reshape.args[0]
    if (dq := _op(expr, bindings, "dequantize")) is not None:
        b, scale, zero = (_constant(a, bindings) for a in dq.args)
        if b is None or scale is None or zero is None:
            return None
        value = (b.astype(np.float64) - zero.astype(np.float64)) * scale.astype(np.float64)
    else:
        value = _constant(expr, bindings)
        if value is None:
            return None
    value = np.asarray(value, dtype=np.float64).reshape(-1)
    return value if value.size == oc else None


def _pack_weight(w: np.ndarray) -> np.ndarray:
    """OIHW int8 -> (O/16, I/4, KH, KW, 16, 4): each (16, 4) tile is the 64 contiguous bytes ``vpdpbusd`` reads."""
    oc, ic, kh, kw = w.shape
    ocp, icp = -(-oc // OC_BLOCK) * OC_BLOCK, -(-ic // IC_BLOCK) * IC_BLOCK
    padded = np.zeros((ocp, icp, kh, kw), dtype=np.int8)
    padded[:oc, :ic] = w
    tiles = padded.reshape(ocp // OC_BLOCK, OC_BLOCK, icp // IC_BLOCK, IC_BLOCK, kh, kw)
    return np.ascontiguousarray(tiles.transpose(0, 2, 4, 5, 1, 3))


# --------------------------------------------------------------------------- the TIR of one layer


def _integer_conv(x: Any, weight: Any, offset: Any, multiplier: Any, *, strides: tuple[int, int],
                  padding: tuple[int, int, int, int], x_zero: int, out_zero: int, relu: bool) -> Any:
    """TE compute: uint8 NCHW in, uint8 NCHW out, through a packed int32 convolution."""
    import tvm
    from tvm import te

    n, c, h, w = (int(d) for d in x.shape)
    oc = int(offset.shape[0])
    oc_tiles, ic_tiles, kh, kw = (int(d) for d in weight.shape[:4])
    top, left, bottom, right = padding
    hp, wp = h + top + bottom, w + left + right
    oh, ow = (hp - kh) // strides[0] + 1, (wp - kw) // strides[1] + 1
    zero = tvm.tirx.const(x_zero, "uint8")

    def packed_value(b: Any, co: Any, y: Any, z: Any, ci: Any) -> Any:
        channel = co * IC_BLOCK + ci
        inside = tvm.tirx.all(channel < c, y >= top, y < h + top, z >= left, z < w + left)
        return tvm.tirx.if_then_else(inside, x[b, channel, y - top, z - left], zero)

    packed = te.compute((n, ic_tiles, hp, wp, IC_BLOCK), packed_value, name="packed_input")
    rc, ry, rx, ri = (te.reduce_axis((0, ic_tiles), "rc"), te.reduce_axis((0, kh), "ry"),
                      te.reduce_axis((0, kw), "rx"), te.reduce_axis((0, IC_BLOCK), "ri"))
    acc = te.compute(
        (n, oc_tiles, oh, ow, OC_BLOCK),
        lambda b, o, y, z, oi: te.sum(
            packed[b, rc, y * strides[0] + ry, z * strides[1] + rx, ri].astype("int32")
            * weight[o, rc, ry, rx, oi, ri].astype("int32"), axis=[rc, ry, rx, ri]),
        name=CONV_BLOCK)
    low = tvm.tirx.const(out_zero if relu else 0, "float32")

    def requantize(b: Any, o: Any, y: Any, z: Any) -> Any:
        value = (acc[b, o // OC_BLOCK, y, z, o % OC_BLOCK].astype("float32") + offset[o]) * multiplier[o]
        q = te.round(value) + tvm.tirx.const(out_zero, "float32")
        return tvm.tirx.max(tvm.tirx.min(q, tvm.tirx.const(255, "float32")), low).astype("uint8")

    return te.compute((n, oc, oh, ow), requantize, name="requantize")


# --------------------------------------------------------------------------- the VNNI intrinsic


@cache
def load_tensor_intrinsics() -> bool:
    """Register TVM's tensor intrinsics, with ``dot_16x4_vnni`` made to compile; True when it had to be replaced.

    Tuning (MetaSchedule's tune context imports them) and loading a tuning database
    whose records tensorize both need them; parsing them costs about 5 s once per
    process (40-80 s with the standard ``inspect.stack``: :func:`_frames_without_module_lookup`).

    TVM 0.27 declares the intrinsic's ``vpdpbusd`` operands as ``int32x16``; the
    LLVM it ships (22) declares ``llvm.x86.avx512.vpdpbusd.512`` on ``<64 x i8>``,
    so every tensorized candidate failed LLVM's verifier and MetaSchedule never
    measured one. An LLVM that rejects the byte-operand form keeps TVM's own.
    """
    with _frames_without_module_lookup():
        import tvm.s_tir.tensor_intrin  # noqa: F401 (registers every intrinsic)
    from tvm.s_tir import TensorIntrin
    from tvm.s_tir.tensor_intrin import x86

    impl = _vnni_bytes_impl()
    if not _compiles(impl):
        return False
    TensorIntrin.register(VNNI_INTRIN, x86.dot_product_16x4_u8i8i32_desc, impl, override=True)
    return True


@contextmanager
def _frames_without_module_lookup() -> Iterator[None]:
    """While TVM's tensor intrinsics register, ``inspect.stack()`` reads each frame's line from ``linecache`` alone.

    TVMScript's ``prim_func`` decorator calls ``inspect.stack()`` for every function it parses (several hundred
    here, nested ones included). For each frame on the stack, the standard one looks up the frame's module, and
    for a file it has not seen (the ``<frozen importlib...>`` frames of the import that registers them) that
    scans all of ``sys.modules``: 40-80 s of a process with torch loaded, most of a small tuning run (profiled:
    82 of the 100 s of a survey tune). TVM reads only the frames, their functions and the third frame's source
    line (whether the function is defined in a class), which this version gives the same.
    """
    def stack(context: int = 1) -> list[inspect.FrameInfo]:
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            line = linecache.getline(code.co_filename, frame.f_lineno) if context > 0 else ""
            frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                            [line] if line else None, 0 if line else None))
            frame = frame.f_back
        return frames

    standard, inspect.stack = inspect.stack, stack
    try:
        yield
    finally:
        inspect.stack = standard


def _compiles(impl: Any) -> bool:
    import tvm

    try:
        tvm.compile(tvm.IRModule({"main": impl.with_attr("global_symbol", "main")}),
                    tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"}))
    except Exception:
        return False
    return True


def _vnni_bytes_impl() -> Any:
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), "uint8", offset_factor=1)
        B = T.match_buffer(b, (16, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (16,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            a_word = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                C.vload([0], dtype="int32x16"),
                T.reinterpret(T.broadcast(a_word, 16), dtype="uint8x64"),
                B.vload([0, 0], dtype="int8x64"),
                dtype="int32x16")

    return impl
