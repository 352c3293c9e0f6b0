"""NNs with discrete outputs: class metrics from confusion codes, the confusion error model, and a calibration
over three NNs, one of them a detector (tests/apps/detector3.py)."""

from __future__ import annotations

import itertools
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from qaopt.app_spec import QaoptError, SpecError, load
from qaopt.app_spec.nn_errors import (
    CLASS_METRICS,
    FALSE_ALARM,
    MISS,
    TRUE_NEGATIVE,
    TRUE_POSITIVE,
    class_coordinate,
    confusion_codes,
    error_coordinate,
    error_metric,
    frame_errors,
)
from qaopt.calibrate.confusion import (
    DEFAULT_BURST_STEPS,
    DEFAULT_RATIO,
    Confusion,
    ConfusionInjector,
    burst_statistics,
    chain_probabilities,
)
from qaopt.calibrate import ErrorRegion
from qaopt.calibrate.error_features import measure_features
from qaopt.calibrate.error_models import (
    CALIBRATED_METRICS,
    ERROR_MODELS,
    CalibrationError,
    make_error_model,
)

from qaopt.cli import main

SPEC = Path(__file__).resolve().parent / "apps" / "detector3.yaml"
Z = 4.0
"""Tolerances are Z standard errors: a correct injector fails a check with probability ~6e-5."""


# ---------------------------------------------------------------- metrics


def test_codes_and_rates():
    pred = np.array([[0.9], [0.2], [0.6], [0.1], [0.5], [0.49]])
    truth = np.array([[1.0], [1.0], [0.0], [0.0], [1.0], [0.0]])
    codes = confusion_codes(pred, truth)
    assert codes.tolist() == [TRUE_POSITIVE, MISS, FALSE_ALARM, TRUE_NEGATIVE, TRUE_POSITIVE, TRUE_NEGATIVE]
    assert (TRUE_NEGATIVE, TRUE_POSITIVE, MISS, FALSE_ALARM) == (0, 1, 2, 3)
    assert error_metric("miss_rate", codes) == pytest.approx(1 / 3)
    assert error_metric("false_alarm_rate", codes) == pytest.approx(1 / 3)
    # the threshold is the application's: at 0.55, the 0.5 output is a miss too
    assert error_metric("miss_rate", frame_errors("miss_rate", pred, truth, threshold=0.55)) == pytest.approx(2 / 3)
    # frame_errors is residuals for a regression metric
    assert frame_errors("l1", pred, truth).tolist() == pytest.approx((pred - truth)[:, 0].tolist())
    # a rate with no frame of its class is 0; codes hold any shape
    assert error_metric("miss_rate", np.array([[0.0, 3.0], [0.0, 0.0]])) == 0.0
    assert error_metric("false_alarm_rate", np.array([])) == 0.0
    assert error_coordinate("metric", "miss_rate", codes) == pytest.approx(1 / 3)


def test_a_detector_sits_where_the_injected_errors_cover_both_its_kinds():
    """The calibration injects ``ratio * m`` of the other kind at a miss rate ``m``: a detector that misses little but
    raises many false alarms sits where the injected false alarms reach its own."""
    assert class_coordinate(0.01, 0.002, 0.5) == 0.01  # within what the injected point at its miss rate raised
    assert class_coordinate(0.01, 0.02, 0.5) == pytest.approx(0.04)
    assert class_coordinate(0.01, 0.9, 0.5) == 1.0  # a rate is at most 1
    assert class_coordinate(0.01, 0.001, 0.0) == 1.0  # none of the kind was injected: nothing charted covers it
    assert class_coordinate(0.01, 0.0, 0.0) == 0.01
    assert class_coordinate(0.01, 0.02, None) == 0.01  # no calibrated ratio known: the declared rate alone
    codes = np.array([TRUE_POSITIVE] * 99 + [MISS] + [TRUE_NEGATIVE] * 90 + [FALSE_ALARM] * 10)
    assert error_coordinate("metric", "miss_rate", codes) == pytest.approx(0.01)
    assert error_coordinate("metric", "miss_rate", codes, ratio=0.5) == pytest.approx(0.2)
    assert error_coordinate("metric", "false_alarm_rate", codes, ratio=0.5) == pytest.approx(0.1)  # misses: 0.02


def test_class_metrics_refuse_residuals_and_bias_sigma():
    with pytest.raises(QaoptError, match="confusion codes"):
        error_metric("miss_rate", np.array([0.3, -0.1]))
    with pytest.raises(QaoptError, match="means nothing for the class metric"):
        error_coordinate("sigma", "miss_rate", np.array([1.0, 2.0]))
    with pytest.raises(CalibrationError, match="confusion codes"):
        measure_features([np.tile([0.0, 1.0, 2.0, 3.0], 100)], metric="miss_rate")
    assert set(CLASS_METRICS) <= set(CALIBRATED_METRICS)


