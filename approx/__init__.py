"""Approximation knobs: build candidate NNs (pruned, fine-tuned, quantized) and measure them.

The whole API::

    nn = TargetNN.from_spec("heading", spec.nns["heading"])   # or TargetNN(name, model, data, input_shape, metric)
    cand = build(nn, Knobs(prune_ratio=0.5, prune_steps=4, finetune_steps=400, dtype="int8"), cache_dir=...)
    cand.error, cand.residuals, cand.macs, cand.params, cand.runnable_on, cand.module, cand.onnx_path

    for cand in sweep(nn, knobs_from_space(spec.knobs_for("heading")), "prune_ratio", [0, 0.5, 0.9]): ...
"""

from .build import build
from .candidate import Candidate
from .errors import ApproxError
from .finetune import FinetuneRecipe
from .knobs import RUNNABLE_ON, Dtype, Knobs, check_backend
from .sweep import knobs_from_space, sweep
from .target import ErrorMetric, NNData, TargetNN

__all__ = [
    "RUNNABLE_ON",
    "ApproxError",
    "Candidate",
    "Dtype",
    "ErrorMetric",
    "FinetuneRecipe",
    "Knobs",
    "NNData",
    "TargetNN",
    "build",
    "check_backend",
    "knobs_from_space",
    "sweep",
]
