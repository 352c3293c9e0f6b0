"""The application-agnostic tolerance: when an approximated NN errs "no more than its reference", as a test.

Accuracy-preserving compression keeps each NN's error at its reference's. A candidate's
error is measured on a finite validation set, so "no more" must be judged at that set's
noise, or which candidates pass is luck: a 2 % bound on a point estimate is smaller than
what resampling the same frames moves it by. The rule here:

- The candidate and the reference err on the **same validation frames**, so their errors
  are compared *paired*: each resample takes the same frames for both, and the noise of
  the frames both find hard cancels.
- Frames of one validation sequence are correlated (consecutive images of one drive), so
  the resampling unit is a **block** of :data:`BLOCK_FRAMES` consecutive frames of one
  sequence (a non-overlapping block bootstrap), never a single frame: the interval is then
  as wide as the data's real information, not as wide as its frame count pretends.
- The statistic is ``metric(candidate) - metric(reference)`` on the resampled frames, and
  the test is on its one-sided upper confidence bound (:data:`CONFIDENCE`, a percentile of
  :data:`RESAMPLES` paired resamples): the candidate is within tolerance when even the
  pessimistic end of its excess error is inside the bound.
- **Continuous metrics** (``l1``, ``mse``, ``rmse``): the bound is relative,
  ``UCB <= tolerance * reference error`` (:data:`RELATIVE_TOLERANCE` unless the spec sets
  ``nns.<name>.agnostic_tolerance``). ``l1`` and ``mse`` are means of per-frame terms and
  ``rmse`` a smooth function of one, so the block bootstrap's percentile is sound for them.
- ``max_abs`` is an extreme, not a mean: no resample exceeds the sample's largest value, so
  a bootstrap of a maximum is known to be inconsistent (its interval is too narrow). Its
  bound is judged on the point difference, which claims no more than the data gives.
- **Rate metrics** (``miss_rate``, ``false_alarm_rate``): the bound is absolute, in rate
  points, ``UCB(rate(candidate) - rate(reference)) <= tolerance`` (:data:`RATE_TOLERANCE`,
  half a point, unless the spec sets it). A relative bound means nothing for a near-perfect
  detector: at a reference miss rate of 0.1 %, 2 % of it allows not one extra missed frame,
  so the "agnostic" configuration could only ever be the reference itself.

Build-to-build spread (the same knobs fine-tuned again on a GPU erring differently) is not
added: each candidate is judged on the one build the run made and uses; a spec that wants
room for rebuilds widens ``agnostic_tolerance``.

A test at a bound is only as sharp as its data. A candidate whose point excess is inside the
bound but whose upper bound is not is **unresolved** (:attr:`Judgement.unresolved`): the
validation set cannot tell it from one outside. The interval's half-width shrinks with the
square root of the data, so :meth:`Judgement.data_needed` says how many times the validation
frames would resolve it; past :data:`PRACTICAL_DATA_FACTOR` times, only a wider bound would.
Where every candidate is unresolved or outside, the baseline is the reference itself and
"aware over agnostic" measures aware over uncompressed: the result and report say so,
naming the NN's data and tolerance as the fix (:mod:`qaopt.agnostic`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from qaopt.app_spec.nn_errors import class_codes, error_metric, is_class_metric

RELATIVE_TOLERANCE = 0.02
"""A continuous metric's default bound: the candidate's excess error at most 2 % of the reference's."""
RATE_TOLERANCE = 0.005
"""A rate metric's default bound: the candidate's excess rate at most half a rate point (0.005)."""
CONFIDENCE = 0.95
"""The one-sided confidence of the upper bound the rule is judged on."""
RESAMPLES = 2000
"""Paired block-bootstrap resamples behind each upper bound."""
BLOCK_FRAMES = 25
"""Consecutive frames of one sequence a resampled block holds: about a second of a 25 Hz camera, longer than the span
over which one drive's consecutive frames err alike."""
BOOTSTRAP_SEED = 0
"""The resampling's seed: a candidate's verdict is the same in every run and every worker."""
PRACTICAL_DATA_FACTOR = 100.0
"""Past this many times the validation data, more data is no fix a user can make: a candidate whose point excess sits
that close to its bound (the ResNet-18 real result's unresolved distance trial needs about 75,800x:
docs/benchmarks/real_result.json, ``agnostic_unresolved.distance.data_needed``) is decided only by the bound
itself, and the advice says so (``UnresolvedTrial.describe``)."""


RULE = (f"an NN is within tolerance when the upper {CONFIDENCE:.0%} confidence bound of its error's excess over the "
        "reference NN's (the two paired on the same validation frames, resampled in blocks of "
        f"{BLOCK_FRAMES} consecutive frames of one sequence, {RESAMPLES} resamples) is at most its bound: a share of "
        "the reference error for l1 / mse / rmse (max_abs: on the point difference, as a bootstrap of a maximum is "
        "too narrow), rate points for miss and false-alarm rates")
"""The rule in words, as results and reports state it."""