# ---------------------------------------------------------------- the injector


def _run(injector, truth: np.ndarray, seed: int = 0) -> np.ndarray:
    """Outputs of ``injector`` over truth (episodes, steps), one episode per row, in lock-step."""
    rng = np.random.default_rng(seed)
    return np.stack([injector(truth[:, t].copy(), rng, t) for t in range(truth.shape[1])], axis=1)


def _truth(episodes: int, steps: int, seed: int = 1) -> np.ndarray:
    """0/1 truths in stretches (a sign in view for a while), so both chains pause and resume."""
    rng = np.random.default_rng(seed)
    flips = rng.random((episodes, steps)) < 0.1
    return (np.cumsum(flips, axis=1) % 2).astype(float)


def _codes(out: np.ndarray, truth: np.ndarray) -> np.ndarray:
    return np.stack([confusion_codes(o[:, None], t[:, None]) for o, t in zip(out, truth)])


def _check_rate(stats, rate: float) -> None:
    """The measured rate is within Z binomial standard errors, inflated for the chain's persistence.

    A stationary two-state chain with lag-1 correlation ``stay - start`` has a variance
    of its mean ``(1 + c) / (1 - c)`` times the binomial one (``c = stay - start``).
    """
    start, stay = chain_probabilities(rate, stats[1])
    c = stay - start
    n = stats[0].frames
    se = math.sqrt(rate * (1 - rate) / n * (1 + c) / (1 - c))
    assert abs(stats[0].rate - rate) <= Z * se + 1e-12, (stats[0].rate, rate, se)


def _check_burst(stats, rate: float, length: float) -> None:
    """Burst lengths are geometric with mean L (= 1 / (1 - stay)); their mean's standard error is
    sqrt(L (L - 1)) / sqrt(bursts)."""
    L = max(length, 1 / (1 - rate))
    se = math.sqrt(L * (L - 1) / stats.bursts)
    assert abs(stats.mean_burst - L) <= Z * se + 1e-9, (stats.mean_burst, L, se)


@pytest.mark.parametrize("miss, fa, lm, lf", [(0.2, 0.05, 5.0, 2.0), (0.4, 0.3, 1.0, 1.0), (0.05, 0.0, 8.0, 1.0)])
def test_injector_meets_rates_and_burst_lengths(miss, fa, lm, lf):
    truth = _truth(200, 400)
    out = _run(ConfusionInjector(miss, fa, lm, lf), truth)
    assert set(np.unique(out)) <= {0.0, 1.0}
    codes = list(_codes(out, truth))
    m, f = burst_statistics(codes, "miss_rate"), burst_statistics(codes, "false_alarm_rate")
    _check_rate((m, lm), miss)
    _check_rate((f, lf), fa)
    _check_burst(m, miss, lm)
    if fa > 0:
        _check_burst(f, fa, lf)
    else:
        assert f.errors == 0


def test_the_first_frame_is_stationary_and_state_restarts():
    truth = np.ones((20_000, 2))
    inj = ConfusionInjector(0.3, 0.0, 10.0, 1.0)
    first = _run(inj, truth)[:, 0]
    se = math.sqrt(0.3 * 0.7 / first.size)
    assert abs((first == 0).mean() - 0.3) <= Z * se
    # t == 0 redraws the state: a second episode does not continue the first's bursts
    again = _run(inj, truth, seed=1)[:, 0]
    assert abs((again == 0).mean() - 0.3) <= Z * se


def test_chain_probabilities_hold_the_stationary_rate():
    for rate, L in itertools.product([0.0, 0.01, 0.3, 0.5, 0.9, 1.0], [1.0, 2.0, 5.0, 50.0]):
        start, stay = chain_probabilities(rate, L)
        assert 0.0 <= start <= 1.0 and 0.0 <= stay <= 1.0
        if 0 < rate < 1:
            assert start / (start + 1 - stay) == pytest.approx(rate)
    assert chain_probabilities(0.3, 1.0) == pytest.approx((0.3, 0.3))  # L = 1: independent frames


def test_determinism_for_a_given_rng():
    truth = _truth(8, 100)
    model = make_error_model("ar1", "miss_rate")
    a = _run(model.injector({"metric": 0.2}), truth, seed=5)
    b = _run(model.injector({"metric": 0.2}), truth, seed=5)
    c = _run(model.injector({"metric": 0.2}), truth, seed=6)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


# ---------------------------------------------------------------- the models the spec's names make


