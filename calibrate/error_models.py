"""Error models: how an NN errs, and what its declared error metric is worth.

A point of the error space says how *much* error an NN makes, in the metric its
spec declares (``l1``: mean absolute error, ``rmse``), or as a bias and standard
deviation. An error model says how that error *looks* and builds the
:class:`~qaopt.calibrate.protocols.Injector` that makes a simulated NN err that
way:

- ``gaussian``: independent Gaussian noise per frame, as in ApproxCaliper;
- ``ar1``: Gaussian AR(1) noise, whose consecutive frames err alike;
- ``ar1-profile``: AR(1) noise fitted to the reference NN, plus the reference's own bias where the
  true value is off-nominal (far from the row's centre), injected at every point;
- ``empirical``: a real NN's residuals resampled in blocks;
- ``shaped``: a real NN's error features (:mod:`qaopt.calibrate.error_features`:
  bias, truth dependence, correlation time, bursts) reproduced by a parametric
  process, so a controller meets the persistent, bursty errors real NNs make.

A detector's class metric (``miss_rate``, ``false_alarm_rate``) is injected by the
confusion model of :mod:`qaopt.calibrate.confusion` instead, which
:func:`make_error_model` builds as each model declares (``detector_bursts``).

The names a spec may write in ``calibration.error_model`` are those of
:data:`ERROR_MODELS`, an open registry: each built-in model registers itself with
:func:`register_error_model`, and a plugin module registers its own the same way
(docs/extending.md, "Adding an error model").

The metrics themselves are defined once, in :mod:`qaopt.app_spec.nn_errors`.
``fit`` methods build a model from a real NN's residual sequences (time-
ordered, in the output's unit; ``shaped`` also takes the true values beside them)
so calibration injects errors that look like the NN that will be deployed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol

import numpy as np
from scipy.stats import norm

from qaopt.app_spec.hashing import content_hash
from qaopt.app_spec.nn_errors import CLASS_METRICS, REGRESSION_METRICS, SCALE_DEGREE, error_metric, is_class_metric
from qaopt.calibrate.confusion import DEFAULT_BURST_STEPS, INDEPENDENT, confusion_model
from qaopt.calibrate.error_features import MAX_LAG1, ErrorFeatures, analyse_residuals, lag1_autocorrelation
from qaopt.calibrate.errors import CalibrationError
from qaopt.calibrate.protocols import Injector
from qaopt.calibrate.registry import Registry

# A metric homogeneous in the error's scale (SCALE_DEGREE) lets a target value map exactly onto a
# scale of the error (Gaussian sigma, residual factor). ``max_abs`` is homogeneous too, but an
# episode's maximum grows with its length, so no error model maps a target onto it.
SCALED_METRICS = tuple(k for k in REGRESSION_METRICS if k != "max_abs")
"""The regression metrics the models of this module inject, by scaling the error."""
CALIBRATED_METRICS = SCALED_METRICS + CLASS_METRICS
"""Every metric calibration injects: the scaled regression metrics, and the class metrics, whose rates the
confusion model (:mod:`qaopt.calibrate.confusion`) sets."""


def _check_kind(kind: str) -> None:
    if is_class_metric(kind):
        raise CalibrationError(
            f"nns.*.error_metric.kind '{kind}' is a detector's rate: it is injected by the confusion model "
            "(qaopt.calibrate.confusion, which make_error_model picks for it), not by scaling an error"
        )
    if kind not in SCALED_METRICS:
        raise CalibrationError(
            f"nns.*.error_metric.kind '{kind}' cannot be calibrated (no error model maps a target "
            f"value onto it); use one of {', '.join(CALIBRATED_METRICS)}"
        )


def gaussian_metric(kind: str, bias: float, sigma: float) -> float:
    """The expected metric of N(bias, sigma^2) errors (closed form, so targets map exactly)."""
    _check_kind(kind)
    b, s = abs(float(bias)), float(sigma)
    if kind == "l1":
        if s == 0:
            return b
        return s * math.sqrt(2 / math.pi) * math.exp(-(b**2) / (2 * s**2)) + b * (1 - 2 * norm.cdf(-b / s))
    return b**2 + s**2 if kind == "mse" else math.hypot(b, s)


def scale_for(kind: str, target: float, unit_value: float) -> float:
    """The factor that takes errors whose metric is ``unit_value`` to metric ``target``."""
    return (float(target) / unit_value) ** (1.0 / SCALE_DEGREE[kind])


class ErrorModel(Protocol):
    """Builds injectors for one NN from a point's setting of that NN.

    ``setting`` holds the NN's coordinates of a point: ``{"metric": m}`` or some of
    ``{"bias": b, "sigma": s}``. ``config()`` is the model's identity (JSON-able),
    part of every evaluation's cache key.
    """

    components: frozenset[str]

    def injector(self, setting: Mapping[str, float]) -> Injector: ...

    def config(self) -> dict: ...


class ErrorModelType(Protocol):
    """What :func:`register_error_model` needs of an error model's class: its name, and what it is built from.

    ``name`` is what a spec writes in ``calibration.error_model`` and what ``config()``
    reports as ``"model"``. ``needs_residuals``: the model exists only fitted to a real
    NN's residuals (calibration then measures the reference NNs' on their error data);
    otherwise ``cls(metric=...)`` is its default. ``fit(residuals, metric, truths)``
    builds it from a real NN's residual sequences (``truths``: the true values beside
    them, ``None`` when not measured; a model that does not use them ignores them).
    ``detector_bursts`` says how a detector (an NN with a class metric) errs under the
    model, which the confusion model (:mod:`qaopt.calibrate.confusion`) injects: flips
    in bursts of that many frames on average (1: independent frames), or ``None`` for
    bursts fitted to the reference NN's confusion codes.
    """

    name: str
    needs_residuals: bool
    detector_bursts: float | None

    def __call__(self, *, metric: str) -> ErrorModel: ...

    def fit(self, residuals: Sequence[np.ndarray], metric: str = "l1",
            truths: Sequence[np.ndarray] | None = None) -> ErrorModel: ...


ERROR_MODELS: Registry[ErrorModelType] = Registry(
    "error model", "calibration.error_model",
    "register one with @qaopt.calibrate.register_error_model in a module the spec names in plugins: [module] "
    "(see docs/extending.md, 'Adding an error model')")
"""Every error model a spec may name, in registration order (the built-ins first)."""

_DECLARED = ("name", "needs_residuals", "detector_bursts", "fit")
"""The members an error model's class must declare to be registered (see :class:`ErrorModelType`)."""


