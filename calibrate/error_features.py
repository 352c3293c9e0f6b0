"""Error features: the few numbers that say how an NN's errors look to a controller.

A controller shrugs off white noise of a size that crashes it when the same error
persists for a second, so an NN's error metric alone (its ``level``) does not say
whether the application survives it. :func:`measure_features` characterises an NN's
residual sequences (``prediction - truth``, time-ordered, one array per drive, in
the output's unit) by what matters in the loop:

- ``level``: the spec's error metric (:func:`qaopt.app_spec.nn_errors.error_metric`),
  the coordinate of the NN's point in the error space;
- ``bias`` and ``sigma``: mean and standard deviation of the residuals;
- ``gain``: the least-squares slope of residual on true value (an NN that
  under-reads large values errs most where the controller needs it); 0 without truths;
- ``correlation_steps``: how many perception steps an error persists, from the
  pooled lag-1 autocorrelation of the residuals less their gain term;
- ``burst_share``, ``burst_steps``, ``burst_level``: how often, how long and how far
  the error leaves its core (see :data:`BURST_THRESHOLD`).

The same function measures a candidate NN's residuals and the errors an error model
injects, so "the candidate's point" and "the injected point" mean the same thing;
:class:`~qaopt.calibrate.error_models.Shaped` is fitted from these features.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from qaopt.app_spec.nn_errors import check_metric, error_metric, is_class_metric
from qaopt.calibrate.errors import CalibrationError

MIN_FRAMES = 50
"""Fewest residuals to characterise: below that a lag-1 autocorrelation or a burst share is noise."""

BURST_THRESHOLD = 4.0
"""A frame is in a burst when its residual is more than this many core sigmas from the core's centre.

Four, not three: a Gaussian puts 6e-5 of its frames beyond 4 sigmas (0.3 % beyond 3),
so noise without bursts measures ``burst_share`` ~ 0, and an error model's Gaussian
core does not add bursts of its own to those it was fitted to.
"""

MAD_TO_SIGMA = 1.4826
"""Median absolute deviation -> standard deviation of a Gaussian: the robust first guess of the core."""

MAX_CLIP_ITERATIONS = 50
"""Sigma clipping stops here if the core has not settled (it settles in a few iterations)."""

MAX_LAG1 = 0.999
"""Largest lag-1 autocorrelation used: keeps the correlation time finite (at most ~1000 steps)."""


@dataclass(frozen=True)
class ErrorFeatures:
    """How residual sequences err, in the output's unit unless said otherwise.

    ``level``: the metric ``metric`` of the residuals. ``bias``: their mean.
    ``sigma``: their standard deviation. ``gain``: slope of residual on truth (0
    without truths). ``correlation_steps``: ``-1 / ln(rho)`` for the pooled lag-1
    autocorrelation ``rho`` of the residuals less the gain term (0 for ``rho <= 0``).
    ``burst_share``: fraction of frames in bursts (see :data:`BURST_THRESHOLD`).
    ``burst_steps``: mean length of a burst (consecutive burst frames of one sign),
    in perception steps. ``burst_level``: mean distance of burst frames from the
    core's centre; absolute (the output's unit), so it reads like ``bias`` and
    ``sigma`` ("bursts reach 9 degrees") and scales with them. ``frames``: how many
    residuals were measured.
    """

    metric: str
    level: float
    bias: float
    sigma: float
    gain: float
    correlation_steps: float
    burst_share: float
    burst_steps: float
    burst_level: float
    frames: int

    def to_json(self) -> dict[str, float | int | str]:
        """The features as a flat JSON-able dict, for reports."""
        return asdict(self)


@dataclass(frozen=True)
class ResidualAnalysis:
    """The features and the decomposition behind them, which an error model is fitted to.

    ``centre`` and ``core_sigma``: mean and standard deviation of the core (the
    non-burst frames) of the residuals less their gain term; ``rho``: the lag-1
    autocorrelation behind ``correlation_steps``; ``burst_deviations``: the signed
    distance from ``centre`` of every burst frame; ``truth_centre``: the mean truth
    (0 without truths), the point the gain term is measured from; ``truths``: the
    validated truth sequences (zeros without truths), one per residual sequence.
    """

    features: ErrorFeatures
    centre: float
    core_sigma: float
    rho: float
    burst_deviations: np.ndarray
    truth_centre: float
    truths: tuple[np.ndarray, ...]


def lag1_autocorrelation(seqs: Sequence[np.ndarray]) -> float:
    """Pooled lag-1 autocorrelation of the centred sequences (pairs never cross sequences).

    Clipped to ``[0, MAX_LAG1]``: error models read it as an AR(1) coefficient.
    """
    mean = np.concatenate(seqs).mean()
    num = sum(float(np.dot(r[:-1] - mean, r[1:] - mean)) for r in seqs if r.size > 1)
    den = sum(float(np.dot(r - mean, r - mean)) for r in seqs)
    return float(np.clip(num / den, 0.0, MAX_LAG1)) if den > 0 else 0.0


def measure_features(
    residuals: Sequence[np.ndarray],
    truths: Sequence[np.ndarray] | None = None,
    metric: str = "l1",
    nn: str | None = None,
) -> ErrorFeatures:
    """The :class:`ErrorFeatures` of residual sequences (and the true values beside them, when given).

    Raises :class:`CalibrationError` (prefixed ``nns.<nn>:`` when ``nn`` is given)
    for fewer than :data:`MIN_FRAMES` residuals, NaN or infinite values, residuals
    that are all equal, and truths that do not line up with the residuals.
    """
    return analyse_residuals(residuals, truths, metric, nn).features


def analyse_residuals(
    residuals: Sequence[np.ndarray],
    truths: Sequence[np.ndarray] | None = None,
    metric: str = "l1",
    nn: str | None = None,
) -> ResidualAnalysis:
    """:func:`measure_features` with the decomposition behind the features (see :class:`ResidualAnalysis`)."""
    check_metric(metric)
    if is_class_metric(metric):
        raise CalibrationError(
            f"{f'nns.{nn}: ' if nn else ''}error features describe regression residuals; a {metric!r} NN's per-frame "
            "errors are confusion codes, described by qaopt.calibrate.confusion.burst_statistics (rates and burst "
            "lengths of misses and false alarms)")
    seqs, truth_seqs = _validated(residuals, truths, f"nns.{nn}: " if nn else "")
    e, x = np.concatenate(seqs), np.concatenate(truth_seqs)
    x_centre = float(x.mean())
    x_var = float(np.mean((x - x_centre) ** 2))
    # A constant truth leaves the slope undefined: no truth dependence can be seen.
    gain = float(np.mean((x - x_centre) * (e - e.mean())) / x_var) if x_var > 0 else 0.0
    detrended = [r - gain * (t - x_centre) for r, t in zip(seqs, truth_seqs)]
    d = np.concatenate(detrended)
    centre, core_sigma, core = _core(d)
    deviation = d - centre
    burst = ~core
    starts = _run_starts(burst, np.sign(deviation), [r.size for r in seqs])
    runs = int(starts.sum())
    rho = lag1_autocorrelation(detrended)
    features = ErrorFeatures(
        metric=metric,
        level=error_metric(metric, e),
        bias=float(e.mean()),
        sigma=float(e.std()),
        gain=gain,
        correlation_steps=-1.0 / math.log(rho) if rho > 0 else 0.0,
        burst_share=float(burst.mean()),
        burst_steps=float(burst.sum() / runs) if runs else 0.0,
        burst_level=float(np.abs(deviation[burst]).mean()) if runs else 0.0,
        frames=int(e.size),
    )
    return ResidualAnalysis(features, centre, core_sigma, rho, deviation[burst], x_centre, tuple(truth_seqs))


def _validated(
    residuals: Sequence[np.ndarray], truths: Sequence[np.ndarray] | None, where: str
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Flat float residual and truth sequences (zeros without truths), or a CalibrationError saying the fix."""
    seqs = [np.asarray(r, dtype=float).ravel() for r in residuals]
    if truths is None:
        truth_seqs = [np.zeros_like(r) for r in seqs]
    else:
        truth_seqs = [np.asarray(t, dtype=float).ravel() for t in truths]
        lengths, truth_lengths = [r.size for r in seqs], [t.size for t in truth_seqs]
        if lengths != truth_lengths:
            raise CalibrationError(
                f"{where}truths do not line up with the residuals: {len(truth_lengths)} truth sequences of "
                f"lengths {_shorten(truth_lengths)} for {len(lengths)} residual sequences of lengths "
                f"{_shorten(lengths)}; give one true value per residual, in the same order"
            )
    frames = sum(r.size for r in seqs)
    if frames < MIN_FRAMES:
        raise CalibrationError(
            f"{where}residuals: {frames} frames, too few to characterise the NN's errors (need at least "
            f"{MIN_FRAMES}); measure the NN on more validation data"
        )
    for name, arrays in (("residuals", seqs), ("truths", truth_seqs)):
        bad = sum(int((~np.isfinite(a)).sum()) for a in arrays)
        if bad:
            raise CalibrationError(
                f"{where}{name}: {bad} of {frames} values are NaN or infinite; fix the NN's measured outputs "
                f"or drop those frames"
            )
    e = np.concatenate(seqs)
    if float(e.std()) == 0.0:
        raise CalibrationError(
            f"{where}residuals: all {frames} residuals equal {float(e[0]):g}, so the NN's error does not vary and "
            f"has no shape to measure; measure the NN on validation data where its outputs err by different amounts"
        )
    return seqs, truth_seqs