def _reference_codes() -> list[np.ndarray]:
    """A reference detector's codes: misses in bursts of 3 on 10% of positive frames, false alarms alone on 2%."""
    truth = _truth(40, 250, seed=3)
    out = _run(ConfusionInjector(0.1, 0.02, 3.0, 1.0), truth, seed=4)
    return list(_codes(out, truth))


@pytest.mark.parametrize("name", sorted(ERROR_MODELS))
def test_make_error_model_for_each_name_on_a_class_metric(name):
    codes = _reference_codes()
    m, f = burst_statistics(codes, "miss_rate"), burst_statistics(codes, "false_alarm_rate")
    model = make_error_model(name, "miss_rate", codes)
    assert isinstance(model, Confusion) and model.components == frozenset({"metric"})
    assert model.config()["model"] == "confusion" and model.config()["error_model"] == name
    assert model.ratio == pytest.approx(f.rate / m.rate)  # fitted from the reference whenever it is given
    expected = {"gaussian": 1.0, "ar1": DEFAULT_BURST_STEPS}.get(name, m.mean_burst)
    assert model.miss_burst_steps == pytest.approx(expected)
    assert model.rates({"metric": 0.2}) == pytest.approx((0.2, 0.2 * model.ratio))
    with pytest.raises(CalibrationError, match="component 'metric'"):
        model.injector({"sigma": 0.1})
    if name in ("gaussian", "ar1"):  # defaults without a reference
        bare = make_error_model(name, "false_alarm_rate")
        assert bare.ratio == DEFAULT_RATIO and bare.rates({"metric": 0.1}) == pytest.approx((0.1, 0.1))
    else:
        with pytest.raises(CalibrationError, match="needs the NN's confusion codes"):
            make_error_model(name, "miss_rate")
    # distinct models have distinct cache keys
    assert model.config() != make_error_model("gaussian" if name != "gaussian" else "ar1", "miss_rate", codes).config()


def test_a_fit_without_misses_falls_back_with_the_reason():
    codes = [np.array([1.0, 1.0, 0.0, 3.0, 0.0, 1.0])]
    model = make_error_model("empirical", "miss_rate", codes)
    assert model.ratio == DEFAULT_RATIO and model.miss_burst_steps == DEFAULT_BURST_STEPS
    assert "makes no miss on its 3 frames" in model.note and model.note in str(model.config())
    with pytest.raises(CalibrationError, match="confusion codes"):
        make_error_model("empirical", "miss_rate", [np.array([0.1, -0.2, 0.3])])


def test_a_fitted_model_injects_the_reference_bursts():
    codes = _reference_codes()
    model = make_error_model("empirical", "miss_rate", codes)
    truth = _truth(200, 400)
    out = _run(model.injector({"metric": 0.15}), truth)
    m = burst_statistics(list(_codes(out, truth)), "miss_rate")
    _check_rate((m, model.miss_burst_steps), 0.15)
    _check_burst(m, 0.15, model.miss_burst_steps)


# ---------------------------------------------------------------- the spec


def test_the_spec_declares_a_detector(tmp_path):
    spec = load(SPEC)
    metric = spec.nns["stop"].error_metric
    assert metric.kind == "miss_rate" and metric.threshold == 0.5
    assert "threshold" not in spec.nns["a"].error_metric.model_dump()  # regression specs keep their hashes


def _spec_with(tmp_path, edit) -> str:
    data = yaml.safe_load(SPEC.read_text())
    edit(data)
    path = tmp_path / "detector3.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_validate_rejects_sigma_on_the_detector_axis(tmp_path, capsys):
    path = _spec_with(tmp_path, lambda d: d["calibration"]["space"][2].update(component="sigma"))
    with pytest.raises(SystemExit) as info:
        main(["validate", "--no-imports", path])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "calibration.space.2.component: 'sigma' means nothing for NN 'stop'" in err
    assert "use component: metric" in err and "Traceback" not in err


def test_validate_rejects_a_threshold_on_a_regression_metric(tmp_path):
    path = _spec_with(tmp_path, lambda d: d["nns"]["a"]["error_metric"].update(threshold=0.3))
    with pytest.raises(SpecError, match="threshold is only meaningful for the class metrics"):
        load(path)
    path = _spec_with(tmp_path, lambda d: d["nns"]["stop"]["error_metric"].update(threshold=0.0))
    with pytest.raises(SpecError, match="threshold"):
        load(path)


# ---------------------------------------------------------------- approx


