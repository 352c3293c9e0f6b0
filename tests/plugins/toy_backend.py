"""A toy backend, as a plugin registers one: a vendor's int8 runtime that declares what it runs.

It declares fp32 and int8 on the CPU (``dtypes``, ``devices``), so the search offers it
int8 candidates and never bf16 or fp16 ones. It compiles through ONNX Runtime, which
runs both. Named from a spec (``plugins: [toy_backend]``, ``target.backend: toy-npu``)
by tests/test_registries.py.
"""

from __future__ import annotations

from qaopt import kernels

kernels.register_backend("toy-npu", lambda **options: kernels.get_backend("onnxruntime"),
                         dtypes=("fp32", "int8"), devices=("cpu",))
