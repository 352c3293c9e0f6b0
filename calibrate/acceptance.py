"""Statistical acceptance of one point: does the application meet its QoS goal often enough?

A point is *valid* when a run passes with probability ``>= 1 - max_failure_rate``.
Runs are seeded and taken in blocks; after each block a one-sided Clopper-Pearson
bound on the failure rate decides: upper bound ``<= max_failure_rate`` -> valid,
lower bound ``> max_failure_rate`` -> invalid, else run another block, up to
``max_trials`` (then *undecided*, which never certifies a point). Clear points stop
after the first block; borderline points use more runs.

Looking after every block raises the chance of a wrong call above a single test's
level, so the per-look level is lowered until the *exact* probability of a wrong
call of the whole sequential procedure, computed over every path of block
outcomes at the worst case ``p = max_failure_rate``, is at most ``1 - confidence``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum
from functools import cached_property

import numpy as np
from scipy.stats import beta, binom

from qaopt.calibrate.errors import CalibrationError


class Verdict(str, Enum):
    VALID = "valid"
    INVALID = "invalid"
    UNDECIDED = "undecided"  # max_trials reached without a decision: never certifies a point
    FAILED = "failed"  # only read back: an application error recorded by a release before it stopped the run


@dataclass(frozen=True)
class QoSGoal:
    """A run passes when ``metric <= max`` (and ``>= min`` when given)."""

    metric: str
    max: float | None = None
    min: float | None = None

    def __post_init__(self) -> None:
        if self.max is None and self.min is None:
            raise CalibrationError(f"qos: metric '{self.metric}' needs a 'max' or a 'min' to pass against")

    def passes(self, value: float) -> bool:
        return (self.max is None or value <= self.max) and (self.min is None or value >= self.min)

    def to_json(self) -> dict:
        return asdict(self)


def cp_upper(failures: int, trials: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound on the failure rate at level ``alpha``."""
    return 1.0 if failures >= trials else float(beta.ppf(1 - alpha, failures + 1, trials - failures))


def cp_lower(failures: int, trials: int, alpha: float) -> float:
    """One-sided Clopper-Pearson lower bound on the failure rate at level ``alpha``."""
    return 0.0 if failures <= 0 else float(beta.ppf(alpha, failures, trials - failures + 1))


@dataclass(frozen=True)
class AcceptanceTest:
    """The sequential test of a point (defaults match the example spec).

    ``block`` trials (one seed block) are run per look; looks happen at every
    multiple of ``block`` from ``min_trials`` to ``max_trials``.
    """

    max_failure_rate: float = 0.05
    confidence: float = 0.9
    min_trials: int = 8
    max_trials: int = 96
    block: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.max_failure_rate < 1:
            raise CalibrationError("qos.acceptance.max_failure_rate must be in (0, 1)")
        if not 0 < self.confidence < 1:
            raise CalibrationError("qos.acceptance.confidence must be in (0, 1)")
        if self.block < 1 or self.min_trials < 1 or self.max_trials < self.min_trials:
            raise CalibrationError(
                "qos.acceptance: need block >= 1 and 1 <= min_trials <= max_trials "
                f"(got min_trials={self.min_trials}, max_trials={self.max_trials})"
            )

    @cached_property
    def looks(self) -> tuple[int, ...]:
        first = math.ceil(self.min_trials / self.block) * self.block
        last = max(first, (self.max_trials // self.block) * self.block)
        return tuple(range(first, last + 1, self.block))

    def _bounds(self, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """Per look: the most failures still accepted, the fewest failures rejected."""
        acc, rej = [], []
        d = self.max_failure_rate
        for n in self.looks:
            f = np.arange(n + 1)
            upper = np.where(f < n, beta.ppf(1 - alpha, f + 1, np.maximum(n - f, 1)), 1.0)
            lower = np.where(f > 0, beta.ppf(alpha, np.maximum(f, 1), n - f + 1), 0.0)
            ok, bad = f[upper <= d], f[lower > d]
            acc.append(ok.max() if ok.size else -1)
            rej.append(bad.min() if bad.size else n + 1)
        return np.array(acc), np.array(rej)

    def error_probabilities(self, p: float, alpha: float | None = None) -> tuple[float, float]:
        """Exact P(accept), P(reject) of the sequential procedure when the failure rate is ``p``."""
        acc, rej = self._bounds(self.look_alpha if alpha is None else alpha)
        mass = np.zeros(self.looks[-1] + 1)
        mass[0] = 1.0
        p_acc = p_rej = 0.0
        prev = 0
        for n, a, r in zip(self.looks, acc, rej):
            step = binom.pmf(np.arange(n - prev + 1), n - prev, p)
            mass = np.convolve(mass, step)[: self.looks[-1] + 1]
            f = np.arange(mass.size)
            p_acc += float(mass[f <= a].sum())
            p_rej += float(mass[f >= r].sum())
            mass[(f <= a) | (f >= r)] = 0.0
            prev = n
        return p_acc, p_rej

    @cached_property
    def look_alpha(self) -> float:
        """The per-look level whose whole-procedure error at ``p = max_failure_rate`` is ``<= 1 - confidence``."""
        target = 1 - self.confidence
        lo, hi = target / (4 * len(self.looks)), target
        if max(self.error_probabilities(self.max_failure_rate, hi)) <= target:
            return hi
        for _ in range(30):
            mid = math.sqrt(lo * hi)
            if max(self.error_probabilities(self.max_failure_rate, mid)) <= target:
                lo = mid
            else:
                hi = mid
        return lo

    @cached_property
    def _table(self) -> dict[int, tuple[int, int]]:
        acc, rej = self._bounds(self.look_alpha)
        return {n: (int(a), int(r)) for n, a, r in zip(self.looks, acc, rej)}

    def decide(self, failures: int, trials: int) -> Verdict:
        """The sequential verdict after ``trials`` runs (a look), ``UNDECIDED`` while more are needed."""
        if trials not in self._table:
            raise ValueError(f"{trials} trials is not a look of this test {self.looks}")
        acc, rej = self._table[trials]
        if failures <= acc:
            return Verdict.VALID
        if failures >= rej:
            return Verdict.INVALID
        return Verdict.UNDECIDED

    def decide_fixed(self, failures: int, trials: int) -> Verdict:
        """One test on a fixed set of runs (field evidence): Clopper-Pearson at ``1 - confidence``."""
        if trials <= 0:
            return Verdict.UNDECIDED
        alpha = 1 - self.confidence
        if cp_upper(failures, trials, alpha) <= self.max_failure_rate:
            return Verdict.VALID
        if cp_lower(failures, trials, alpha) > self.max_failure_rate:
            return Verdict.INVALID
        return Verdict.UNDECIDED

    def to_json(self) -> dict:
        return asdict(self)
