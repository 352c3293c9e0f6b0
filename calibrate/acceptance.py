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

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import Enum

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


def _check_goal(max_failure_rate: float, confidence: float) -> None:
    """The goal's statistics that every test of it needs: a failure rate and a confidence strictly inside (0, 1)."""
    if not 0 < max_failure_rate < 1:
        raise CalibrationError("qos.acceptance.max_failure_rate must be in (0, 1)")
    if not 0 < confidence < 1:
        raise CalibrationError("qos.acceptance.confidence must be in (0, 1)")


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
        _check_goal(self.max_failure_rate, self.confidence)
        if self.block < 1 or self.min_trials < 1 or self.max_trials < self.min_trials:
            raise CalibrationError(
                "qos.acceptance: need block >= 1 and 1 <= min_trials <= max_trials "
                f"(got min_trials={self.min_trials}, max_trials={self.max_trials})"
            )

    @functools.cached_property
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

    @functools.cached_property
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

    @functools.cached_property
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


@functools.lru_cache(maxsize=64)
def _sequential(cls: type, *parameters) -> SequentialTest:
    return cls(*parameters)


POWER_RATE_FRACTION = 0.5
"""The lower failure rate a closed-loop test is powered at, as a fraction of the goal's ``max_failure_rate``: a
configuration that fails half as often as the goal allows should be accepted (:class:`SequentialTest`)."""
NOMINAL_POWER = 0.8
"""Wald's nominal chance of accepting at the powered rate; the exact chance with the cap is what the report states."""


