"""TVM's compilation steps: import a model into Relax, lower it, build it, export the library.

They are split in two so that tuning (:mod:`.tuning`) can sit between their halves:

* :func:`prepare` imports the model (``torch.export`` -> Relax, or the ONNX
  frontend), binds the weights as constants (so weight-layout rewrites are folded
  at build time) and fuses it into TIR functions: these are MetaSchedule's tasks.
* :func:`build` applies whatever the shared database knows for those tasks and
  compiles; functions it does not know keep TVM's default schedules.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from .errors import BuildError, UnsupportedOperatorError
from .model import Model, describe, is_onnx, model_dtype, module_of, param_bytes_of, torch_inputs, unsupported
from .onnx import onnx_param_bytes
from .target import Target
from .tvm_int8 import integer_convolutions, keep_packed_weights

_TORCH_UNSUPPORTED = re.compile(r"Unsupported function types \[(.*)\]")
_ONNX_UNSUPPORTED = re.compile(r"not supported for frontend ONNX: (.*)")


@cache
def host_cpu() -> str:
    """LLVM's name for this machine's CPU (e.g. znver5), so TVM vectorizes for it."""
    import tvm

    return str(tvm.get_global_func("target.llvm_get_system_cpu")())


def tvm_target(target: Target) -> Any:
    """The TVM target of a :class:`Target`: LLVM for the host CPU unless mcpu/mtriple name another; for a CUDA
    target, the GPU this process sees (:func:`cuda_target`), its host code for this CPU."""
    import tvm

    if target.device == "cuda":
        return tvm.target.Target(cuda_target(), host={"kind": "llvm", "mcpu": host_cpu()})
    spec: dict[str, Any] = {"kind": "llvm", "mcpu": target.mcpu or host_cpu(),
                            "num-cores": target.threads or os.cpu_count() or 1}
    if target.mtriple:
        spec["mtriple"] = target.mtriple
    return tvm.target.Target(spec)


@cache
def cuda_target() -> dict[str, Any]:
    """TVM's CUDA target for GPU 0 as torch sees it: its architecture and the limits MetaSchedule tiles for.

    TVM's own target detection for CUDA registers only once its CUDA runtime has loaded, so the properties come from
    torch, which qaopt's CUDA targets need anyway. NVRTC compiles for ``arch``; ``max_shared_memory_per_block``,
    ``max_threads_per_block`` and ``thread_warp_size`` bound the schedules MetaSchedule samples.
    """
    import torch

    props = torch.cuda.get_device_properties(0)
    return {"kind": "cuda", "arch": f"sm_{props.major}{props.minor}",
            "max_shared_memory_per_block": int(getattr(props, "shared_memory_per_block", 48 * 1024)),
            "max_threads_per_block": 1024, "thread_warp_size": int(getattr(props, "warp_size", 32)),
            "registers_per_block": int(getattr(props, "regs_per_multiprocessor", 65536)),
            "l2_cache_size_bytes": int(getattr(props, "L2_cache_size", 0))}


# --------------------------------------------------------------------------- import and build


@dataclass
class Prepared:
    """A model imported and fused into TIR functions, ready for tuning and building."""

    mod: Any  # tvm.IRModule
    target: Any  # tvm.target.Target
    name: str
    param_bytes: int
    input_dtypes: tuple[str, ...]
    """The dtypes of the model's inputs as imported, which the inputs are cast to (``float32`` for qaopt's NNs, fp16
    ones included: they cast inside, see :func:`_float32`)."""
    integer_convolutions: int = 0
    """Quantized convolutions running as integer kernels (:mod:`.tvm_int8`); the rest of an int8 graph runs in float."""


def prepare(model: Model, example_inputs: Sequence[Any], target: Target, backend: str = "tvm") -> Prepared:
    """Import a torch module / ExportedProgram / ONNX file into fused Relax+TIR for ``target``."""
    import tvm
    from tvm import relax
    from tvm.relax import transform as T

    half = not is_onnx(model) and not isinstance(model, (str, Path)) and model_dtype(model) == "float16"
    mod = _import(_float32(model) if half else model, example_inputs, backend)
    mod, integer = integer_convolutions(mod) if is_onnx(model) else (mod, 0)
    ttarget = tvm_target(target)
    try:
        with ttarget:
            mod = tvm.transform.Sequential([
                T.DecomposeOpsForInference(), T.CanonicalizeBindings(),
                *([T.ConvertToDataflow(), T.ToMixedPrecision(out_dtype="float32")] if half else []),
                relax.get_pipeline("zero"),
                T.AttachAttrLayoutFreeBuffers(),
            ])(mod)
            if integer:
                mod = keep_packed_weights(mod)
    except Exception as exc:
        raise BuildError(f"{describe(model)}: backend '{backend}' could not lower the model: {type(exc).__name__}: {exc}") from exc
    inputs = tuple(str(p.ty.dtype) for p in mod["main"].params)
    return Prepared(mod, ttarget, describe(model), _param_bytes(model), inputs, integer)


def _float32(model: Model) -> Any:
    """An fp16 module's fp32 copy, for import: TVM's torch importer gives every convolution a float32 output, which
    an fp16 bias then cannot be added to. Import in fp32 (every fp16 weight is exact in fp32) and let TVM's
    mixed-precision pass cast it back: convolutions and matrix products in fp16 with fp32 accumulation, as cuDNN
    runs them, the model's weights the candidate's own fp16 values."""
    import copy

    import torch

    if isinstance(model, torch.export.ExportedProgram):
        raise unsupported("tvm", model, "an fp16 ExportedProgram: pass the fp16 torch module instead")
    return copy.deepcopy(model).float()


def _import(model: Model, example_inputs: Sequence[Any], backend: str) -> Any:
    if is_onnx(model):
        import onnx
        from tvm.relax.frontend.onnx import from_onnx

        proto = onnx.load(str(model))
        shapes = {i.name: list(np.asarray(x).shape) for i, x in zip(proto.graph.input, example_inputs)}
        try:
            return from_onnx(proto, shape_dict=shapes, keep_params_in_input=False)
        except Exception as exc:
            _raise_unsupported(_ONNX_UNSUPPORTED, exc, backend, model)
            raise BuildError(f"{model}: backend '{backend}' could not import the ONNX model: {exc}") from exc
    if isinstance(model, (str, Path)):
        raise unsupported(backend, model, "expected a torch.nn.Module, an ExportedProgram or an .onnx file")
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    if isinstance(model, torch.export.ExportedProgram):
        program = model
    else:
        try:
            with torch.no_grad():
                program = torch.export.export(model.eval(), torch_inputs(example_inputs, like=model))
        except Exception as exc:
            raise unsupported(backend, model, f"torch.export failed: {type(exc).__name__}: {exc}") from exc
    try:
        return from_exported_program(program, keep_params_as_input=False)
    except Exception as exc:
        _raise_unsupported(_TORCH_UNSUPPORTED, exc, backend, model)
        raise BuildError(f"{describe(model)}: backend '{backend}' could not import the model: {type(exc).__name__}: {exc}") from exc


def _param_bytes(model: Model) -> int:
    if is_onnx(model):
        return onnx_param_bytes(Path(model))
    return param_bytes_of(module_of(model))


def _raise_unsupported(pattern: re.Pattern[str], exc: Exception, backend: str, model: Model) -> None:
    match = pattern.search(str(exc))
    if match:
        ops = ", ".join(op.strip(" '\"") for op in match.group(1).split(","))
        raise UnsupportedOperatorError(ops, backend, describe(model),
                                       "TVM's Relax frontend has no converter for it; choose backend torch or onnxruntime") from exc


def build(prepared: Prepared, database: Any = None) -> Any:
    """Compile, with the best schedules ``database`` holds for the model's tasks (default schedules for the rest)."""
    import tvm
    from tvm.relax import transform as T

    try:
        mod = prepared.mod
        if database is not None:  # opened by TuningDatabase.open, which registered any intrinsic its records use
            with prepared.target, database:
                mod = tvm.transform.Sequential([
                    T.MetaScheduleApplyDatabase(), T.SplitLayoutRewritePreproc(), T.LiftTransformParams(), T.FoldConstant(),
                ])(mod)
        # On a GPU the VM replays the model's kernels as one CUDA graph: at batch 1 the launches, not the arithmetic,
        # set the time (docs/latency.md, "GPU targets").
        with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": is_cuda(prepared.target)}):
            return tvm.compile(mod, prepared.target)
    except Exception as exc:
        raise BuildError(f"{prepared.name}: backend 'tvm' failed to build: {type(exc).__name__}: {exc}") from exc


