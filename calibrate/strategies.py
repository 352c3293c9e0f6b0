"""Region search strategies: which point of the error space to evaluate next.

A strategy works in the unit cube and speaks ask/tell (as Optuna's samplers do):
``ask()`` proposes a point (``None`` when nothing is left worth evaluating) and
``tell(x, valid, passes, failures)`` reports its outcome (``valid`` is ``None`` when
the evaluation failed) with the runs behind it. The driver evaluates the reference
point (the origin of the cube) before the first ask, tells evidence (field runs, a
resumed run) too, and, for strategies that judge points one at a time, answers
points whose label monotonicity already implies without spending budget, so a
strategy never has to know where a label came from.

A strategy that also has ``more(x, passes, failures)`` decides how many runs each
point gets (it is asked after every seed block); the others get the acceptance
test's sequential verdict per point.

- ``bisect``: ApproxCaliper's baseline. Binary search along the diagonal of the
  largest unresolved box for the boundary, then split the box at the boundary
  point into its mixed sub-boxes (2 in 2-D, ``2^d - 2`` in d-D).
- ``monotone``: N-D monotone boundary search. Each query is the unresolved point
  that maximizes the unresolved volume removed in the worse of its two outcomes
  (valid removes what it dominates, invalid what dominates it): a generalized
  binary search whose guarantee does not depend on a model being right.
- ``active``: uncertainty sampling with a scikit-learn probabilistic classifier
  kept monotone by the certain labels (:class:`MonotoneProbability`); it queries
  unresolved points that the classifier is unsure of and that would resolve much
  volume whatever the answer; its region is the classifier's, not only the
  certified staircase.
- ``boundary``: for the pooled region (:mod:`qaopt.calibrate.pooled`). It fits the
  pooled model to every run so far, asks the point whose validity the model is
  least sure of, and keeps adding seed blocks there only while the model stays
  unsure of it: a few runs where the verdict is clear, many on the boundary.

The names a spec may write in ``calibration.strategy`` (and ``qaopt calibrate
--strategy``) are those of :data:`STRATEGIES`, an open registry: the four above
register themselves at the end of this module, and a plugin module registers its
own with :func:`register_strategy` (docs/extending.md, "Adding a region strategy or
certifier").
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Generator
from typing import TYPE_CHECKING, Protocol

import numpy as np
from scipy.stats import qmc

from qaopt.calibrate.classifier import MonotoneProbability
from qaopt.calibrate.dominance import Dominance
from qaopt.calibrate.errors import CalibrationError
from qaopt.calibrate.registry import Registry

if TYPE_CHECKING:
    from qaopt.calibrate.acceptance import AcceptanceTest


class Strategy(Protocol):
    def ask(self) -> np.ndarray | None: ...

    def tell(self, x: np.ndarray, valid: bool | None, passes: int = 0, failures: int = 0) -> None: ...


class StrategyFactory(Protocol):
    """Builds a strategy for one search: the space's dimension, the search's seed, and its acceptance test.

    The acceptance test is there for strategies that decide how many runs a point gets
    (``boundary``); the others ignore what they do not use.
    """

    def __call__(self, dim: int, seed: int, acceptance: AcceptanceTest | None) -> Strategy: ...


STRATEGIES: Registry[StrategyFactory] = Registry(
    "region strategy", "calibration.strategy",
    "register one with qaopt.calibrate.register_strategy(name, factory) in a module the spec names in "
    "plugins: [module] (see docs/extending.md, 'Adding a region strategy or certifier')")
"""Every region strategy a spec may name, in registration order (the built-ins first)."""


def register_strategy(name: str, factory: StrategyFactory) -> StrategyFactory:
    """Make ``name`` a strategy a spec (``calibration.strategy``) or ``qaopt calibrate --strategy`` can use."""
    return STRATEGIES.register(name, factory)


def unregister_strategy(name: str) -> None:
    """Remove the strategy ``name`` (a test's, a plugin's); unknown names are ignored."""
    STRATEGIES.unregister(name)


class _Told:
    """The labels told so far; failed points are remembered so they are not asked again."""

    def __init__(self, dim: int):
        self.dim = dim
        self.X: list[np.ndarray] = []
        self.y: list[bool] = []
        self.failed: list[np.ndarray] = []

    def tell(self, x: np.ndarray, valid: bool | None, passes: int = 0, failures: int = 0) -> None:
        x = np.asarray(x, dtype=float)
        if valid is None:
            self.failed.append(x)
        else:
            self.X.append(x)
            self.y.append(bool(valid))

    def dominance(self) -> Dominance:
        return Dominance.from_labels(np.reshape(self.X, (-1, self.dim)), np.array(self.y, dtype=bool))


class BisectSearch(_Told):
    """ApproxCaliper's diagonal bisection; ``depth`` halvings of each box's diagonal.

    A failed evaluation is taken as invalid for the bisection's next step (the
    conservative reading); the region itself ignores it.
    """

    def __init__(self, dim: int, depth: int = 3, min_volume: float = 1e-6):
        super().__init__(dim)
        self.depth, self.min_volume = depth, min_volume
        self._gen = self._search()
        self._pending: np.ndarray | None = None
        self._answer: bool | None = None
        self._started = False

    def _search(self) -> Generator[np.ndarray, bool, None]:
        tie = itertools.count()
        heap = [(-1.0, next(tie), np.zeros(self.dim), np.ones(self.dim))]
        while heap:
            neg_vol, _, lo, hi = heapq.heappop(heap)
            if -neg_vol < self.min_volume:
                return
            dom = self.dominance()
            if dom.implied(lo) is False or dom.implied(hi) is True:
                continue  # the box is resolved already
            t_lo, t_hi = 0.0, 1.0
            for _ in range(self.depth):
                t = (t_lo + t_hi) / 2
                if (yield lo + t * (hi - lo)):
                    t_lo = t
                else:
                    t_hi = t
            c = lo + (t_lo + t_hi) / 2 * (hi - lo)
            for upper in itertools.product((False, True), repeat=self.dim):
                if all(upper) or not any(upper):
                    continue
                b_lo, b_hi = np.where(upper, c, lo), np.where(upper, hi, c)
                heapq.heappush(heap, (-float(np.prod(b_hi - b_lo)), next(tie), b_lo, b_hi))

    def ask(self) -> np.ndarray | None:
        try:
            if not self._started:
                self._started = True
                self._pending = next(self._gen)
            elif self._pending is None:
                return None
            return self._pending
        except StopIteration:
            self._pending = None
            return None

    def tell(self, x: np.ndarray, valid: bool | None, passes: int = 0, failures: int = 0) -> None:
        super().tell(x, valid)
        if self._pending is not None and np.allclose(x, self._pending):
            try:
                self._pending = self._gen.send(bool(valid))
            except StopIteration:
                self._pending = None


class MonotoneSearch(_Told):
    """Maximin-volume queries over a Sobol sample of the cube (``n_samples`` points)."""

    def __init__(self, dim: int, n_samples: int = 4096, n_candidates: int = 1024, seed: int = 0):
        super().__init__(dim)
        self.samples = qmc.Sobol(dim, scramble=True, seed=seed).random(n_samples)
        self.n_candidates = n_candidates
        self.rng = np.random.default_rng(seed)

    def _unresolved(self) -> tuple[np.ndarray, np.ndarray]:
        """Unresolved samples, and the candidates among them (never a failed point)."""
        U = self.samples[self.dominance().labels(self.samples) == 0]
        C = U
        if self.failed:
            F = np.asarray(self.failed)
            C = C[~(np.abs(C[:, None, :] - F[None]) < 1e-9).all(2).any(1)]
        if len(C) > self.n_candidates:
            C = C[np.sort(self.rng.choice(len(C), self.n_candidates, replace=False))]
        return U, C

    @staticmethod
    def _volumes(U: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unresolved samples each candidate would resolve if valid / if invalid."""
        below = (U[None, :, :] <= C[:, None, :]).all(2).sum(1)
        above = (U[None, :, :] >= C[:, None, :]).all(2).sum(1)
        return below.astype(float), above.astype(float)

    def ask(self) -> np.ndarray | None:
        U, C = self._unresolved()
        if len(C) == 0:
            return None
        below, above = self._volumes(U, C)
        return C[int(np.argmax(np.minimum(below, above)))]


