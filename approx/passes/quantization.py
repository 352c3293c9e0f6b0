"""Quantization: the dtype a candidate runs in, and which backends have kernels for it (the code is :mod:`qaopt.approx.quantize`).

Which backends run a dtype is not decided here: each backend declares the dtypes it
has kernels for (``qaopt.kernels.register_backend(..., dtypes=...)``) and this pass
asks through :mod:`qaopt.app_spec.dtype_runners`, which ``qaopt`` wires to those
declarations. A plugin's backend that declares int8 is offered int8 candidates.

int8 is post-training static quantization with ONNX Runtime (QDQ graph, uint8
activations, int8 per-channel weights, calibrated on training images): on this
CPU it is the route that runs VNNI integer kernels (docs/quantization.md has the
measurements behind that choice). bf16 and fp16 are casts of the torch module, run
by torch. The float model is shared by every dtype: this pass runs in the export stage.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from optuna.distributions import CategoricalDistribution
from pydantic import Field

from qaopt.app_spec.dtype_runners import backends_running

from ..errors import ApproxError
from .base import ApproximationPass, PassConfig, PassKnobs, Runnable, register_pass


@dataclass(frozen=True)
class DtypeInfo:
    torch_dtype: str | None
    """The torch dtype's name (``None``: the module stays fp32 and another form runs)."""


DTYPES: dict[str, DtypeInfo] = {
    "fp32": DtypeInfo("float32"),
    "bf16": DtypeInfo("bfloat16"),
    "fp16": DtypeInfo("float16"),
    "int8": DtypeInfo(None),  # a static QDQ ONNX graph (qaopt.approx.quantize.quantize_int8)
}
"""The one list of dtypes a candidate may take, and how this pass produces each."""

Dtype = Literal[tuple(DTYPES)]  # type: ignore[valid-type]


class RunnableOn(Mapping[str, tuple[str, ...]]):
    """For each dtype, the backends that run it, as the registered backends declare it.

    Asked on every read, so a backend registered later (a spec's plugin) counts.
    """

    def __getitem__(self, dtype: str) -> tuple[str, ...]:
        if dtype not in DTYPES:
            raise KeyError(dtype)
        return backends_running(dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(DTYPES)

    def __len__(self) -> int:
        return len(DTYPES)


RUNNABLE_ON = RunnableOn()
"""For each dtype, the backends that run it (``RUNNABLE_ON["int8"]``)."""

INT8_FILE = "model.int8.onnx"
CALIBRATION_SAMPLES = 64
"""Training images int8 calibration reads (ONNX Runtime MinMax ranges settle well before this)."""


class QuantizationConfig(PassConfig):
    """``approximations.<nn>.quantization``: the dtypes searched (fp32 when the section is left out)."""

    dtypes: list[Dtype] = Field(default_factory=lambda: ["fp32"], min_length=1)


class QuantizationKnobs(PassKnobs):
    dtype: Dtype = "fp32"


@register_pass
class QuantizationPass(ApproximationPass):
    name = "quantization"
    Config = QuantizationConfig
    Knobs = QuantizationKnobs
    stage = "export"
    probe_alone = True

    def dtypes(self, config: QuantizationConfig | None, limits) -> list[str]:
        """The spec's dtypes, less those the target cannot run (the run refuses a list with none left)."""
        return [d for d in (config or QuantizationConfig()).dtypes if d not in limits.excluded_dtypes]

    def space(self, config, limits, chosen) -> dict[str, Any]:
        # Always searched, even over one dtype, so every trial names its dtype.
        return {"dtype": CategoricalDistribution(self.dtypes(config, limits))}

    def probes(self, config, limits) -> list[dict[str, Any]]:
        return [{"dtype": d} for d in self.dtypes(config, limits)]

    def identity(self, knobs) -> dict[str, Any]:
        return {"dtype": knobs.dtype}

    def runnable_on(self, knobs) -> tuple[str, ...]:
        return RUNNABLE_ON[knobs.dtype]

    def check(self, knobs, nn: str, backend: str | None) -> None:
        runs = RUNNABLE_ON[knobs.dtype]
        if backend is not None and backend not in runs:
            raise ApproxError(
                nn,
                "dtype",
                f"{knobs.dtype} has no kernels on backend {backend!r}; it runs on {', '.join(runs) or 'no backend'}. "
                f"Choose one of those backends or drop {knobs.dtype} from approximations.quantization.dtypes",
            )

    def export(self, runnable: Runnable, knobs, ctx, folder: Path) -> Runnable:
        from ..quantize import cast, quantize_int8

        if knobs.dtype != "int8":
            return Runnable(cast(runnable.module, DTYPES[knobs.dtype].torch_dtype))
        if ctx.onnx is None:
            raise ApproxError(ctx.nn.name, "dtype", "int8 needs an ONNX toolchain: pass onnx=qaopt.kernels.onnx to build()")
        import numpy as np

        ctx.progress("quantizing to int8 (ONNX Runtime, static QDQ)")
        x = ctx.nn.data.x_train
        rng = np.random.default_rng(knobs.seed)
        calib = x[np.sort(rng.choice(len(x), min(CALIBRATION_SAMPLES, len(x)), replace=False))]
        path = quantize_int8(runnable.module, ctx.nn.example_input, calib, folder / INT8_FILE, ctx.nn.name, ctx.onnx)
        return Runnable(runnable.module, path)

    def restore(self, runnable: Runnable, knobs, folder: Path) -> Runnable:
        from ..quantize import cast

        onnx = folder / INT8_FILE
        return Runnable(cast(runnable.module, DTYPES[knobs.dtype].torch_dtype), onnx if onnx.exists() else None)