def is_cuda(ttarget: Any) -> bool:
    """Whether a TVM target compiles for an NVIDIA GPU."""
    return str(ttarget.kind.name) == "cuda"


def configure_threads(threads: int | None) -> None:
    """Size TVM's runtime thread pool (all cores when ``None``), its threads left unbound.

    TVM binds its pool's threads to cores, the calling thread included, natively and for good: after one TVM
    model ran, the thread that ran it stayed on core 0, and every later measurement that read its cores from that
    thread ran a 2-thread model on one core (a quick CropFollow run timed its side-by-side frames of two NNs 1.4-2x
    slow). qaopt pins the threads of every runtime itself while it measures (:func:`.measure.pinned`), so TVM's
    binding is off (``TVM_BIND_THREADS=0``, unless the environment sets it).
    """
    import tvm

    os.environ.setdefault("TVM_BIND_THREADS", "0")
    if threads:
        tvm.get_global_func("runtime.config_threadpool")(1, threads)


def export_library(executable: Any, path: Path, target: Target) -> Path:
    """Write the compiled library for the target: a shared library, or for a cross target without
    ``target.cc`` a tar of its object files (link them with the board's toolchain)."""
    from .native_output import native_stderr_logged

    with native_stderr_logged(f"TVM, exporting {path.name}"):  # its runtime's warnings, one per function saved
        if target.cc:
            from tvm.contrib import cc

            path = path.with_suffix(".so")
            executable.export_library(str(path), fcompile=cc.cross_compiler(target.cc))
        elif target.mtriple:
            path = path.with_suffix(".tar")
            executable.export_library(str(path))
        else:
            path = path.with_suffix(".so")
            executable.export_library(str(path))
    return path


def flatten(out: Any) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    result: list[np.ndarray] = []
    for item in out:
        result.extend(flatten(item))
    return result