def register_error_model(cls: type) -> type:
    """Register an error model's class under its ``name`` (a class decorator; see :class:`ErrorModelType`).

    Missing declarations are refused here, when the plugin is imported, rather than in
    the middle of a calibration.
    """
    missing = [member for member in _DECLARED if not hasattr(cls, member)]
    if missing:
        raise CalibrationError(f"register_error_model: {cls.__name__} does not declare {', '.join(missing)} "
                               "(see qaopt.calibrate.error_models.ErrorModelType)")
    ERROR_MODELS.register(cls.name, cls)
    return cls


def unregister_error_model(name: str) -> None:
    """Remove the error model ``name`` (a test's, a plugin's); unknown names are ignored."""
    ERROR_MODELS.unregister(name)


def _pooled(residuals: Sequence[np.ndarray]) -> list[np.ndarray]:
    seqs = [np.asarray(r, dtype=float).ravel() for r in residuals]
    seqs = [r for r in seqs if r.size]
    if not seqs or sum(r.size for r in seqs) < 2:
        raise CalibrationError("residuals: need at least two residual values to fit an error model")
    if not all(np.isfinite(r).all() for r in seqs):
        raise CalibrationError("residuals: contain NaN or infinite values; fix the NN's measured outputs")
    return seqs


@dataclass
class GaussianInjector:
    """``truth + bias + e_t`` with ``e_t`` stationary N(0, sigma^2), AR(1) with coefficient ``rho``.

    ``rho == 0`` is ApproxCaliper's independent per-frame noise. State is per
    episode of the batch and restarts at ``t == 0``.
    """

    bias: float
    sigma: float
    rho: float = 0.0
    _e: np.ndarray | None = field(default=None, repr=False)

    def __call__(self, truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
        truth = np.asarray(truth, dtype=float)
        fresh = rng.standard_normal(truth.shape) * self.sigma
        if t == 0 or self._e is None or self._e.shape != truth.shape or self.rho == 0:
            self._e = fresh
        else:
            self._e = self.rho * self._e + math.sqrt(1 - self.rho**2) * fresh
        return truth + self.bias + self._e


@register_error_model
@dataclass(frozen=True)
class Gaussian:
    """Independent Gaussian errors per frame (ApproxCaliper's model).

    A target metric ``m`` maps to the ``sigma`` (and ``bias = bias_ratio * sigma``)
    whose expected metric is ``m``: exact, since the metrics are homogeneous in
    (bias, sigma). A ``bias``/``sigma`` setting is used as it is. A detector's flips
    are independent per frame too.
    """

    metric: str = "l1"
    bias_ratio: float = 0.0

    name: ClassVar[str] = "gaussian"
    needs_residuals: ClassVar[bool] = False
    detector_bursts: ClassVar[float | None] = INDEPENDENT
    components = frozenset({"metric", "bias", "sigma"})

    def __post_init__(self) -> None:
        _check_kind(self.metric)

    def parameters(self, setting: Mapping[str, float]) -> tuple[float, float]:
        """(bias, sigma) for a setting."""
        if "metric" in setting:
            s = scale_for(self.metric, setting["metric"], gaussian_metric(self.metric, self.bias_ratio, 1.0))
            return self.bias_ratio * s, s
        return float(setting.get("bias", 0.0)), float(setting.get("sigma", 0.0))

    def injector(self, setting: Mapping[str, float]) -> Injector:
        bias, sigma = self.parameters(setting)
        return GaussianInjector(bias, sigma)

    def config(self) -> dict:
        return {"model": self.name, "metric": self.metric, "bias_ratio": self.bias_ratio}

    @classmethod
    def fit(cls, residuals: Sequence[np.ndarray], metric: str = "l1",
            truths: Sequence[np.ndarray] | None = None) -> Gaussian:
        """Keep a real NN's bias-to-spread ratio; the size comes from each point (``truths`` play no part)."""
        r = np.concatenate(_pooled(residuals))
        sd = float(r.std())
        return cls(metric=metric, bias_ratio=float(r.mean() / sd) if sd > 0 else 0.0)


@register_error_model
@dataclass(frozen=True)
class AR1(Gaussian):
    """Gaussian errors correlated in time: ``e_t = rho e_{t-1} + sqrt(1-rho^2) sigma eps_t``.

    ``correlation_steps`` is the correlation time in perception steps
    (``rho = exp(-1/correlation_steps)``). Marginals equal the Gaussian model's, so
    a target metric maps to the same (bias, sigma); what changes is that errors
    persist over consecutive frames, as a real NN's do on similar images. A
    detector's flips persist as long (:data:`~qaopt.calibrate.confusion.DEFAULT_BURST_STEPS`).
    """

    correlation_steps: float = DEFAULT_BURST_STEPS

    name: ClassVar[str] = "ar1"
    detector_bursts: ClassVar[float | None] = DEFAULT_BURST_STEPS

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.correlation_steps > 0:
            raise CalibrationError("calibration: AR(1) correlation_steps must be > 0")

    @property
    def rho(self) -> float:
        return math.exp(-1.0 / self.correlation_steps)

    def injector(self, setting: Mapping[str, float]) -> Injector:
        bias, sigma = self.parameters(setting)
        return GaussianInjector(bias, sigma, self.rho)

    def config(self) -> dict:
        return {**super().config(), "correlation_steps": self.correlation_steps}

    @classmethod
    def fit(cls, residuals: Sequence[np.ndarray], metric: str = "l1",
            truths: Sequence[np.ndarray] | None = None) -> AR1:
        seqs = _pooled(residuals)
        r = np.concatenate(seqs)
        sd = float(r.std())
        rho = lag1_autocorrelation(seqs)
        return cls(
            metric=metric,
            bias_ratio=float(r.mean() / sd) if sd > 0 else 0.0,
            correlation_steps=-1.0 / math.log(rho) if rho > 0 else 1e-3,
        )


NOMINAL_SHARE = 0.8
"""``ar1-profile``: the central share of the error data's true values, where the reference NN errs at its nominal
bias; beyond it the reference's own bias per truth bin is injected on top of the point's errors."""
PROFILE_QUANTILES = (0.0, 0.01, 0.03, 0.1, 0.25, 0.5, 0.75, 0.9, 0.97, 0.99, 1.0)
"""``ar1-profile``: edges of the truth bins its off-nominal bias is measured in, finer where true values are rare."""
MIN_PROFILE_FRAMES = 3
"""``ar1-profile``: frames a truth bin needs for its bias to count (fewer: the bin is left out)."""


@dataclass
class ProfileInjector:
    """A point's AR(1) errors plus the reference NN's off-nominal bias at each frame's true value."""

    noise: GaussianInjector
    centres: np.ndarray
    excess: np.ndarray

    def __call__(self, truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
        truth = np.asarray(truth, dtype=float)
        return self.noise(truth, rng, t) + np.interp(truth, self.centres, self.excess)


def off_nominal_bias(residuals: Sequence[np.ndarray], truths: Sequence[np.ndarray]
                     ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(bin centres, bias beyond the nominal band) of an NN's residuals by true value (``ar1-profile``).

    The true values are binned at :data:`PROFILE_QUANTILES`; a bin whose centre lies outside the central
    :data:`NOMINAL_SHARE` of them keeps its mean residual less the nominal band's, the others 0."""
    e = np.concatenate([np.asarray(r, dtype=float).ravel() for r in residuals])
    x = np.concatenate([np.asarray(t, dtype=float).ravel() for t in truths])
    if e.shape != x.shape or not e.size:
        raise CalibrationError(f"the true values ({x.size}) must pair with the residuals ({e.size}) one to one")
    centre = float(np.median(x))
    width = float(np.quantile(np.abs(x - centre), NOMINAL_SHARE))
    nominal = float(e[np.abs(x - centre) <= width].mean())
    edges = np.quantile(x, PROFILE_QUANTILES)
    bins = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    centres, excess = [], []
    for i in range(len(edges) - 1):
        inside = bins == i
        if inside.sum() >= MIN_PROFILE_FRAMES:
            c = float(np.median(x[inside]))
            centres.append(c)
            excess.append(float(e[inside].mean()) - nominal if abs(c - centre) > width else 0.0)
    return tuple(centres), tuple(excess)


@register_error_model
@dataclass(frozen=True)
class AR1Profile(AR1):
    """AR(1) errors fitted to the reference NN, plus the reference's own bias where the true value is off-nominal.

    Measured on CropFollow (docs/benchmarks/fidelity_states.json, ``excursions``), real NNs fail the closed loop in
    excursions: a few seconds a run far from the row's centre, where the reference distance NN itself reads the
    robot nearer the centre than it is. Errors injected the same
    everywhere let the simulated robot see perfectly out there, so a region charted with them reaches errors the
    real NNs do not survive. This model injects, at every point, the reference's off-nominal bias
    (:func:`off_nominal_bias`: zero over the central :data:`NOMINAL_SHARE` of the true values) on top of AR(1)
    errors whose bias ratio and correlation time are the reference's own (``ar1``'s defaults are zero and 5
    frames); the point's level sets the AR(1) part's size. Fitted to the reference's residuals on the error data,
    which must then cover off-nominal states (``calibration.error_data.source: dataset``: drives that wander). A
    detector's flips come in bursts as long as the reference's, fitted to its confusion codes.
    """

    centres: tuple[float, ...] = ()
    excess: tuple[float, ...] = ()

    name: ClassVar[str] = "ar1-profile"
    needs_residuals: ClassVar[bool] = True
    detector_bursts: ClassVar[float | None] = None

    def injector(self, setting: Mapping[str, float]) -> Injector:
        noise = super().injector(setting)
        if not self.centres:
            return noise
        return ProfileInjector(noise, np.asarray(self.centres), np.asarray(self.excess))

    def config(self) -> dict:
        return {**super().config(), "centres": list(self.centres), "excess": list(self.excess)}

    @classmethod
    def fit(cls, residuals: Sequence[np.ndarray], metric: str = "l1",
            truths: Sequence[np.ndarray] | None = None) -> AR1Profile:
        """AR(1) fitted as :meth:`AR1.fit` does, and the off-nominal bias of ``residuals`` against ``truths``."""
        if truths is None:
            raise CalibrationError(
                "'ar1-profile' needs the true values beside the reference NN's residuals, to know where it errs "
                "off-nominal; measure the error data with its truths or use 'ar1'")
        noise = AR1.fit(residuals, metric)
        centres, excess = off_nominal_bias(residuals, truths)
        return cls(metric=metric, bias_ratio=noise.bias_ratio, correlation_steps=noise.correlation_steps,
                   centres=centres, excess=excess)


class BlockBootstrapInjector:
    """Replays a pool of residuals in blocks of consecutive frames, scaled by ``scale``.

    Each episode of the batch draws its own random block starts; a block never
    crosses the end of the sequence it came from, so the time structure within a
    block is the real NN's.
    """

    def __init__(self, pool: np.ndarray, starts: np.ndarray, block_length: int, scale: float):
        self.pool, self.starts, self.block_length, self.scale = pool, starts, block_length, scale
        self._pos: np.ndarray | None = None
        self._off: np.ndarray | None = None

    def __call__(self, truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
        truth = np.asarray(truth, dtype=float)
        b = truth.shape[0]
        if t == 0 or self._pos is None or self._pos.shape[0] != b:
            self._pos = rng.choice(self.starts, size=b)
            self._off = np.zeros(b, dtype=int)
        renew = self._off >= self.block_length
        if renew.any():
            self._pos[renew] = rng.choice(self.starts, size=int(renew.sum()))
            self._off[renew] = 0
        res = self.pool[self._pos + self._off] * self.scale
        self._off += 1
        return truth + res.reshape((b,) + (1,) * (truth.ndim - 1))


@register_error_model
class Empirical:
    """A real NN's residual sequences, resampled in blocks and scaled to the target metric.

    The residuals' own metric ``m0`` is measured once; a target ``m`` scales every
    residual by ``m / m0`` (``sqrt`` of it for MSE), so the resampled errors have
    metric ``m`` in expectation, and keeps the NN's bias,
    skew, outliers and temporal correlation. ``block_length`` defaults to the
    larger of ``n^(1/3)`` (the moving-block rule for a mean sequence length ``n``)
    and two correlation times, capped at the shortest usable sequence. A detector's
    ratio and bursts are fitted to the reference's confusion codes.
    """

    name: ClassVar[str] = "empirical"
    needs_residuals: ClassVar[bool] = True
    detector_bursts: ClassVar[float | None] = None
    components = frozenset({"metric"})

    def __init__(self, residuals: Sequence[np.ndarray], metric: str = "l1", block_length: int | None = None):
        _check_kind(metric)
        seqs = _pooled(residuals)
        self.metric = metric
        self.base_metric = error_metric(metric, np.concatenate(seqs))
        if self.base_metric <= 0:
            raise CalibrationError("residuals: all zero, so they cannot be scaled to a target error; "
                                   "measure the NN on data where it errs")
        if block_length is None:
            rho = lag1_autocorrelation(seqs)
            tau = -1.0 / math.log(rho) if rho > 0 else 0.0
            n_mean = float(np.mean([r.size for r in seqs]))
            block_length = max(1, math.ceil(n_mean ** (1 / 3)), math.ceil(2 * tau))
            block_length = min(block_length, max(r.size for r in seqs))
        if block_length < 1:
            raise CalibrationError("residuals: block_length must be >= 1")
        self.block_length = int(block_length)
        self.pool = np.concatenate(seqs)
        offsets = np.cumsum([0] + [r.size for r in seqs])
        starts = [np.arange(o, o + r.size - self.block_length + 1) for o, r in zip(offsets, seqs)
                  if r.size >= self.block_length]
        self.starts = np.concatenate(starts)
        self._key = content_hash(self.pool.round(12).tobytes(), [r.size for r in seqs])

    def injector(self, setting: Mapping[str, float]) -> Injector:
        if set(setting) != {"metric"}:
            raise CalibrationError(
                "calibration: the empirical error model calibrates an NN's metric only; "
                "use component 'metric' (or the gaussian/ar1 model for bias/sigma axes)"
            )
        return BlockBootstrapInjector(self.pool, self.starts, self.block_length,
                                      scale_for(self.metric, setting["metric"], self.base_metric))

    def config(self) -> dict:
        return {"model": self.name, "metric": self.metric, "block_length": self.block_length,
                "residuals": self._key}

    @classmethod
    def fit(cls, residuals: Sequence[np.ndarray], metric: str = "l1",
            truths: Sequence[np.ndarray] | None = None) -> Empirical:
        """The residuals themselves are the model (``truths`` play no part)."""
        return cls(residuals, metric)


TRUTH_BAND = (0.01, 0.99)
"""Quantiles of the fitted true values between which the shaped model's truth dependence holds."""
MAX_BURST_AMPLITUDES = 64
"""A shaped model keeps at most this many burst amplitudes (quantiles of the measured ones), so that its
``config()`` lists every parameter and stays small."""


class ShapedInjector:
    """``truth + scale * (offset + gain (truth - truth_centre) + y_t)``; ``y_t`` is the core or a burst.

    ``y_t`` is a stationary Gaussian AR(1) ``z_t`` outside bursts and a burst's
    amplitude during one. A burst starts with probability ``burst_start`` per
    non-burst frame, goes on with probability ``burst_continue`` per frame
    (geometric length, mean ``burst_steps``) and keeps one signed amplitude drawn
    from ``burst_amplitudes``. The burst replaces ``z_t`` rather than adding to it:
    the amplitudes are measured deviations that already hold the core's noise, and
    adding ``z_t`` again would blur them below the burst threshold. ``z_t`` goes on
    underneath, so the core resumes where it would have been.

    State is per episode of the batch (any truth shape, elementwise) and restarts
    at ``t == 0`` in the stationary distribution (core at its stationary spread, in
    a burst with probability ``burst_share``), so short episodes err like long ones.
    """

    def __init__(self, model: Shaped, scale: float):
        self.model, self.scale = model, scale
        self._pool = np.asarray(model.burst_amplitudes or (0.0,))
        self._z: np.ndarray | None = None
        self._in_burst = np.zeros(0, dtype=bool)
        self._amplitude = np.zeros(0)

    def errors(self, truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
        """The errors added to ``truth`` at step ``t`` (advances the state)."""
        m, shape = self.model, truth.shape
        if t == 0 or self._z is None or self._z.shape != shape:
            self._z = m.sigma * rng.standard_normal(shape)
            was = np.zeros(shape, dtype=bool)
            self._in_burst = rng.random(shape) < m.burst_share
            self._amplitude = np.zeros(shape)
        else:
            self._z = m.rho * self._z + m.sigma * math.sqrt(1 - m.rho**2) * rng.standard_normal(shape)
            was = self._in_burst
            self._in_burst = rng.random(shape) < np.where(was, m.burst_continue, m.burst_start)
        drawn = self._pool[rng.integers(self._pool.size, size=shape)]
        self._amplitude = np.where(self._in_burst & ~was, drawn, self._amplitude)
        y = np.where(self._in_burst, self._amplitude, self._z)
        return self.scale * (m.offset + m.gain * (np.clip(truth, *m.truth_range) - m.truth_centre) + y)

    def __call__(self, truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
        truth = np.asarray(truth, dtype=float)
        return truth + self.errors(truth, rng, t)


@register_error_model
@dataclass(frozen=True)
class Shaped:
    """A real NN's error features, reproduced: bias, truth dependence, persistence and bursts.

    Errors are ``offset + gain (truth - truth_centre) + y_t`` (see
    :class:`ShapedInjector`), with every parameter fitted (:meth:`fit`) so that the
    injected errors, measured with
    :func:`~qaopt.calibrate.error_features.measure_features`, have the
    :attr:`features` of the residuals they were fitted to. The calibrated axis is
    the metric only: a target level scales the whole error (offset, gain term,
    core, bursts) by one factor, so the shape is kept and only the size changes.
    ``unit_level`` is the expected level at scale 1 on the fitted truths: it
    depends on the truths through the gain term, so it is computed on them.

    The truth dependence is known only over the values the residuals were measured
    on: on-policy drives under good NNs cover a narrow band of states, and a slope
    fitted there says nothing about the rest (measured on CropFollow, extrapolating
    it made the reference NN's own errors fail the closed loop). So the gain term
    holds at the band's edges (:data:`TRUTH_BAND` quantiles) beyond them. A detector's
    ratio and bursts are fitted to the reference's confusion codes.
    """

    features: ErrorFeatures
    offset: float
    gain: float
    truth_centre: float
    truth_range: tuple[float, float]
    sigma: float
    rho: float
    burst_share: float
    burst_steps: float
    burst_amplitudes: tuple[float, ...]
    unit_level: float

    name: ClassVar[str] = "shaped"
    needs_residuals: ClassVar[bool] = True
    detector_bursts: ClassVar[float | None] = None
    components = frozenset({"metric"})

    @property
    def metric(self) -> str:
        return self.features.metric

    @property
    def burst_continue(self) -> float:
        """Probability that a burst goes on for another frame: its length is geometric with mean ``burst_steps``."""
        return 1.0 - 1.0 / self.burst_steps if self.burst_steps else 0.0

    @property
    def burst_start(self) -> float:
        """Probability that a burst starts on a non-burst frame, so that ``burst_share`` of frames are in bursts."""
        share = self.burst_share
        return share / (self.burst_steps * (1 - share)) if share else 0.0

    def injector(self, setting: Mapping[str, float]) -> Injector:
        if set(setting) != {"metric"}:
            raise CalibrationError(
                "calibration: the shaped error model calibrates an NN's metric only; "
                "use component 'metric' (or the gaussian/ar1 model for bias/sigma axes)"
            )
        return ShapedInjector(self, scale_for(self.metric, setting["metric"], self.unit_level))

    def config(self) -> dict:
        return {"model": self.name, "metric": self.metric, "offset": self.offset, "gain": self.gain,
                "truth_centre": self.truth_centre, "truth_range": list(self.truth_range), "sigma": self.sigma, "rho": self.rho,
                "burst_share": self.burst_share, "burst_steps": self.burst_steps,
                "burst_amplitudes": list(self.burst_amplitudes), "unit_level": self.unit_level}

    @classmethod
    def fit(cls, residuals: Sequence[np.ndarray], metric: str = "l1",
            truths: Sequence[np.ndarray] | None = None) -> Shaped:
        """The model whose errors have the features of ``residuals`` (and ``truths``, the true values beside them).

        The core's spread is the residuals' core sigma, bursts keep their share,
        mean length and (up to :data:`MAX_BURST_AMPLITUDES` quantiles) amplitudes,
        the offset makes the mean the residuals' bias, and the core's AR(1)
        coefficient is solved so that core and bursts together have the residuals'
        lag-1 autocorrelation. The unit level is then the expected level on the
        fitted truths (or on zeros without truths), so a target is met exactly on
        truths distributed like them.
        """
        _check_kind(metric)
        analysis = analyse_residuals(residuals, truths, metric)
        f = analysis.features
        pool = _amplitude_pool(analysis.burst_deviations)
        m1, m2 = (float(pool.mean()), float(np.mean(pool**2))) if pool.size else (0.0, 0.0)
        band = np.quantile(np.concatenate(analysis.truths), TRUTH_BAND)
        model = cls(features=f, offset=f.bias - f.burst_share * m1, gain=f.gain,
                    truth_centre=analysis.truth_centre, truth_range=(float(band[0]), float(band[1])),
                    sigma=analysis.core_sigma, rho=0.0,
                    burst_share=f.burst_share, burst_steps=f.burst_steps,
                    burst_amplitudes=tuple(float(a) for a in pool), unit_level=math.nan)
        model = replace(model, rho=_core_rho(model, analysis.rho, m1, m2))
        return replace(model, unit_level=_unit_level(model, analysis.truths))


def _amplitude_pool(deviations: np.ndarray) -> np.ndarray:
    """Measured burst deviations, or :data:`MAX_BURST_AMPLITUDES` evenly spaced quantiles of them.

    ``inverted_cdf`` quantiles are measured values: interpolating across the gap
    between negative and positive bursts would invent an amplitude inside the core.
    """
    if deviations.size <= MAX_BURST_AMPLITUDES:
        return np.sort(deviations)
    levels = (np.arange(MAX_BURST_AMPLITUDES) + 0.5) / MAX_BURST_AMPLITUDES
    return np.quantile(deviations, levels, method="inverted_cdf")


def _core_rho(model: Shaped, rho: float, m1: float, m2: float) -> float:
    """The core's AR(1) coefficient that gives core and bursts together the lag-1 autocorrelation ``rho``.

    With ``p`` the burst share, the lag-1 covariance of ``y`` is
    ``P(core, core) rho_z sigma^2 + p burst_continue m2 - (p m1)^2`` (``m1``, ``m2``:
    moments of the burst amplitudes; a core frame next to a burst frame adds
    nothing, the core having mean 0), and its variance
    ``(1 - p) sigma^2 + p m2 - (p m1)^2``; solved for ``rho_z``.
    """
    p = model.burst_share
    core_pairs = (1 - p) * (1 - model.burst_start) * model.sigma**2
    if core_pairs == 0:
        return 0.0
    variance = (1 - p) * model.sigma**2 + p * m2 - (p * m1) ** 2
    covariance = rho * variance + (p * m1) ** 2 - p * model.burst_continue * m2
    return float(np.clip(covariance / core_pairs, 0.0, MAX_LAG1))


def _unit_level(model: Shaped, truths: Sequence[np.ndarray]) -> float:
    """The expected metric of ``model``'s errors at scale 1 on ``truths``.

    A metric averages a function of one frame's error, so its expectation depends on
    the stationary marginal of the errors only, not on their time structure: on a
    frame of truth ``x`` the error is ``mu = offset + gain (x - truth_centre)`` plus
    ``N(0, sigma^2)`` (core, probability ``1 - p``) or an amplitude drawn from
    ``burst_amplitudes`` (burst, probability ``p``). Averaged exactly over the
    truths' frames, so the target is met without Monte Carlo error.
    """
    mu = model.offset + model.gain * (np.clip(np.concatenate(truths), *model.truth_range) - model.truth_centre)
    p, sigma, pool = model.burst_share, model.sigma, np.sort(model.burst_amplitudes)
    if model.metric == "l1":
        core = _mean_abs_gaussian(mu, sigma)
        bursts = _mean_abs_shifted(mu, pool) if pool.size else 0.0
        return float(np.mean((1 - p) * core + p * bursts))
    m1, m2 = (float(pool.mean()), float(np.mean(pool**2))) if pool.size else (0.0, 0.0)
    mse = float(np.mean(mu**2 + 2 * mu * p * m1)) + (1 - p) * sigma**2 + p * m2
    return mse if model.metric == "mse" else math.sqrt(mse)


def _mean_abs_gaussian(mu: np.ndarray, sigma: float) -> np.ndarray:
    """``E|mu + sigma eps|`` for standard normal ``eps``, elementwise (the folded normal's mean)."""
    if sigma == 0:
        return np.abs(mu)
    return sigma * math.sqrt(2 / math.pi) * np.exp(-(mu**2) / (2 * sigma**2)) + mu * (1 - 2 * norm.cdf(-mu / sigma))


def _mean_abs_shifted(mu: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """``mean_j |mu + pool_j|`` for every ``mu``, from prefix sums of the sorted pool (no frames x pool matrix)."""
    sums = np.concatenate([[0.0], np.cumsum(pool)])
    below = np.searchsorted(pool, -mu)  # how many amplitudes make mu + a negative
    negative = below * mu + sums[below]
    positive = (pool.size - below) * mu + sums[-1] - sums[below]
    return (positive - negative) / pool.size


def make_error_model(
    name: str,
    metric: str = "l1",
    residuals: Sequence[np.ndarray] | None = None,
    truths: Sequence[np.ndarray] | None = None,
) -> ErrorModel:
    """The spec's ``calibration.error_model`` for one NN; fitted to ``residuals`` when given.

    ``truths`` (the true values beside the residuals) reach the model's ``fit``. A model
    that declares ``needs_residuals`` cannot be built without them; the others have a
    default (``gaussian``/``ar1``: zero bias and, for AR(1), a 5-step correlation).

    A class ``metric`` (a detector's ``miss_rate`` / ``false_alarm_rate``) gets the
    confusion model (:func:`qaopt.calibrate.confusion.confusion_model`) with the bursts
    the model declares (``detector_bursts``), its ``residuals`` being confusion codes;
    ``truths`` are not needed (codes hold the class).
    """
    kind = ERROR_MODELS.lookup(name)
    if is_class_metric(metric):
        if residuals is None and kind.detector_bursts is None:
            raise CalibrationError(
                f"calibration.error_model: '{name}' needs the NN's confusion codes measured on its error data (the "
                "reference NN's on-policy drives or validation split); provide them or use one of "
                f"{', '.join(n for n, k in ERROR_MODELS.items() if k.detector_bursts is not None)}")
        return confusion_model(name, metric, kind.detector_bursts, residuals)
    if residuals is not None:
        return kind.fit(residuals, metric, truths)
    if kind.needs_residuals:
        raise CalibrationError(
            f"calibration.error_model: '{name}' needs the NN's residual sequences measured on validation data; "
            f"provide them or use one of {', '.join(n for n, k in ERROR_MODELS.items() if not k.needs_residuals)}")
    return kind(metric=metric)
