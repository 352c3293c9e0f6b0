"""Calibration statistics: per-point seeds, the reference point first, and the pooled certifier's confidence.

The certifier is checked against an application whose failure probability at every
point is known (``KnownRateApp``): over many independent data sets, the certified
region must lie inside the truly valid region at least as often as the stated
confidence says, and it must reach further than per-point certification on the
same runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit, logit

from qaopt.calibrate import AcceptanceTest, Axis, Calibration, CalibrationError, ErrorSpace, Gaussian, QoSGoal, Verdict
from qaopt.calibrate.dominance import Dominance
from qaopt.calibrate.pooled import PooledCertifier
from qaopt.calibrate.synthetic import KnownRateApp
from qaopt.calibrate.trials import CALIBRATION_SEED_FLOOR

GOAL = QoSGoal("failed", max=0.0)
TEST = AcceptanceTest(max_failure_rate=0.05, confidence=0.9, min_trials=8, max_trials=96)
LIMITS = np.array([0.6, 0.5])


def ellipse_rate(u: np.ndarray, steep: float = 5.0) -> np.ndarray:
    """P(fail) at unit-cube points: 5 % on a quarter ellipse, rising smoothly outside it."""
    load = ((np.atleast_2d(u) / LIMITS) ** 2).sum(1)
    return expit(logit(0.05) + steep * (load - 1))


def app_and_cal(tmp_path, rate=lambda lv: ellipse_rate(np.array([[lv["a"], lv["b"]]]))[0], seed=0, **kw):
    app = KnownRateApp(["a", "b"], rate)
    space = ErrorSpace([Axis("a", 1.0), Axis("b", 1.0)])
    return app, Calibration(app, space, {"a": Gaussian(), "b": Gaussian()}, GOAL, TEST, tmp_path, "known",
                            seed=seed, **kw)


def test_each_point_has_its_own_reproducible_seeds(tmp_path):
    app, cal = app_and_cal(tmp_path / "a")
    cal.evaluate({"a": 0.1, "b": 0.1})
    cal.evaluate({"a": 0.2, "b": 0.1})
    first, second = app.seeds[0], app.seeds[-1]
    assert not set(first) & set(second)  # different points never share seeds
    assert min(first + second) >= CALIBRATION_SEED_FLOOR  # and never the seeds of validation or training data
    again, cal_again = app_and_cal(tmp_path / "b")
    assert cal_again.evaluate({"a": 0.1, "b": 0.1}) == cal.evaluate({"a": 0.1, "b": 0.1})
    assert again.seeds[0] == first  # the same seed and point give the same runs
    other, cal_other = app_and_cal(tmp_path / "c", seed=1)
    cal_other.evaluate({"a": 0.1, "b": 0.1})
    assert not set(other.seeds[0]) & set(first)  # another calibration.seed, other runs


def test_the_reference_point_is_evaluated_first(tmp_path):
    _, cal = app_and_cal(tmp_path)
    for strategy in ("boundary", "monotone", "bisect"):
        region = cal.search(strategy, 3)
        assert region.observations[0].errors == {"a": 0.0, "b": 0.0}, strategy


def test_a_failing_reference_ends_the_search_and_says_so(tmp_path):
    _, cal = app_and_cal(tmp_path, rate=lambda lv: 0.5)
    region = cal.search("boundary", 10)
    assert region.evaluations == 1 and region.observations[0].verdict is Verdict.INVALID
    reason = region.empty_reason()
    ob = region.observations[0]
    assert "reference point (a=0, b=0" in reason and f"{ob.failures} of {ob.trials} runs failed" in reason


def test_an_empty_region_elsewhere_names_the_points_tried_and_suggests_narrowing(tmp_path):
    # valid only very close to the origin: with wide axes the few evaluations never certify anything but the origin
    _, cal = app_and_cal(tmp_path, rate=lambda lv: 0.0 if lv["a"] + lv["b"] == 0 else 0.04 + lv["a"] + lv["b"],
                         certifier="per-point")
    region = cal.search("monotone", 4)
    reason = region.empty_reason()
    assert reason is not None and "4 evaluations" in reason and "Narrow the axes" in reason
    assert "(a=" in reason  # the points tried are listed


def test_a_run_budget_too_small_for_the_reference_is_a_clear_error(tmp_path):
    _, cal = app_and_cal(tmp_path)
    with pytest.raises(CalibrationError, match=r"calibration.runs: 4 simulator runs cannot judge even the reference"):
        cal.search("boundary", 5, runs=4)
    region = cal.search("monotone", 50, runs=100)
    assert region.trials <= 100


def test_boundary_spends_runs_where_the_verdict_is_unclear(tmp_path):
    _, cal = app_and_cal(tmp_path)
    region = cal.search("boundary", 14)
    rate = ellipse_rate(np.array([cal.space.to_unit(o.errors) for o in region.observations[1:]]))
    runs = np.array([o.trials for o in region.observations[1:]])
    # A clearly failing point stops at its first block; a passing one runs until the model is sure enough
    # to certify it (strategies.CERTAIN), and only points near the boundary take the whole per-point budget.
    full = runs == cal.acceptance.max_trials
    assert (rate > 0.5).any() and (runs[rate > 0.5] <= 2 * cal.acceptance.block).all()
    assert full.any() and ((rate[full] > 0.005) & (rate[full] < 0.2)).all()
    assert runs[rate > 0.5].mean() < runs[(rate > 0.01) & (rate < 0.2)].mean()


@pytest.mark.parametrize("steep,min_gain", [(5.0, 0.05), (25.0, 0.0)])
def test_the_pooled_region_is_inside_the_truly_valid_region_at_the_stated_confidence(steep, min_gain):
    """Over independent data sets, the certified region is wholly valid at least 90 % of the time."""
    rng = np.random.default_rng(0)
    g = (np.arange(25) + 0.5) / 25
    grid = np.array([(a, b) for a in g for b in g])
    truth = ellipse_rate(grid, steep) <= 0.05
    wrong, gained = 0, []
    reps = 40
    for _ in range(reps):
        U = rng.random((20, 2))
        U[0] = 0.0
        n = np.full(20, 48)
        k = rng.binomial(n, ellipse_rate(U, steep))
        called = PooledCertifier(U, n, k, 0.05, 0.9).certified(grid)
        wrong += bool((called & ~truth).any())
        per_point = np.array([TEST.decide_fixed(int(f), 48) is Verdict.VALID for f in k])
        gained.append(called.mean() - (Dominance.from_labels(U, per_point).labels(grid) > 0).mean())
    assert wrong <= 0.1 * reps  # 90 % confidence for the whole region, not point by point
    # pooling certifies more than the same runs judged point by point where P(fail) rises gradually
    # (points failing 1-5 % of the time exist); at a near-step there is little to gain, and nothing is lost
    print(f"mean gain {np.mean(gained):.3f}, wrong {wrong}/{reps}")
    assert np.mean(gained) > min_gain


def test_axes_starting_above_the_reference_error_are_a_clear_error(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from qaopt.calibrate import ErrorRegion
    from qaopt.search import OptimizeError
    from qaopt.stages.reference import reference_configuration
    from qaopt.stages.region import CalibratedRegion, ClosedLoopEvidence, RegionChoice

    region = ErrorRegion(ErrorSpace([Axis("a", 1.0, min=0.2), Axis("b", 1.0)]), TEST)
    plan = SimpleNamespace(source="app.yaml", run_dir=tmp_path)
    ctx = SimpleNamespace(plan=plan, reference="ref", errors_of=lambda config: {"a": 0.05, "b": 0.1})
    calibrated = CalibratedRegion(RegionChoice(region, tmp_path / "region.json", ""), ClosedLoopEvidence(), "app")
    with pytest.raises(OptimizeError, match=r"calibration.space.0 \(a\) starts at min = 0.2, above the reference NN's "
                                            r"error 0.05.*Set its min to at most 0.05"):
        reference_configuration(ctx, calibrated)


def test_a_spec_run_budget_below_the_first_look_is_named_at_its_line(spec_file):
    from qaopt.app_spec import SpecError, load

    path = spec_file()
    path.write_text(path.read_text().replace("strategy: monotone", "strategy: boundary\n  runs: 4"))
    with pytest.raises(SpecError, match=r"app.yaml:\d+:\d+: calibration.runs: 4 simulator runs cannot judge even "
                                        r"the reference point, which needs qos.acceptance.min_trials = 8"):
        load(path)