def test_approx_measures_a_detector_by_its_miss_rate():
    from detector3 import detector_data, detector_net
    from qaopt.approx.target import ErrorMetric, TargetNN

    probs = np.array([[0.8], [0.3], [0.1], [0.7], [0.45]])
    labels = np.array([[1.0], [1.0], [0.0], [0.0], [1.0]])
    metric = ErrorMetric("miss_rate", 0, 0.5)
    assert metric(probs, labels) == pytest.approx(2 / 3)
    assert ErrorMetric("miss_rate", 0, 0.4)(probs, labels) == pytest.approx(1 / 3)
    assert ErrorMetric("false_alarm_rate", 0, 0.5)(probs, labels) == pytest.approx(1 / 2)
    per_drive = metric.residuals(probs, labels, [np.array([0, 1]), np.array([2, 3, 4])])
    assert [r.tolist() for r in per_drive] == [[TRUE_POSITIVE, MISS], [TRUE_NEGATIVE, FALSE_ALARM, MISS]]

    spec = load(SPEC)
    target = TargetNN.from_spec("stop", spec.nns["stop"])
    assert target.metric == ErrorMetric("miss_rate", 0, 0.5)
    assert detector_net is not None and len(detector_data().val_sequences) == 6
    other = TargetNN("stop", target.model, target.data, target.input_shape, ErrorMetric("miss_rate", 0, 0.3),
                     target.architecture)
    assert other.fingerprint != target.fingerprint  # the threshold keys a detector's candidates


# ---------------------------------------------------------------- end to end


def test_calibration_over_three_nns_with_a_detector(tmp_path, monkeypatch):
    from qaopt.region_calibration import calibrate_spec
    from qaopt.spec import load_spec

    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    shutil.copy(SPEC, tmp_path)
    spec = load_spec(tmp_path / "detector3.yaml")
    region, folder = calibrate_spec(spec, out=tmp_path / "runs")
    assert (folder / "region.png").stat().st_size > 0 and (folder / "region.json").exists()
    assert [a.name for a in region.space.axes] == ["a", "b", "stop"]
    assert region.metrics["stop"] == "miss_rate"
    assert region.info["error_models"]["stop"]["model"] == "confusion"

    # monotone: whatever is certified, every point with less error on every axis is too
    levels = np.linspace(0.0, 1.0, 6)
    U = np.array(list(itertools.product(levels, repeat=3)))
    ok = region.contains_unit(U)
    assert ok.sum() > 1, "nothing beyond the reference point is certified"
    for u in U[ok]:
        assert ok[(U <= u + 1e-12).all(axis=1)].all()
    # the detector's axis matters: more miss rate turns a certified point invalid
    assert region.contains_unit(np.array([[0.0, 0.0, 0.0]]))[0]
    assert not region.contains({"a": 0.0, "b": 0.0, "stop": region.space.axes[2].max})
    assert region.probability({"a": 0.0, "b": 0.0, "stop": 0.1}) < region.probability({"a": 0.0, "b": 0.0, "stop": 0.0})

    # a detector is placed by both its error kinds, in the proportion the calibration injected them (saved with it)
    ratio = region.info["error_models"]["stop"]["ratio"]
    assert ratio > 0 and ErrorRegion.load(folder / "region.json").class_ratio("stop") == ratio
    assert region.class_ratio("a") is None
    rng = np.random.default_rng(0)
    regression = {"a": rng.normal(0, 0.01, 200), "b": rng.normal(0, 0.01, 200)}
    alarms = np.array([TRUE_POSITIVE] * 200 + [TRUE_NEGATIVE] * 160 + [FALSE_ALARM] * 40)  # no miss, 20 % false alarms
    assert region.errors_of({**regression, "stop": alarms})["stop"] == pytest.approx(min(1.0, 0.2 / ratio))
    quiet = np.array([TRUE_POSITIVE] * 190 + [MISS] * 10 + [TRUE_NEGATIVE] * 200)
    assert region.errors_of({**regression, "stop": quiet})["stop"] == pytest.approx(0.05)


def test_the_reference_detector_is_measured_in_codes_and_fitted(tmp_path):
    """approx builds the reference detector, saves its per-drive codes, and the fitted model says why it fell back."""
    from qaopt.on_policy import reference_residuals

    spec = load(_spec_with(tmp_path, lambda d: d["calibration"].update(error_model="empirical")))
    codes, truths = reference_residuals(spec, "stop", tmp_path / "cache")
    assert len(codes) == 6 and all(set(np.unique(c)) <= {0.0, 1.0, 2.0, 3.0} for c in codes)
    assert all(np.array_equal(c == TRUE_POSITIVE, (t >= 0.5) & (c != MISS)) for c, t in zip(codes, truths))
    model = make_error_model("empirical", "miss_rate", codes)
    misses = burst_statistics(codes, "miss_rate")
    if misses.errors:
        assert model.miss_burst_steps == pytest.approx(max(1.0, misses.mean_burst))
    else:  # this detector is perfect on its validation drives
        assert model.ratio == DEFAULT_RATIO and "makes no miss" in model.note