@dataclass(frozen=True)
class SequentialTest:
    """Closed-loop acceptance of a configuration: Wald's sequential probability ratio test, truncated at ``cap`` runs.

    Each run is a Bernoulli trial (it fails the QoS goal or not). The test weighs two hypotheses: the runs fail at
    ``max_failure_rate`` (the goal's limit, ``p1``) or at ``POWER_RATE_FRACTION`` of it (``p0``). After every look
    (``min_trials`` runs rounded up to a whole ``block``, then every ``block`` runs, and ``cap``) the log-likelihood
    ratio of the failures so far decides: low enough accepts, high enough rejects, else more runs. Where accepting
    is out of reach within ``cap`` (more failures than the last look's acceptance bound) the test stops undecided:
    no later run could change that.

    Why this test and not a fixed number of runs: a fixed-n test at 50 runs accepts only failure-free
    configurations (one failure in 50 bounds the rate at 7.6 %), so a configuration failing 2 % of runs, valid by a
    5 % goal, was accepted 36 % of the time. The SPRT spends runs where they decide: a failure-free configuration is
    accepted in the fewest runs the goal allows, and one failure costs a few dozen more runs instead of a verdict.

    Why it stays correct under repeated looks: Wald's boundaries are only approximate for a truncated test looked at
    in blocks, so the acceptance boundary is lowered until the *exact* probability of accepting when the runs fail
    at ``max_failure_rate``, summed over every path of block outcomes (:meth:`operating`), is at most
    ``1 - confidence``. A true failure rate above the goal is accepted less often still (the bounds are monotone).
    The rejection boundary is Wald's; a wrong rejection costs runs, never safety, and the exact acceptance chance
    at any rate is what :meth:`operating` (and the report) states.
    """

    max_failure_rate: float = 0.05
    confidence: float = 0.9
    cap: int = 400
    block: int = 8
    min_trials: int = 8

    def __post_init__(self) -> None:
        _check_goal(self.max_failure_rate, self.confidence)
        if self.cap < 1 or self.block < 1 or self.min_trials < 1:
            raise CalibrationError(f"closed-loop test: need cap, block and min_trials >= 1 (got cap={self.cap}, "
                                   f"block={self.block}, min_trials={self.min_trials})")

    @classmethod
    def of(cls, acceptance: AcceptanceTest, cap: int | None = None) -> SequentialTest:
        """The closed-loop test at ``acceptance``'s goal, capped at its ``max_trials`` or the lower ``cap``; one
        instance per set of parameters, so its boundaries (a quarter of a second at 400 runs) are computed once."""
        return _sequential(cls, acceptance.max_failure_rate, acceptance.confidence,
                           acceptance.max_trials if cap is None else min(cap, acceptance.max_trials),
                           acceptance.block, acceptance.min_trials)

    @functools.cached_property
    def looks(self) -> tuple[int, ...]:
        """The run counts after which the test decides; the last is ``cap``."""
        first = min(self.cap, math.ceil(self.min_trials / self.block) * self.block)
        return tuple(sorted({*range(first, self.cap, self.block), self.cap}))

    @property
    def powered_rate(self) -> float:
        return self.max_failure_rate * POWER_RATE_FRACTION

    def _boundaries(self, shift: float, runs: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per look (or per count of ``runs``): the most failures that accept and the fewest that reject (Wald's,
        acceptance lowered by ``shift`` in log-likelihood)."""
        p1, p0 = self.max_failure_rate, self.powered_rate
        up, down = math.log(p1 / p0), math.log((1 - p1) / (1 - p0))  # a failure's and a pass's log-likelihood ratio
        alpha, beta_ = 1 - self.confidence, 1 - NOMINAL_POWER
        low, high = math.log(beta_ / (1 - alpha)) - shift, math.log((1 - beta_) / alpha)
        n = np.array(self.looks if runs is None else runs, dtype=float)
        accept = np.floor((low - n * down) / (up - down)).astype(int)
        reject = np.ceil((high - n * down) / (up - down)).astype(int)
        return accept, np.maximum(reject, accept + 1)

    def operating(self, rate: float, shift: float | None = None) -> tuple[float, float, float]:
        """Exact chance of accepting and of rejecting, and the expected runs, when every run fails at ``rate``.

        Sums over every path of block outcomes: the failures' distribution is carried from look to look, less the
        paths that stopped (accepted, rejected, or out of reach).
        """
        accept, reject = self._boundaries(self.shift if shift is None else shift)
        reach = accept[-1]
        mass = np.zeros(self.cap + 1)
        mass[0] = 1.0
        f = np.arange(self.cap + 1)
        p_accept = p_reject = runs = 0.0
        prev = 0
        for n, a, r in zip(self.looks, accept, reject):
            mass = np.convolve(mass, binom.pmf(np.arange(n - prev + 1), n - prev, rate))[: self.cap + 1]
            ok, bad, lost = mass[f <= a].sum(), mass[f >= r].sum(), mass[(f > reach) & (f < r)].sum()
            p_accept, p_reject, runs = p_accept + ok, p_reject + bad, runs + n * (ok + bad + lost)
            mass[(f <= a) | (f >= r) | (f > reach)] = 0.0
            prev = n
        return float(p_accept), float(p_reject), float(runs + self.cap * mass.sum())

    @functools.cached_property
    def shift(self) -> float:
        """How far the acceptance boundary is lowered below Wald's so that the exact chance of accepting at the
        goal's rate is at most ``1 - confidence``."""
        alpha = 1 - self.confidence
        if self.operating(self.max_failure_rate, 0.0)[0] <= alpha:
            return 0.0
        lo, hi = 0.0, 1.0
        while self.operating(self.max_failure_rate, hi)[0] > alpha:
            lo, hi = hi, 2 * hi
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self.operating(self.max_failure_rate, mid)[0] <= alpha else (mid, hi)
        return hi

    @functools.cached_property
    def _table(self) -> dict[int, tuple[int, int]]:
        accept, reject = self._boundaries(self.shift)
        return {n: (int(a), int(r)) for n, a, r in zip(self.looks, accept, reject)}

    @property
    def can_accept(self) -> bool:
        """Whether any path of ``cap`` runs accepts (six runs cannot show a 5 % rate at 90 %)."""
        return self._table[self.cap][0] >= 0

    @property
    def tolerated(self) -> int:
        """The most failures that can still be accepted within ``cap`` (``-1``: none)."""
        return max(-1, self._table[self.cap][0])

    def decide(self, failures: int, trials: int) -> tuple[Verdict, bool]:
        """The verdict after ``trials`` runs with ``failures``, and whether the test stops there.

        Stops ``UNDECIDED`` once acceptance is out of reach within ``cap`` (or at ``cap``); a cap too low to accept
        anything runs to the end unless rejected, its runs still evidence of failures. The exact error is
        computed for the looks (:attr:`looks`); a count between them (blocks run in another order) is judged by
        the same boundaries at that count."""
        if not 0 < trials <= self.cap:
            raise ValueError(f"{trials} runs is outside this test's 1..{self.cap}")
        if trials in self._table:
            accept, reject = self._table[trials]
        else:
            accept, reject = (int(b[0]) for b in self._boundaries(self.shift, [trials]))
        if failures <= accept:
            return Verdict.VALID, True
        if failures >= reject:
            return Verdict.INVALID, True
        return Verdict.UNDECIDED, 0 <= self.tolerated < failures or trials == self.cap

    def power_line(self) -> str:
        """The one sentence a report gives of the test's power."""
        if not self.can_accept:
            return (f"With this cap ({self.cap} runs) no configuration can be accepted at a failure rate of at most "
                    f"{self.max_failure_rate:.0%} and {self.confidence:.0%} confidence: the verdicts only rule "
                    "configurations out (a profile with more runs can accept).")
        p = self.operating(self.powered_rate)[0]
        q = self.operating(self.max_failure_rate)[0]
        return (f"With this cap ({self.cap} runs), a configuration that fails {self.powered_rate:.1%} of runs is "
                f"accepted with probability {p:.2f}, and one that fails {self.max_failure_rate:.0%} with at most "
                f"{q:.2f} (sequential probability ratio test, docs/calibration.md).")