@dataclass(frozen=True)
class Tolerance:
    """One NN's agnostic bound: ``bound`` relative to its reference error, or, for a rate metric, in rate points."""

    metric: str
    bound: float

    @classmethod
    def default(cls, metric: str, bound: float | None = None) -> Tolerance:
        """The bound a spec gives (``nns.<name>.agnostic_tolerance``), else the metric kind's default."""
        if bound is None:
            bound = RATE_TOLERANCE if is_class_metric(metric) else RELATIVE_TOLERANCE
        return cls(metric, bound)

    @property
    def absolute(self) -> bool:
        """Whether the bound is in the metric's own unit (rate points) rather than relative to the reference."""
        return is_class_metric(self.metric)

    def allowed(self, reference_error: float) -> float:
        """The excess error (in the metric's unit) a candidate may have over a reference that errs ``reference_error``."""
        return self.bound if self.absolute else self.bound * reference_error

    def describe(self) -> str:
        """``+0.5 rate points`` or ``2 % of the reference error``, as reports say it."""
        return f"+{self.bound * 100:.3g} rate points" if self.absolute else f"{self.bound:.1%} of the reference error"


@dataclass(frozen=True)
class Judgement:
    """One candidate's error against its reference's: the excess, its upper bound, and the verdict."""

    reference: float
    candidate: float
    excess: float
    """``candidate - reference``, the point difference."""
    ucb: float
    """The one-sided upper confidence bound of the excess (:data:`CONFIDENCE`)."""
    allowed: float
    frames: int = 0
    """Validation frames both errors were measured on (the candidate's)."""
    blocks: int = 0
    """Resampling blocks those frames make (:data:`BLOCK_FRAMES` consecutive frames of one sequence)."""

    @property
    def within(self) -> bool:
        return self.ucb <= self.allowed

    @property
    def unresolved(self) -> bool:
        """Inside the bound by its point excess, outside by its upper bound: the data cannot decide at this bound."""
        return self.excess <= self.allowed < self.ucb

    def data_needed(self) -> float:
        """How many times this validation data would put the upper bound at the allowed excess (the half-width
        ``ucb - excess`` shrinks as one over the square root of the data): 1 when within, inf when even the point
        excess is outside."""
        if self.within:
            return 1.0
        if self.excess >= self.allowed:
            return float("inf")
        return ((self.ucb - self.excess) / (self.allowed - self.excess)) ** 2

    def violation(self, tolerance: Tolerance) -> float:
        """How far outside, on the bound's scale (<= 0 within): relative to the reference error, or to the bound for a
        rate; Optuna's constraint value."""
        scale = max(self.allowed if tolerance.absolute else self.reference, 1e-12)
        return (self.ucb - self.allowed) / scale


def judge(tolerance: Tolerance, candidate: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> Judgement:
    """Whether a candidate's per-frame errors (``residuals``, one array per validation sequence; confusion codes for a
    rate metric) stay within ``tolerance`` of its reference's on the same frames: the rule of the module docstring."""
    c, r = _flat(candidate), _flat(reference)
    point_c, point_r = error_metric(tolerance.metric, c), error_metric(tolerance.metric, r)
    excess = point_c - point_r
    resampled = tolerance.metric != "max_abs" and c.size and r.size
    ucb = _excess_ucb(tolerance.metric, candidate, reference) if resampled else excess
    return Judgement(point_r, point_c, excess, max(ucb, excess), tolerance.allowed(point_r), frames=int(c.size),
                     blocks=len(_blocks(candidate)))


def _flat(sequences: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.zeros(0), *(np.ravel(np.asarray(s, dtype=np.float64)) for s in sequences)])


def _blocks(sequences: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each sequence cut into blocks of :data:`BLOCK_FRAMES` consecutive frames (a sequence's last block may be shorter)."""
    return [np.ravel(np.asarray(s, dtype=np.float64))[i:i + BLOCK_FRAMES]
            for s in sequences for i in range(0, np.size(s), BLOCK_FRAMES)]


def _sums(metric: str, blocks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per block, the numerator and denominator whose ratio (over any set of blocks) is the metric (before rmse's root):
    sum |r| and frames (l1), sum r^2 and frames (mse, rmse), errors and conditioning frames (a rate)."""
    if is_class_metric(metric):
        err, ok = class_codes(metric)
        return (np.array([np.count_nonzero(b == err) for b in blocks], dtype=np.float64),
                np.array([np.count_nonzero((b == err) | (b == ok)) for b in blocks], dtype=np.float64))
    terms = np.abs if metric == "l1" else np.square
    return np.array([terms(b).sum() for b in blocks]), np.array([b.size for b in blocks], dtype=np.float64)


def _excess_ucb(metric: str, candidate: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> float:
    """The :data:`CONFIDENCE` percentile of ``metric(candidate) - metric(reference)`` over paired block resamples.

    Paired when both err on the same frames (the same sequence lengths): one draw of blocks serves both. Otherwise
    (errors measured on different frames) each side is resampled on its own, which is wider but still honest.
    """
    blocks_c, blocks_r = _blocks(candidate), _blocks(reference)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    paired = [np.size(s) for s in candidate] == [np.size(s) for s in reference]

    def draws(n: int) -> np.ndarray:  # how often each block is drawn, per resample
        return rng.multinomial(n, np.full(n, 1.0 / n), size=RESAMPLES).astype(np.float64)

    counts_c = draws(len(blocks_c))
    counts_r = counts_c if paired else draws(len(blocks_r))
    stat_c = _statistic(metric, counts_c, *_sums(metric, blocks_c))
    stat_r = _statistic(metric, counts_r, *_sums(metric, blocks_r))
    return float(np.quantile(stat_c - stat_r, CONFIDENCE))


def _statistic(metric: str, counts: np.ndarray, numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """The metric of each resample (``counts``: resamples x blocks)."""
    num, den = counts @ numerator, counts @ denominator
    value = np.divide(num, den, out=np.zeros_like(num), where=den > 0)  # a rate with no conditioning frame is 0
    return np.sqrt(value) if metric == "rmse" else value
