"""The sequential acceptance test: its exact error rates, its decisions, and the QoS goal."""

from __future__ import annotations

import numpy as np
import pytest

from qaopt.calibrate import AcceptanceTest, CalibrationError, QoSGoal, Verdict


@pytest.mark.parametrize("delta,confidence", [(0.05, 0.9), (0.1, 0.95), (0.02, 0.8)])
def test_whole_procedure_errs_at_most_one_minus_confidence(delta, confidence):
    test = AcceptanceTest(delta, confidence, 8, 96)
    accept, reject = test.error_probabilities(delta)
    assert accept <= 1 - confidence + 1e-9  # at the worst case for accepting an invalid point ...
    assert reject <= 1 - confidence + 1e-9  # ... and for rejecting a valid one
    # a per-look level equal to the whole level would have been too loose: the correction is needed
    assert max(test.error_probabilities(delta, alpha=1 - confidence)) > 1 - confidence


def test_error_probabilities_agree_with_simulation():
    test = AcceptanceTest(0.05, 0.9, 8, 96)
    rng = np.random.default_rng(0)
    for p in (0.0, 0.03, 0.2):
        outcomes = []
        for _ in range(4000):
            runs = rng.random(96) < p
            for n in test.looks:
                v = test.decide(int(runs[:n].sum()), n)
                if v is not Verdict.UNDECIDED:
                    break
            outcomes.append(v)
        acc, rej = test.error_probabilities(p)
        assert np.mean([o is Verdict.VALID for o in outcomes]) == pytest.approx(acc, abs=0.025)
        assert np.mean([o is Verdict.INVALID for o in outcomes]) == pytest.approx(rej, abs=0.025)


def test_clear_points_stop_early_borderline_ones_run_longer():
    test = AcceptanceTest(0.05, 0.9, 8, 96)
    assert test.decide(8, 8) is Verdict.INVALID  # all failed: one block decides
    assert test.decide(0, 8) is Verdict.UNDECIDED  # 8 clean runs cannot prove 95 %
    first_valid = next(n for n in test.looks if test.decide(0, n) is Verdict.VALID)
    assert 45 <= first_valid <= 96  # zero failures in 45 runs is the fixed-sample minimum at 90 %
    assert test.decide(3, 96) is Verdict.UNDECIDED
    with pytest.raises(ValueError):
        test.decide(0, 9)


def test_fixed_test_for_field_evidence():
    test = AcceptanceTest(0.05, 0.9)
    assert test.decide_fixed(1, 1) is Verdict.INVALID
    assert test.decide_fixed(0, 3) is Verdict.UNDECIDED
    assert test.decide_fixed(0, 45) is Verdict.VALID
    assert test.decide_fixed(0, 0) is Verdict.UNDECIDED


def test_goal_and_bad_parameters():
    assert QoSGoal("c", max=0.0).passes(0.0) and not QoSGoal("c", max=0.0).passes(0.5)
    assert QoSGoal("speed", min=1.0).passes(1.5) and not QoSGoal("speed", min=1.0).passes(0.5)
    assert not QoSGoal("x", max=2.0, min=1.0).passes(0.5)
    with pytest.raises(CalibrationError, match="max.*min"):
        QoSGoal("c")
    with pytest.raises(CalibrationError, match="max_failure_rate"):
        AcceptanceTest(max_failure_rate=1.5)
    with pytest.raises(CalibrationError, match="min_trials"):
        AcceptanceTest(min_trials=50, max_trials=10)
