"""Approximation knobs: build candidate NNs (pruned, fine-tuned, quantized) and measure them.

The whole API::

    nn = TargetNN.from_spec("heading", spec.nns["heading"])   # or TargetNN(name, model, data, input_shape, metric)
    cand = build(nn, Knobs(prune_ratio=0.5, prune_steps=4, finetune_steps=400, dtype="int8"), cache_dir=...)
    cand.error, cand.residuals, cand.macs, cand.params, cand.runnable_on, cand.module, cand.onnx_path
"""

from .build import build
from .candidate import Candidate
from .errors import ApproxError
from .finetune import FinetuneRecipe
from .knobs import RUNNABLE_ON, Dtype, Knobs, check_backend
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
]
