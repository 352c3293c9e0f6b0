"""Which low-precision route gives a real speedup on this CPU? (docs/quantization.md)

Times one NavNet (batch 1, 3x240x320, --threads threads, median after warm-up) through
every route that is practical here and, when the NN is trained, measures what each
costs in validation error:

    .venv/bin/python benchmarks/approx_int8_routes.py --spec examples/cropfollow.yaml --nn heading

Without a spec (or when its NN does not load yet) it times a NavNet-shaped model
of its own with random weights and reports latency only. The PT2E row needs
``torchao`` (``pip install torchao==0.18.0``); it is skipped, and says so, without it.
"""

from __future__ import annotations

import argparse
import copy
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process
from torch import nn

from qaopt.kernels import Protocol, measure_interleaved, torch_threads
from qaopt.approx.quantize import INPUT, CalibrationBatches
from qaopt.kernels.onnx import export_onnx, ort_session

from approx_navnet import navnet_like

Run = Callable[[np.ndarray], np.ndarray]


def torch_route(model: nn.Module, dtype: torch.dtype, channels_last: bool = False) -> Run:
    m = copy.deepcopy(model).to(dtype)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    m = m.to(memory_format=fmt)

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return m(torch.from_numpy(x).to(dtype).contiguous(memory_format=fmt)).float().numpy()

    return run


def compiled_route(model: nn.Module) -> Run:
    """Inductor with freezing (see main): weights become constants that oneDNN prepacks."""
    m = torch.compile(copy.deepcopy(model))

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return m(torch.from_numpy(x)).numpy()

    return run


def pt2e_route(model: nn.Module, example: torch.Tensor, calib: np.ndarray) -> Run:
    """torch PT2E static int8 with the X86 Inductor quantizer, lowered by torch.compile (Inductor, oneDNN int8)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    graph = torch.export.export(copy.deepcopy(model), (example,)).module()
    prepared = prepare_pt2e(graph, quantizer)
    for i in range(len(calib)):  # exported for batch 1
        prepared(torch.from_numpy(calib[i : i + 1]))
    converted = convert_pt2e(prepared)
    with torch.no_grad():
        compiled = torch.compile(converted)

    def run(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return compiled(torch.from_numpy(x)).numpy()

    return run


def onnx_routes(model: nn.Module, example: torch.Tensor, calib: np.ndarray, folder: Path, threads: int) -> dict[str, Run]:
    fp32 = export_onnx(model, [example], folder / "fp32.onnx")
    prepared = folder / "prepared.onnx"
    quant_pre_process(str(fp32), str(prepared))
    files = {"ONNX Runtime fp32": fp32}
    for name, fmt, per_channel in (
        ("ONNX Runtime int8 QDQ, per-channel weights (qaopt's route)", QuantFormat.QDQ, True),
        ("ONNX Runtime int8 QDQ, per-tensor weights", QuantFormat.QDQ, False),
        ("ONNX Runtime int8 QOperator, per-channel weights", QuantFormat.QOperator, True),
    ):
        path = folder / f"{fmt.name}-{per_channel}.onnx"
        quantize_static(str(prepared), str(path), CalibrationBatches(calib, 8), quant_format=fmt,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=per_channel)
        files[name] = path
    routes = {}
    for name, path in files.items():
        session = ort_session(path, threads)
        routes[name] = lambda x, s=session: s.run(None, {INPUT: x})[0]
    return routes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path)
    ap.add_argument("--nn", default="heading")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--val", type=int, default=300, help="validation samples for the error column")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows (25-60 s of compiling each)")
    ap.add_argument("--no-freezing", action="store_true", help="compile without Inductor freezing (PT2E int8 then runs no faster)")
    args = ap.parse_args()

    source, data, metric = "NavNet-shaped model, random weights (no accuracy)", None, None
    model = navnet_like()
    shape = (1, 3, 240, 320)
    if args.spec:
        from qaopt.app_spec import load
        from qaopt.approx import TargetNN

        spec = load(args.spec)
        target = TargetNN.from_spec(args.nn, spec.nns[args.nn])
        model, data, metric, shape = target.model, target.data, target.metric, target.input_shape
        source = f"{args.spec} NN {args.nn!r} (trained), {metric.kind} error on {min(args.val, len(data.x_val))} validation images"
    example = torch.zeros(shape)
    rng = np.random.default_rng(0)
    calib = data.x_train[np.sort(rng.choice(len(data.x_train), 64, replace=False))] if data is not None else rng.random((64, *shape[1:]), dtype=np.float32)

    routes: dict[str, Run] = {
        "torch eager fp32": torch_route(model, torch.float32),
        "torch eager fp32, channels-last": torch_route(model, torch.float32, channels_last=True),
        "torch eager bf16": torch_route(model, torch.bfloat16),
        "torch eager fp16": torch_route(model, torch.float16),
    }
    build_s: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        routes.update(onnx_routes(model, example, calib, Path(tmp), args.threads))
        build_s["ONNX Runtime int8 QDQ, per-channel weights (qaopt's route)"] = time.perf_counter() - t0
        notes = []
        with torch_threads(args.threads):
            if not args.no_compile:
                # Freezing folds weights into constants: the precondition for Inductor to lower
                # PT2E's quantize/dequantize + conv patterns to oneDNN int8 (VNNI) convolutions.
                # Without it the PT2E model ran no faster than eager fp32 here.
                torch._inductor.config.freezing = not args.no_freezing
                routes["torch.compile (Inductor) fp32"] = compiled_route(model)
                try:
                    t0 = time.perf_counter()
                    routes["torch PT2E int8, X86InductorQuantizer + torch.compile"] = pt2e_route(model, example, calib)
                    build_s["torch PT2E int8, X86InductorQuantizer + torch.compile"] = time.perf_counter() - t0
                except ImportError as exc:
                    notes.append(f"PT2E skipped: {exc} (pip install torchao==0.18.0)")
            x = rng.random(shape, dtype=np.float32)
            first: dict[str, float] = {}
            for name, run in routes.items():
                t0 = time.perf_counter()
                run(x)  # the first call compiles where the route compiles
                first[name] = time.perf_counter() - t0
                build_s[name] = build_s.get(name, 0.0) + first[name]
            measured = measure_interleaved({name: (lambda run=run: run(x)) for name, run in routes.items()}, rounds=args.rounds,
                                           protocol=Protocol(warmup=2, repeats=max(3, args.repeat // args.rounds)),
                                           threads=args.threads)
            times = {name: m.median_ms for name, m in measured.items()}
            errors = {}
            if data is not None:
                n = min(args.val, len(data.x_val))
                for name, run in routes.items():
                    pred = np.concatenate([run(data.x_val[i : i + 1]) for i in range(n)])
                    errors[name] = metric(pred, data.y_val[:n])
    reference = times["torch eager fp32"]
    print(f"# int8 / low-precision routes — {source}\n")
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, onnxruntime {ort.__version__}, "
          f"{args.threads} threads, batch 1, input {tuple(shape)}, median of ~{args.repeat} runs per route in {args.rounds} interleaved rounds, after warm-up\n")
    print(f"| route | median ms | speedup vs torch eager fp32 | {metric.kind + ' error' if metric else 'error'} | prepare/compile s |")
    print("|---|---|---|---|---|")
    for name, ms in times.items():
        err = errors.get(name)
        print(f"| {name} | {ms:.2f} | {reference / ms:.2f}x | {'-' if err is None else f'{err:.4g}'} | {build_s[name]:.1f} |")
    for note in notes:
        print(f"\n{note}")


if __name__ == "__main__":
    main()
