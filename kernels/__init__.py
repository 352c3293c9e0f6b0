"""qaopt.kernels: compile each candidate NN for the target, tune it cheaply, and measure its real latency.

Typical use::

    from qaopt import kernels

    target = kernels.Target.from_spec(spec.target)          # or kernels.Target(device="cpu", threads=2)
    compiled = kernels.compile(model, [example_input], target, cache_dir=cache)
    m = compiled.measure()                                  # Measurement: median_ms, ci_ms, trusted, peak_mem_bytes, …
    compiled.export("artifacts/heading")

    frame = kernels.measure_frame({"a": kernels.Workload(model_a, (x_a,)), "b": kernels.Workload(model_b, (x_b,))},
                                  "parallel", target)       # FrameMeasurement: latency_ms per frame, memory_bytes

``target.backend`` is a :class:`BackendRef` to a registered backend: 'torch'
(or 'torch[channels_last]'), 'torch-compile', 'tvm', 'onnxruntime', 'openvino', 'auto'
(every usable backend measured, the fastest kept: see :mod:`.auto`), or one
added with :func:`register_backend`, which also declares the dtypes and devices each
runs (:func:`backends_running` answers which backends run a dtype).

Modules: :mod:`.registry` (names and references), :mod:`.target`, :mod:`.model`
(what a backend is handed), :mod:`.backend` (the protocols), :mod:`.measure`
(the one timing protocol), :mod:`.schedule` (frames of several models),
:mod:`.onnx` (the one ONNX exporter and session factory), and the backends.
"""

from __future__ import annotations

from . import builtin  # noqa: F401 - registers the built-in backends
from .auto import AutoBackend, AutoCompiled, Outcome
from .backend import Backend, Compiled, LocalCompiled
from .compiler import compile
from .errors import (
    BackendUnavailableError,
    BuildError,
    KernelsError,
    MeasurementError,
    UnsupportedModelError,
    UnsupportedOperatorError,
)
from .measure import (
    CONFIDENCE,
    EPOCH,
    CpuLoadProbe,
    Interference,
    InterferenceProbe,
    Measurement,
    Protocol,
    device_lock,
    measure_callable,
    measure_interleaved,
    median_and_spread,
    median_interval,
    pinned,
    ratio_interval,
    sum_interval,
)
from .openvino_backend import OpenVinoBackend
from .onnx import INPUT_NAME, OPSET, OUTPUT_NAME, export_onnx, ort_session
from .registry import (
    BackendRef,
    backend_devices,
    backend_dtypes,
    backend_names,
    backend_version,
    backends_running,
    get_backend,
    register_backend,
    resolve,
    unregister_backend,
)
from .schedule import (
    QUICK,
    SCHEDULES,
    FrameMeasurement,
    FrameModel,
    MeasuredModel,
    Schedule,
    Workload,
    compare_frames,
    compare_frames_fresh,
    frame_target,
    measure_concurrent,
    measure_frame,
    measure_model,
    measure_untuned,
    schedules_for,
    threads_of,
    untuned_backends,
)
from .runnable import Unrunnable, target_backends, unrunnable_dtypes
from .target import CpuInfo, RPCConfig, Target, TuningBudget, emulated_dtypes, host_cpu_info, missing_device
from .torch_backends import torch_threads

__all__ = [
    "CONFIDENCE", "EPOCH", "INPUT_NAME", "OPSET", "OUTPUT_NAME", "QUICK", "SCHEDULES",
    "AutoBackend", "AutoCompiled", "Backend", "BackendRef", "BackendUnavailableError", "BuildError", "Compiled",
    "CpuInfo", "CpuLoadProbe", "FrameMeasurement", "FrameModel", "Interference", "InterferenceProbe", "KernelsError",
    "LocalCompiled",
    "MeasuredModel", "Measurement", "MeasurementError", "OpenVinoBackend", "Outcome", "Protocol", "RPCConfig",
    "Schedule", "Target", "TuningBudget", "Unrunnable", "UnsupportedModelError", "UnsupportedOperatorError", "Workload",
    "backend_devices", "backend_dtypes", "backend_names", "backend_version", "backends_running", "compare_frames",
    "compare_frames_fresh", "compile", "device_lock", "export_onnx", "frame_target",
    "emulated_dtypes", "get_backend", "host_cpu_info", "measure_callable", "measure_concurrent", "measure_frame", "measure_interleaved",
    "measure_model", "measure_untuned", "median_and_spread", "median_interval", "missing_device", "ort_session", "pinned", "ratio_interval",
    "register_backend", "resolve", "schedules_for", "sum_interval", "target_backends", "threads_of", "torch_threads",
    "unregister_backend", "unrunnable_dtypes", "untuned_backends",
]
