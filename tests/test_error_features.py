"""Error features and the shaped error model: features recover known parameters, and the shaped model
injects errors whose features, measured the same way, are the ones it was fitted to."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.signal import lfilter

from qaopt.app_spec.nn_errors import error_metric
from qaopt.calibrate.error_features import MIN_FRAMES, measure_features
from qaopt.calibrate.error_models import ERROR_MODELS, Shaped, make_error_model
from qaopt.calibrate.errors import CalibrationError

TRUTH_MEAN, TRUTH_STD, TRUTH_RHO = 10.0, 5.0, 0.99


def _ar1(rng: np.random.Generator, n: int, rho: float, sigma: float) -> np.ndarray:
    """A stationary Gaussian AR(1) sequence with lag-1 autocorrelation ``rho`` and std ``sigma``."""
    e = rng.standard_normal(n) * sigma
    e[1:] *= np.sqrt(1 - rho**2)
    return lfilter([1.0], [1.0, -rho], e)


def _drive(rng: np.random.Generator, n: int, bias: float = -0.5, gain: float = 0.1, rho: float = 0.74,
           burst_rate: float = 0.004, burst_steps: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """(residuals, truths) of one drive: bias, gain on a slowly varying truth, AR(1) core and one-signed bursts
    of 6-12 core sigmas and geometric length added on top (the shape measured on real NNs)."""
    x = TRUTH_MEAN + _ar1(rng, n, TRUTH_RHO, TRUTH_STD)
    bursts = np.zeros(n)
    for start in np.flatnonzero(rng.random(n) < burst_rate):
        bursts[start:start + rng.geometric(1 / burst_steps)] = rng.choice([-1, 1]) * rng.uniform(6, 12)
    return bias + gain * (x - TRUTH_MEAN) + _ar1(rng, n, rho, 1.0) + bursts, x


def _drives(seed: int, count: int, steps: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    residuals, truths = zip(*(_drive(rng, steps) for _ in range(count)))
    return list(residuals), list(truths)


def _inject(model: Shaped, level: float, truths: list[np.ndarray], seed: int = 1) -> list[np.ndarray]:
    """Drive the injector as the simulator does (t = 0, 1, ... on a batch of truths); one error sequence per episode."""
    injector, rng = model.injector({"metric": level}), np.random.default_rng(seed)
    x = np.stack(truths, axis=1)  # (steps, episodes)
    return list(np.stack([injector(x[t], rng, t) - x[t] for t in range(x.shape[0])], axis=1))


@pytest.fixture(scope="module")
def fitted() -> Shaped:
    residuals, truths = _drives(seed=0, count=20, steps=2000)
    return Shaped.fit(residuals, "l1", truths)


def test_features_recover_known_bias_gain_and_correlation():
    rng = np.random.default_rng(3)
    truths = [TRUTH_MEAN + _ar1(rng, 1000, TRUTH_RHO, TRUTH_STD) for _ in range(20)]
    residuals = [0.5 + 0.2 * (x - TRUTH_MEAN) + _ar1(rng, x.size, 0.9, 1.0) for x in truths]
    f = measure_features(residuals, truths, "rmse")
    pooled_truth = np.concatenate(truths)
    assert f.frames == 20_000 and f.metric == "rmse"
    assert f.level == pytest.approx(error_metric("rmse", np.concatenate(residuals)))
    assert f.gain == pytest.approx(0.2, abs=0.02)
    assert f.bias == pytest.approx(0.5 + 0.2 * (pooled_truth.mean() - TRUTH_MEAN), abs=0.05)
    assert f.correlation_steps == pytest.approx(-1 / np.log(0.9), rel=0.1)  # 9.5 steps
    assert f.burst_share < 1e-3 and f.burst_steps < 2
    # Without truths the gain term stays in the residuals: the truth's persistence (100 steps) leaks in.
    blind = measure_features(residuals)
    assert blind.gain == 0.0 and blind.correlation_steps > 15
    assert json.loads(json.dumps(f.to_json())) == f.to_json()


def test_bursts_have_their_share_length_and_level():
    rng = np.random.default_rng(4)
    e = rng.standard_normal(20_000)
    for i, start in enumerate(range(100, e.size, 200)):  # 10 of every 200 frames, alternating sign
        e[start:start + 10] += 8.0 if i % 2 else -8.0
    f = measure_features([e])
    assert f.burst_share == pytest.approx(0.05, abs=0.002)
    assert f.burst_steps == pytest.approx(10, abs=0.3)
    assert f.burst_level == pytest.approx(8, abs=0.15)  # absolute, in the residual's unit
    assert measure_features([rng.standard_normal(20_000)]).burst_share < 1e-3


def test_bursts_never_span_two_sequences():
    rng = np.random.default_rng(5)
    end, start = rng.standard_normal(200), rng.standard_normal(200)
    end[-5:] += 10.0
    start[:5] += 10.0
    f = measure_features([end, start])
    assert f.burst_steps == pytest.approx(5)  # two bursts of 5, not one of 10
    assert f.burst_share == pytest.approx(10 / 400)


def test_injected_errors_have_the_fitted_features(fitted):
    f = fitted.features
    assert f.burst_share > 0.02 and f.correlation_steps > 5  # the fit data is persistent and bursty
    truths = _drives(seed=9, count=256, steps=2000)[1]
    injected = measure_features(_inject(fitted, f.level, truths), truths, "l1")
    assert injected.level == pytest.approx(f.level, rel=0.05)
    assert injected.bias == pytest.approx(f.bias, abs=0.05 * f.sigma)
    assert injected.sigma == pytest.approx(f.sigma, rel=0.05)
    assert injected.gain == pytest.approx(f.gain, abs=0.005)
    assert injected.correlation_steps == pytest.approx(f.correlation_steps, rel=0.08)
    assert injected.burst_share == pytest.approx(f.burst_share, rel=0.1)
    assert injected.burst_steps == pytest.approx(f.burst_steps, rel=0.1)
    assert injected.burst_level == pytest.approx(f.burst_level, rel=0.03)


@pytest.mark.parametrize("metric", ["l1", "rmse", "mse"])
def test_a_target_level_scales_the_whole_error(metric):
    residuals, truths = _drives(seed=2, count=10, steps=2000)
    model = Shaped.fit(residuals, metric, truths)
    target = 3.0 * model.features.level
    scale = 3.0 ** (0.5 if metric == "mse" else 1.0)
    truths = truths * 16  # the fitted truths, on which the unit level was computed
    injected = measure_features(_inject(model, target, truths), truths, metric)
    assert injected.level == pytest.approx(target, rel=0.05)
    assert injected.bias == pytest.approx(scale * model.features.bias, abs=0.05 * scale * model.features.sigma)
    assert injected.gain == pytest.approx(scale * model.features.gain, abs=0.02 * scale)
    assert injected.burst_share == pytest.approx(model.features.burst_share, rel=0.15)  # the shape is kept


def test_injection_is_deterministic_and_restarts_each_episode(fitted):
    truths = [np.full(300, TRUTH_MEAN)] * 8
    first = np.array(_inject(fitted, 2.0, truths, seed=7))
    assert np.array_equal(first, _inject(fitted, 2.0, truths, seed=7))
    assert not np.array_equal(first, _inject(fitted, 2.0, truths, seed=8))
    injector, x = fitted.injector({"metric": 2.0}), np.full(8, TRUTH_MEAN)
    for _ in range(2):  # the same injector, restarted at t == 0 with the same generator, repeats the episode
        rng = np.random.default_rng(7)
        assert np.array_equal(np.array([injector(x, rng, t) for t in range(50)]) - x, first[:, :50].T)
    residuals, truths = _drives(seed=0, count=20, steps=2000)
    assert Shaped.fit(residuals, "l1", truths).config() == fitted.config()


def test_the_truth_dependence_holds_at_the_edges_of_the_fitted_truths(fitted):
    """Beyond the band of true values the residuals were measured on, the gain term does not extrapolate."""
    low, high = fitted.truth_range
    assert low < TRUTH_MEAN < high
    far, edge = [np.full(50, high + 100 * TRUTH_STD)] * 4, [np.full(50, high)] * 4
    np.testing.assert_allclose(_inject(fitted, 2.0, far), _inject(fitted, 2.0, edge))
    near = [np.full(50, (TRUTH_MEAN + high) / 2)] * 4
    assert not np.allclose(_inject(fitted, 2.0, near), _inject(fitted, 2.0, edge))  # inside the band it holds


def test_shaped_is_registered_and_built_from_residuals_and_truths():
    residuals, truths = _drives(seed=6, count=4, steps=500)
    assert ERROR_MODELS["shaped"] is Shaped
    model = make_error_model("shaped", "rmse", residuals, truths)
    assert isinstance(model, Shaped) and model.components == frozenset({"metric"})
    assert model.features == measure_features(residuals, truths, "rmse")
    config = json.loads(json.dumps(model.config()))
    assert config["model"] == "shaped" and config["gain"] == model.features.gain != 0
    assert make_error_model("shaped", "rmse", residuals).features.gain == 0.0  # no truths: no gain


def test_bad_inputs_are_clear_errors():
    rng = np.random.default_rng(0)
    ok = rng.standard_normal(200)
    with pytest.raises(CalibrationError, match=f"nns.heading: residuals: {MIN_FRAMES - 1} frames.*at least {MIN_FRAMES}"):
        measure_features([ok[:MIN_FRAMES - 1]], nn="heading")
    with pytest.raises(CalibrationError, match="residuals: 2 of 200 values are NaN or infinite"):
        measure_features([np.r_[ok[:198], np.nan, np.inf]])
    with pytest.raises(CalibrationError, match="truths: 1 of 200 values are NaN or infinite"):
        measure_features([ok], [np.r_[np.zeros(199), np.nan]])
    with pytest.raises(CalibrationError, match="all 200 residuals equal 0.5.*does not vary"):
        measure_features([np.full(200, 0.5)])
    with pytest.raises(CalibrationError, match="truths do not line up.*lengths \\[199\\].*lengths \\[200\\]"):
        measure_features([ok], [np.zeros(199)])
    with pytest.raises(CalibrationError, match="^nns.distance: truths do not line up"):
        measure_features([ok], [ok, ok], nn="distance")
    with pytest.raises(CalibrationError, match="shaped.*residual"):
        make_error_model("shaped", "l1")
    with pytest.raises(CalibrationError, match="max_abs"):
        Shaped.fit([ok], "max_abs")
    with pytest.raises(CalibrationError, match="shaped.*metric only"):
        Shaped.fit([ok]).injector({"bias": 1.0, "sigma": 1.0})
