"""A toy region strategy, as a plugin registers one: points up the diagonal of the unit cube, until one fails.

Named from a spec (``plugins: [toy_strategy]``, ``calibration.strategy: diagonal``) by
tests/test_registries.py.
"""

from __future__ import annotations

import numpy as np

from qaopt.calibrate import register_strategy

STEPS = 8
"""Points on the diagonal, evenly spaced above the reference point (the origin)."""


class Diagonal:
    def __init__(self, dim: int):
        self.dim = dim
        self.levels = list(np.arange(1, STEPS + 1) / STEPS)
        self.failed = False

    def ask(self) -> np.ndarray | None:
        if self.failed or not self.levels:
            return None
        return np.full(self.dim, self.levels.pop(0))

    def tell(self, x: np.ndarray, valid: bool | None, passes: int = 0, failures: int = 0) -> None:
        self.failed = self.failed or valid is False


register_strategy("diagonal", lambda dim, seed, acceptance: Diagonal(dim))
