"""Error models: targets map onto exact error sizes, time structure is kept, fits recover parameters."""

from __future__ import annotations

import numpy as np
import pytest

from qaopt.app_spec.nn_errors import error_metric
from qaopt.app_spec.hashing import content_hash
from qaopt.calibrate import AR1, AR1Profile, CalibrationError, Empirical, Gaussian, make_error_model


def _run(injector, steps: int, batch: int, seed: int = 0) -> np.ndarray:
    """Errors an injector makes over an episode: shape (steps, batch)."""
    rng = np.random.default_rng(seed)
    truth = np.linspace(-1, 1, batch)
    return np.array([injector(truth, rng, t) - truth for t in range(steps)])


@pytest.mark.parametrize("kind", ["l1", "rmse", "mse"])
@pytest.mark.parametrize("bias_ratio", [0.0, 0.7])
def test_gaussian_hits_the_target_metric(kind, bias_ratio):
    model = Gaussian(metric=kind, bias_ratio=bias_ratio)
    err = _run(model.injector({"metric": 2.5}), steps=400, batch=200)
    assert error_metric(kind, err) == pytest.approx(2.5, rel=0.02)
    bias, sigma = model.parameters({"metric": 2.5})
    assert err.mean() == pytest.approx(bias, abs=0.03)
    assert bias == pytest.approx(bias_ratio * sigma)


def test_gaussian_bias_sigma_setting_is_used_as_given():
    err = _run(Gaussian().injector({"bias": 3.0, "sigma": 0.5}), steps=200, batch=100)
    assert err.mean() == pytest.approx(3.0, abs=0.01)
    assert err.std() == pytest.approx(0.5, rel=0.03)


def test_ar1_keeps_marginals_and_correlates_in_time():
    model = AR1(metric="l1", correlation_steps=10.0)
    err = _run(model.injector({"metric": 1.0}), steps=2000, batch=50)
    assert error_metric("l1", err) == pytest.approx(1.0, rel=0.05)
    lag1 = np.corrcoef(err[:-1].ravel(), err[1:].ravel())[0, 1]
    assert lag1 == pytest.approx(np.exp(-0.1), abs=0.02)
    white = _run(Gaussian().injector({"metric": 1.0}), steps=2000, batch=50)
    assert abs(np.corrcoef(white[:-1].ravel(), white[1:].ravel())[0, 1]) < 0.02


def test_ar1_fit_recovers_bias_and_correlation():
    rng = np.random.default_rng(1)
    seqs = []
    for _ in range(20):
        e = np.zeros(500)
        for t in range(1, 500):
            e[t] = 0.9 * e[t - 1] + np.sqrt(1 - 0.81) * rng.standard_normal()
        seqs.append(0.5 + 2.0 * e)
    fit = AR1.fit(seqs, metric="rmse")
    assert np.exp(-1 / fit.correlation_steps) == pytest.approx(0.9, abs=0.02)
    assert fit.bias_ratio == pytest.approx(0.25, abs=0.06)
    assert Gaussian.fit(seqs).bias_ratio == pytest.approx(fit.bias_ratio)


def test_empirical_scales_to_target_and_keeps_time_structure():
    rng = np.random.default_rng(2)
    seqs = [np.cumsum(rng.standard_normal(300)) * 0.1 + 0.3 for _ in range(10)]  # strongly correlated, biased
    model = Empirical(seqs, metric="l1")
    err = _run(model.injector({"metric": 4.0}), steps=300, batch=100)
    assert error_metric("l1", err) == pytest.approx(4.0, rel=0.1)
    lag1 = np.corrcoef(err[:-1].ravel(), err[1:].ravel())[0, 1]
    assert lag1 > 0.8  # white resampling would give ~0
    assert model.block_length > 1


def test_empirical_blocks_never_cross_sequences():
    seqs = [np.full(7, 1.0), np.full(5, 2.0), np.full(9, 3.0)]
    model = Empirical(seqs, block_length=4)
    err = _run(model.injector({"metric": model.base_metric}), steps=40, batch=30)
    for b in range(30):
        blocks = err[:, b].reshape(10, 4)
        assert (blocks == blocks[:, :1]).all()  # every block comes from one sequence


