"""A toy error model, as a plugin registers one: errors drawn uniformly from [-a, a], independent per frame.

Named from a spec (``plugins: [toy_error_model]``, ``calibration.error_model: uniform``)
by tests/test_registries.py. A target metric ``m`` maps to the half-width ``a`` whose
expected metric is ``m``: ``E|e| = a/2`` (l1), ``E e^2 = a^2/3`` (mse, rmse its root).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from qaopt.calibrate import register_error_model

UNIT_HALF_WIDTH_METRIC = {"l1": 0.5, "mse": 1 / 3, "rmse": 1 / math.sqrt(3)}
"""The expected metric of uniform errors on [-1, 1]."""
SCALE_DEGREE = {"l1": 1, "mse": 2, "rmse": 1}
"""How each metric grows with the half-width: ``metric(c a) = c**degree metric(a)``."""


@dataclass(frozen=True)
class UniformInjector:
    """``truth + e`` with ``e`` uniform on ``[-half_width, half_width]``; a class, not a closure, so it pickles
    (a process pool or a cluster runs injectors on its workers)."""

    half_width: float

    def __call__(self, truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
        truth = np.asarray(truth, dtype=float)
        return truth + rng.uniform(-self.half_width, self.half_width, truth.shape)


@register_error_model
@dataclass(frozen=True)
class Uniform:
    metric: str = "l1"

    name = "uniform"
    needs_residuals = False  # it has a default: cls(metric=...)
    detector_bursts = 1.0  # a detector's flips are independent per frame, like its regression errors
    components = frozenset({"metric"})

    def injector(self, setting: Mapping[str, float]) -> UniformInjector:
        unit = UNIT_HALF_WIDTH_METRIC[self.metric]
        return UniformInjector((setting["metric"] / unit) ** (1 / SCALE_DEGREE[self.metric]))

    def config(self) -> dict:
        return {"model": self.name, "metric": self.metric}

    @classmethod
    def fit(cls, residuals: Sequence[np.ndarray], metric: str = "l1", truths=None) -> Uniform:
        """Nothing to fit: the shape is fixed and each point sets the size."""
        return cls(metric=metric)
