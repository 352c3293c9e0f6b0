"""A synthetic application whose valid region is known exactly (as ``sklearn.datasets`` is for estimators).

Strategies, acceptance and caching are tested and compared on it in seconds. Each
episode runs ``steps`` perception steps through the injectors with truth 0,
measures every NN's mean absolute error over the episode, and fails when
``sum((error_i / limit_i) ** power) > 1``: the valid region is the part of the
positive orthant under that superellipse (a quarter circle for ``power=2``),
blurred only by the episode's finite length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from qaopt.calibrate.protocols import Injector


class SuperellipseApp:
    """A :class:`~qaopt.calibrate.protocols.QoSEvaluator` with the metric ``failed`` (0 or 1)."""

    def __init__(self, limits: Mapping[str, float], power: float = 2.0, steps: int = 200):
        self.limits = dict(limits)
        self.nn_names = tuple(self.limits)
        self.power, self.steps = power, steps
        self.calls = 0

    def evaluate(self, injectors: Mapping[str, Injector], seeds: Sequence[int]) -> list[dict[str, float]]:
        self.calls += 1
        rng = np.random.default_rng(list(seeds))
        load = np.zeros(len(seeds))
        for nn, limit in self.limits.items():
            if nn not in injectors:
                continue
            err = np.zeros(len(seeds))
            for t in range(self.steps):
                err += np.abs(injectors[nn](np.zeros(len(seeds)), rng, t))
            load += (err / self.steps / limit) ** self.power
        return [{"failed": float(v > 1.0), "load": float(v)} for v in load]

    def truly_valid(self, errors: Mapping[str, float]) -> bool:
        """Whether a point of L1 errors (NN name -> error) lies inside the superellipse."""
        return sum((errors.get(nn, 0.0) / lim) ** self.power for nn, lim in self.limits.items()) <= 1.0
