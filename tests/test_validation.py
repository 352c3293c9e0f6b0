"""Closed-loop validation runs in blocks and stops once a configuration cannot be accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from qaopt.app_spec import load
from qaopt.application import ApplicationError
from qaopt.calibrate import AcceptanceTest
from qaopt.closed_loop import acceptable_failures, validate_closed_loop
from qaopt.spec_adapter import acceptance_of, goal_of

SPEC = Path(__file__).resolve().parent / "apps" / "tiny.yaml"


class ScriptedApp:
    """Fails exactly the listed seeds; records which seeds it ran and the options it got."""

    def __init__(self, failing: set[int]):
        self.failing, self.seeds, self.options = failing, [], []

    def evaluate_perception(self, nns, seeds, render_threads=1):
        self.seeds += list(seeds)
        self.options.append(render_threads)
        return [{"errors": float(s in self.failing)} for s in seeds]


def _spec():
    """The tiny app's spec with the shipped example's acceptance test (<= 5 % failing runs at 90 %)."""
    spec = load(SPEC)
    acceptance = spec.qos.acceptance.model_copy(update={"max_failure_rate": 0.05, "confidence": 0.9})
    return spec.model_copy(update={"qos": spec.qos.model_copy(update={"metric": "errors", "max": 0.0, "acceptance": acceptance})})


def test_acceptable_failures_follow_the_clopper_pearson_bound():
    test = AcceptanceTest(0.05, 0.9)
    assert acceptable_failures(test, 50) == 0  # 0/50 bounds the failure rate at 4.5 %; 1/50 at 7.6 %
    assert acceptable_failures(test, 6) == -1  # six runs cannot prove 5 % at 90 %
    assert acceptable_failures(test, 200) >= 4


def test_clean_configuration_runs_every_block_and_is_accepted():
    spec = _spec()
    app = ScriptedApp(failing=set())
    v = validate_closed_loop(app, {}, goal_of(spec), acceptance_of(spec), 50, trial=1, region_predicted_valid=True, seed_base=100, threads=2)
    assert (v.runs, v.failures, v.verdict, v.accepted) == (50, 0, "valid", True)
    assert app.seeds == list(range(100, 150)) and set(app.options) == {2}


def test_failure_stops_validation_after_its_block():
    spec = _spec()
    block = spec.qos.acceptance.min_trials
    app = ScriptedApp(failing={100 + block + 1})  # a failure in the second block
    v = validate_closed_loop(app, {}, goal_of(spec), acceptance_of(spec), 50, trial=1, region_predicted_valid=True, seed_base=100)
    assert v.runs == 2 * block and v.failures == 1 and not v.accepted
    assert app.seeds == list(range(100, 100 + 2 * block))


def test_too_few_runs_to_accept_still_run_all_unless_proven_invalid():
    spec = _spec()
    app = ScriptedApp(failing={100})
    v = validate_closed_loop(app, {}, goal_of(spec), acceptance_of(spec), 6, trial=1, region_predicted_valid=True, seed_base=100)
    assert (v.runs, v.failures, v.verdict) == (6, 1, "undecided")


def test_an_evaluator_without_closed_loop_runs_is_named():
    class InjectionOnly:
        nn_names = ("a", "b")

        def evaluate(self, injectors, seeds):
            return [{"errors": 0.0} for _ in seeds]

    with pytest.raises(ApplicationError, match=r"InjectionOnly has no method evaluate_perception\(nns, seeds, "
                                               r"render_threads=1\); closed-loop validation"):
        validate_closed_loop(InjectionOnly(), {}, goal_of(_spec()), acceptance_of(_spec()), 8, trial=1, region_predicted_valid=True)