def _shorten(values: list[int], keep: int = 5) -> str:
    """A list for a message, cut after ``keep`` items."""
    return str(values) if len(values) <= keep else f"[{', '.join(map(str, values[:keep]))}, ...]"


def _core(d: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The core of residuals by sigma clipping: (centre, sigma, mask of core frames).

    The core is the frames within :data:`BURST_THRESHOLD` sigmas of the centre, where
    centre and sigma are the core's own mean and standard deviation (a fixed point
    reached from the median and the MAD). Unlike the MAD alone, its sigma is the
    spread an error model's core must have, whatever the core's shape; unlike the
    mean and std of all frames, it is not pulled by the bursts.
    """
    centre = float(np.median(d))
    sigma = MAD_TO_SIGMA * float(np.median(np.abs(d - centre))) or float(d.std())
    core = np.abs(d - centre) <= BURST_THRESHOLD * sigma
    for _ in range(MAX_CLIP_ITERATIONS):
        centre, sigma = float(d[core].mean()), float(d[core].std())
        settled = np.abs(d - centre) <= BURST_THRESHOLD * sigma
        if not settled.any() or (settled == core).all():
            break
        core = settled
    return centre, sigma, core


def _run_starts(burst: np.ndarray, sign: np.ndarray, lengths: list[int]) -> np.ndarray:
    """Mask of the frames that start a burst: a burst frame whose predecessor is not one of the same sign
    in the same sequence."""
    continues = np.zeros(burst.size, dtype=bool)
    continues[1:] = burst[:-1] & burst[1:] & (sign[:-1] == sign[1:])
    first = np.cumsum([0, *lengths[:-1]])
    continues[first[first < burst.size]] = False
    return burst & ~continues