class ActiveSearch(MonotoneSearch):
    """Uncertainty sampling: maximize ``p(1-p)`` times the volume the answer resolves in the worse case.

    The volume factor keeps it from asking uncertain points that would settle
    almost nothing (points at the edge of the space); taking the worse outcome
    rather than the expectation keeps a wrong classifier from steering it there.

    ``estimator`` is any scikit-learn classifier with ``predict_proba`` (default: a
    Gaussian-process classifier). Until both outcomes are seen it queries as
    :class:`MonotoneSearch` does.
    """

    def __init__(self, dim: int, estimator=None, seed: int = 0, **kwargs):
        super().__init__(dim, seed=seed, **kwargs)
        self.estimator, self.seed = estimator, seed

    def ask(self) -> np.ndarray | None:
        if len(set(self.y)) < 2:
            return super().ask()
        U, C = self._unresolved()
        if len(C) == 0:
            return None
        model = MonotoneProbability(self.estimator, seed=self.seed).fit(np.asarray(self.X), np.asarray(self.y))
        p = model.predict_proba(C)
        below, above = self._volumes(U, C)
        return C[int(np.argmax(p * (1 - p) * np.minimum(below, above)))]


CERTAIN = 0.999
"""A point stops getting runs once the model is this sure that it is valid (or ``confidence`` sure that it is not).

Sure enough to certify is more than the point-wise ``confidence``: the pooled certifier
holds its confidence for the region as a whole, so its threshold on P(valid) sits
higher, and a point the model believes valid at 90 % still moves the certified boundary
when it gets more runs. On CropFollow's 2-D space at 20 evaluations, stopping at
``confidence`` agreed with the dense truth on 94.3 % of it; running on to this level gives
95.4 %, above the per-point ceiling, for about 1.4 times the runs (docs/BENCHMARKS.md,
Calibration)."""


