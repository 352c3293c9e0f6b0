"""The approximation passes: a registry, and the built-in passes in the order they run.

>>> from qaopt.approx.passes import passes
>>> [p.name for p in passes()]
['pruning', 'lowrank', 'resolution', 'quantization', 'finetune']

A new pass is one module with one :class:`ApproximationPass` subclass decorated
with :func:`register_pass` (docs/extending.md, "Adding an approximation pass").
"""

from .base import (
    ApproximationPass,
    BuildContext,
    OnnxToolchain,
    PassConfig,
    PassKnobs,
    Range,
    Runnable,
    SearchLimits,
    get_pass,
    knob_owners,
    passes,
    register_pass,
    span,
    unregister_pass,
)

# The built-in passes, registered on import in this order: sampled in it, and applied in it within each stage.
from . import pruning, lowrank, resolution, quantization, finetune  # noqa: E402,F401  isort: skip

__all__ = [
    "ApproximationPass",
    "BuildContext",
    "OnnxToolchain",
    "PassConfig",
    "PassKnobs",
    "Range",
    "Runnable",
    "SearchLimits",
    "get_pass",
    "knob_owners",
    "passes",
    "register_pass",
    "span",
    "unregister_pass",
]
