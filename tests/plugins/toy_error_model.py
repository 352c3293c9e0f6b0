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


@register_error_model
@dataclass(frozen=True)
class Uniform:
    metric: str = "l1"

    name = "uniform"
    needs_residuals = False  # it has a default: cls(metric=...)
    detector_bursts = 1.0  # a detector's flips are independent per frame, like its regression errors
    components = frozenset({"metric"})

    def half_width(self, setting: Mapping[str, float]) -> float:
        return (setting["metric"] / UNIT_HALF_WIDTH_METRIC[self.metric]) ** (1 / SCALE_DEGREE[self.metric])

    def injector(self, setting: Mapping[str, float]):
        a = self.half_width(setting)

        def inject(truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
            truth = np.asarray(truth, dtype=float)
            return truth + rng.uniform(-a, a, truth.shape)

        return inject

    def config(self) -> dict:
        return {"model": self.name, "metric": self.metric}

    @classmethod
    def fit(cls, residuals: Sequence[np.ndarray], metric: str = "l1", truths=None) -> Uniform:
        """Nothing to fit: the shape is fixed and each point sets the size."""
        return cls(metric=metric)
