"""Error models: how an NN errs, and what its declared error metric is worth.

A point of the error space says how *much* error an NN makes, in the metric its
spec declares (``l1``: mean absolute error, ``rmse``), or as a bias and standard
deviation. An error model says how that error *looks* (independent Gaussian
noise per frame as in ApproxCaliper, AR(1) noise whose consecutive frames err
alike, or a real NN's residuals resampled in blocks) and builds the
:class:`~qaopt.calibrate.protocols.Injector` that makes a simulated NN err that
way. The metrics themselves are defined once, in :mod:`qaopt.app_spec.nn_errors`.
``fit`` methods build a model from a real NN's residual sequences (time-
ordered, in the output's unit) so calibration injects errors that look like the
NN that will be deployed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from scipy.stats import norm

from qaopt.app_spec.hashing import content_hash
from qaopt.app_spec.nn_errors import METRIC_KINDS, SCALE_DEGREE, error_metric
from qaopt.calibrate.errors import CalibrationError
from qaopt.calibrate.protocols import Injector

# A metric homogeneous in the error's scale (SCALE_DEGREE) lets a target value map exactly onto a
# scale of the error (Gaussian sigma, residual factor). ``max_abs`` is homogeneous too, but an
# episode's maximum grows with its length, so no error model maps a target onto it.
CALIBRATED_METRICS = tuple(k for k in METRIC_KINDS if k != "max_abs")


def _check_kind(kind: str) -> None:
    if kind not in CALIBRATED_METRICS:
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


def _pooled(residuals: Sequence[np.ndarray]) -> list[np.ndarray]:
    seqs = [np.asarray(r, dtype=float).ravel() for r in residuals]
    seqs = [r for r in seqs if r.size]
    if not seqs or sum(r.size for r in seqs) < 2:
        raise CalibrationError("residuals: need at least two residual values to fit an error model")
    if not all(np.isfinite(r).all() for r in seqs):
        raise CalibrationError("residuals: contain NaN or infinite values; fix the NN's measured outputs")
    return seqs


def _lag1_autocorrelation(seqs: Sequence[np.ndarray]) -> float:
    """Pooled lag-1 autocorrelation of the centred sequences (pairs never cross sequences)."""
    mean = np.concatenate(seqs).mean()
    num = sum(float(np.dot(r[:-1] - mean, r[1:] - mean)) for r in seqs if r.size > 1)
    den = sum(float(np.dot(r - mean, r - mean)) for r in seqs)
    return float(np.clip(num / den, 0.0, 0.999)) if den > 0 else 0.0


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


@dataclass(frozen=True)
class Gaussian:
    """Independent Gaussian errors per frame (ApproxCaliper's model).

    A target metric ``m`` maps to the ``sigma`` (and ``bias = bias_ratio * sigma``)
    whose expected metric is ``m``: exact, since the metrics are homogeneous in
    (bias, sigma). A ``bias``/``sigma`` setting is used as it is.
    """

    metric: str = "l1"
    bias_ratio: float = 0.0

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
        return {"model": "gaussian", "metric": self.metric, "bias_ratio": self.bias_ratio}

    @classmethod
    def fit(cls, residuals: Sequence[np.ndarray], metric: str = "l1") -> Gaussian:
        """Keep a real NN's bias-to-spread ratio; the size comes from each point."""
        r = np.concatenate(_pooled(residuals))
        sd = float(r.std())
        return cls(metric=metric, bias_ratio=float(r.mean() / sd) if sd > 0 else 0.0)


@dataclass(frozen=True)
class AR1(Gaussian):
    """Gaussian errors correlated in time: ``e_t = rho e_{t-1} + sqrt(1-rho^2) sigma eps_t``.

    ``correlation_steps`` is the correlation time in perception steps
    (``rho = exp(-1/correlation_steps)``). Marginals equal the Gaussian model's, so
    a target metric maps to the same (bias, sigma); what changes is that errors
    persist over consecutive frames, as a real NN's do on similar images.
    """

    correlation_steps: float = 5.0

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
        return {**super().config(), "model": "ar1", "correlation_steps": self.correlation_steps}

    @classmethod
    def fit(cls, residuals: Sequence[np.ndarray], metric: str = "l1") -> AR1:
        seqs = _pooled(residuals)
        r = np.concatenate(seqs)
        sd = float(r.std())
        rho = _lag1_autocorrelation(seqs)
        return cls(
            metric=metric,
            bias_ratio=float(r.mean() / sd) if sd > 0 else 0.0,
            correlation_steps=-1.0 / math.log(rho) if rho > 0 else 1e-3,
        )


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


class Empirical:
    """A real NN's residual sequences, resampled in blocks and scaled to the target metric.

    The residuals' own metric ``m0`` is measured once; a target ``m`` scales every
    residual by ``m / m0`` (``sqrt`` of it for MSE), so the resampled errors have
    metric ``m`` in expectation, and keeps the NN's bias,
    skew, outliers and temporal correlation. ``block_length`` defaults to the
    larger of ``n^(1/3)`` (the moving-block rule for a mean sequence length ``n``)
    and two correlation times, capped at the shortest usable sequence.
    """

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
            rho = _lag1_autocorrelation(seqs)
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
        return {"model": "empirical", "metric": self.metric, "block_length": self.block_length,
                "residuals": self._key}

    @classmethod
    def fit(cls, residuals: Sequence[np.ndarray], metric: str = "l1") -> Empirical:
        return cls(residuals, metric)


ERROR_MODELS = {"gaussian": Gaussian, "ar1": AR1, "empirical": Empirical}


def make_error_model(name: str, metric: str = "l1", residuals: Sequence[np.ndarray] | None = None) -> ErrorModel:
    """The spec's ``calibration.error_model`` for one NN; fitted to ``residuals`` when given.

    ``empirical`` needs residuals; ``gaussian``/``ar1`` without residuals are
    zero-bias (and, for AR(1), 5-step correlation) defaults.
    """
    if name not in ERROR_MODELS:
        raise CalibrationError(
            f"calibration.error_model: '{name}' is unknown; use one of {', '.join(ERROR_MODELS)}"
        )
    if residuals is not None:
        return ERROR_MODELS[name].fit(residuals, metric)
    if name == "empirical":
        raise CalibrationError(
            "calibration.error_model: 'empirical' needs the NN's residual sequences measured on "
            "validation data; provide them or use 'gaussian'/'ar1'"
        )
    return ERROR_MODELS[name](metric=metric)