class BoundarySearch:
    """Active choice of points *and* of runs per point, driven by the pooled model.

    ``ask`` fits :class:`~qaopt.calibrate.pooled.PooledCertifier` to every run told so
    far and returns the Sobol candidate whose posterior P(valid) is closest to 1/2
    (the model is least sure of it), away from points already evaluated; ``more``
    keeps a point running, a block at a time, while the model's P(valid) there stays
    between ``1 - confidence`` and :data:`CERTAIN` and the point has fewer than
    ``max_runs`` runs.
    """

    def __init__(self, dim: int, max_failure_rate: float, confidence: float, max_runs: int,
                 n_candidates: int = 1024, seed: int = 0, spacing: float = 0.02):
        self.dim, self.max_failure_rate, self.confidence, self.max_runs = dim, max_failure_rate, confidence, max_runs
        self.candidates = qmc.Sobol(dim, scramble=True, seed=seed).random(n_candidates)
        self.spacing = spacing
        self.points: dict[tuple, list] = {}  # rounded point -> [x, passes, failures]

    def _model(self, extra: tuple[np.ndarray, int, int] | None = None):
        from qaopt.calibrate.pooled import PooledCertifier

        rows = [list(v) for v in self.points.values() if v[1] + v[2] > 0]
        if extra is not None:
            rows.append(list(extra))
        X = np.array([r[0] for r in rows]).reshape(-1, self.dim)
        n = np.array([r[1] + r[2] for r in rows])
        k = np.array([r[2] for r in rows])
        return PooledCertifier(X, n, k, self.max_failure_rate, self.confidence)

    def ask(self) -> np.ndarray | None:
        if not any(v[1] + v[2] for v in self.points.values()):
            return np.zeros(self.dim)
        p = self._model().predict_proba(self.candidates)
        score = p * (1 - p)
        if self.points:
            X = np.array([v[0] for v in self.points.values()])
            near = (np.abs(self.candidates[:, None, :] - X[None]).max(2) < self.spacing).any(1)
            score = np.where(near, -1.0, score)
        best = int(np.argmax(score))
        return None if score[best] <= 0 else self.candidates[best]

    def more(self, x: np.ndarray, passes: int, failures: int) -> bool:
        """Whether point ``x``, with these runs so far, deserves another block."""
        if passes + failures >= self.max_runs:
            return False
        known = self.points.get(tuple(np.round(x, 9)))
        if known is not None:
            passes, failures = passes + known[1], failures + known[2]
        p = float(self._model((np.asarray(x, dtype=float), passes, failures)).predict_proba(x[None])[0])
        return 1 - self.confidence < p < CERTAIN

    def tell(self, x: np.ndarray, valid: bool | None, passes: int = 0, failures: int = 0) -> None:
        x = np.asarray(x, dtype=float)
        entry = self.points.setdefault(tuple(np.round(x, 9)), [x, 0, 0])
        entry[1] += passes
        entry[2] += failures


def make_strategy(name: str, dim: int, seed: int = 0, acceptance: AcceptanceTest | None = None) -> Strategy:
    """A strategy by its spec/CLI name (``boundary`` needs the acceptance test it allocates runs for)."""
    return STRATEGIES.lookup(name)(dim, seed, acceptance)


def _boundary(dim: int, seed: int, acceptance: AcceptanceTest | None) -> BoundarySearch:
    if acceptance is None:
        raise CalibrationError("calibration.strategy: 'boundary' decides how many runs each point gets, so it "
                               "needs the acceptance test (qos.acceptance) it allocates them for")
    return BoundarySearch(dim, acceptance.max_failure_rate, acceptance.confidence, acceptance.max_trials, seed=seed)


register_strategy("bisect", lambda dim, seed, acceptance: BisectSearch(dim))
register_strategy("monotone", lambda dim, seed, acceptance: MonotoneSearch(dim, seed=seed))
register_strategy("active", lambda dim, seed, acceptance: ActiveSearch(dim, seed=seed))
register_strategy("boundary", _boundary)
