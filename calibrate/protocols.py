"""The small contracts between calibration and the application it measures.

An application (a simulator, a field harness) is a black box to calibration: it
is run with each NN's output replaced by ``injector(truth, rng, t)`` and reports
raw QoS metrics. Calibration decides pass/fail against the spec's goal. The
contracts are structural (``typing.Protocol``): an evaluator never needs to
import qaopt to satisfy them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Injector(Protocol):
    """Turns one NN's ground-truth output into the erroneous estimate the app sees.

    ``truth`` has shape ``(B,)`` (or ``(B, k)`` for a k-output NN): one entry per
    episode of a batch that runs in lock-step; ``B == 1`` for a single episode.
    ``t`` is the perception step (0, 1, 2, ...), so stateful models (AR(1), residual
    bootstrap) can keep their time structure. An injector is created fresh for each
    ``evaluate`` call and may keep state between its calls within it.
    """

    def __call__(self, truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray: ...


@runtime_checkable
class QoSEvaluator(Protocol):
    """Runs the application closed-loop and reports its raw QoS metrics.

    ``injectors`` maps NN names (as in the spec's ``nns``) to injectors; an NN
    left out runs with perfect perception. One episode is run per seed; the result
    for a given ``(injectors, seeds)`` must be deterministic so it can be cached.
    Returns one metrics mapping per seed (e.g. ``{"distance_m": 100.0,
    "collisions": 0, "interventions": 0, "collisions_per_100m": 0.0}``).
    """

    nn_names: tuple[str, ...]

    def evaluate(
        self, injectors: Mapping[str, Injector], seeds: Sequence[int]
    ) -> list[dict[str, float]]: ...
