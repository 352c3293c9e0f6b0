"""Synthetic applications whose valid region is known exactly (as ``sklearn.datasets`` is for estimators).

Strategies, acceptance and caching are tested and compared on them in seconds.
:class:`SuperellipseApp`: each episode runs ``steps`` perception steps through the injectors with truth 0,
measures every NN's mean absolute error over the episode, and fails when
``sum((error_i / limit_i) ** power) > 1``: the valid region is the part of the
positive orthant under that superellipse (a quarter circle for ``power=2``),
blurred only by the episode's finite length. :class:`KnownRateApp`: each run fails
with a probability given as a function of the injected error levels, so a
certifier's confidence can be checked against the truth.
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


class KnownRateApp:
    """A :class:`~qaopt.calibrate.protocols.QoSEvaluator` whose failure probability at each point is known exactly.

    Each injector is asked once for its error level (the mean absolute value of
    ``samples`` errors it injects in one batched call); a run then fails with probability
    ``rate(levels)``, where ``levels`` maps NN names to those levels. The truly valid
    region is ``rate <= max_failure_rate``, with no blur from finite episodes, which is
    what a test of a certifier's confidence needs.
    """

    def __init__(self, nn_names: Sequence[str], rate, samples: int = 20_000):
        self.nn_names = tuple(nn_names)
        self.rate, self.samples = rate, samples
        self.calls = 0
        self.seeds: list[list[int]] = []

    def levels(self, injectors: Mapping[str, Injector]) -> dict[str, float]:
        rng = np.random.default_rng(0)
        return {nn: float(np.mean(np.abs(injectors[nn](np.zeros(self.samples), rng, 0)))) if nn in injectors else 0.0
                for nn in self.nn_names}

    def evaluate(self, injectors: Mapping[str, Injector], seeds: Sequence[int]) -> list[dict[str, float]]:
        self.calls += 1
        self.seeds.append(list(seeds))
        p = float(self.rate(self.levels(injectors)))
        return [{"failed": float(np.random.default_rng([int(s), 0xFA11]).random() < p)} for s in seeds]