def test_empirical_mse_scales_by_square_root():
    seqs = [np.random.default_rng(3).standard_normal(400)]
    err = _run(Empirical(seqs, metric="mse").injector({"metric": 9.0}), steps=400, batch=100)
    assert error_metric("mse", err) == pytest.approx(9.0, rel=0.1)


def test_bad_models_are_clear_errors():
    with pytest.raises(CalibrationError, match="max_abs"):
        Gaussian(metric="max_abs")
    with pytest.raises(CalibrationError, match="empirical.*metric only"):
        Empirical([np.ones(10) * 0.1 + np.arange(10)]).injector({"bias": 1.0, "sigma": 1.0})
    with pytest.raises(CalibrationError, match="residual"):
        make_error_model("empirical", "l1")
    with pytest.raises(CalibrationError, match="no error model named 'laplace'; registered: gaussian, ar1, ar1-profile, empirical"):
        make_error_model("laplace", "l1")
    with pytest.raises(CalibrationError, match="NaN"):
        Empirical([np.array([0.1, np.nan, 0.2])])
    with pytest.raises(CalibrationError, match="all zero"):
        Empirical([np.zeros(10)])


def _blind_reference(seed: int = 2) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Residual and truth sequences of a reference NN that errs as AR(1) noise near the centre and reads true values
    beyond 0.5 nearer the centre than they are (the CropFollow distance NN's blindness near the row)."""
    rng = np.random.default_rng(seed)
    residuals, truths = [], []
    for _ in range(40):
        x, e = np.zeros(300), np.zeros(300)  # a drive that wanders (true values about 0 +- 0.4)
        for t in range(1, 300):
            x[t] = 0.98 * x[t - 1] + 0.08 * rng.standard_normal()
            e[t] = 0.8 * e[t - 1] + 0.6 * rng.standard_normal()
        residuals.append(0.1 * e - 0.8 * np.clip(np.abs(x) - 0.5, 0, None) * np.sign(x))
        truths.append(x)
    return residuals, truths


def test_ar1_profile_injects_the_reference_bias_off_nominal_and_the_point_s_noise_everywhere():
    residuals, truths = _blind_reference()
    model = make_error_model("ar1-profile", "l1", residuals, truths)
    assert isinstance(model, AR1Profile)
    fitted = AR1.fit(residuals)  # the AR(1) part is the reference's own, not ar1's default of 5 frames
    assert (model.bias_ratio, model.correlation_steps) == (fitted.bias_ratio, fitted.correlation_steps)
    assert np.exp(-1 / model.correlation_steps) > 0.75
    centres, excess = np.array(model.centres), np.array(model.excess)
    assert np.all(excess[np.abs(centres) < 0.3] == 0.0)  # nominal states: no excess
    assert excess[np.argmax(centres)] < -0.05 and excess[np.argmin(centres)] > 0.05  # reads the edges nearer 0
    rng = np.random.default_rng(0)
    injector = model.injector({"metric": 0.3})
    truth = np.concatenate([np.zeros(500), np.full(500, centres.max())])
    errors = np.array([injector(truth, rng, t) - truth for t in range(400)])
    sigma = model.parameters({"metric": 0.3})[1]
    assert errors[:, :500].mean() == pytest.approx(model.bias_ratio * sigma, abs=0.03)
    assert errors[:, 500:].mean() - errors[:, :500].mean() == pytest.approx(excess[np.argmax(centres)], abs=0.03)
    assert error_metric("l1", errors[:, :500]) == pytest.approx(0.3, rel=0.05)  # the level sets the AR(1) part
    assert content_hash(model.config())  # its identity keys the cached runs


def test_ar1_profile_needs_the_truths_and_says_so():
    residuals, _ = _blind_reference()
    with pytest.raises(CalibrationError, match="true values.*or use 'ar1'"):
        make_error_model("ar1-profile", "l1", residuals)
    with pytest.raises(CalibrationError, match="residual"):
        make_error_model("ar1-profile", "l1")
