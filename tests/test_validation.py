"""Closed-loop validation runs in blocks and stops once a configuration cannot be accepted."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from qaopt.app_spec import load
from qaopt.application import ApplicationError
from qaopt.calibrate import AcceptanceTest, Verdict
from qaopt.closed_loop import ValidationBlocks, acceptable_failures, replay, validate_closed_loop
from qaopt.spec_adapter import acceptance_of, goal_of

SPEC = Path(__file__).resolve().parent / "apps" / "tiny.yaml"


class ScriptedApp:
    """Fails exactly the listed seeds; records which seeds it ran and the options it got; dies at ``dies_at``."""

    def __init__(self, failing: set[int], dies_at: int | None = None):
        self.failing, self.seeds, self.options, self.dies_at = failing, [], [], dies_at

    def evaluate_perception(self, nns, seeds, render_threads=1):
        if self.dies_at in seeds:
            raise KeyboardInterrupt  # the validation is killed in the middle of a block
        self.seeds += list(seeds)
        self.options.append(render_threads)
        return [{"errors": float(s in self.failing), "collisions": np.int64(s in self.failing)} for s in seeds]


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


def test_seeds_that_failed_before_run_first_and_decide_the_same(tmp_path):
    """A scene that failed another configuration runs in the first block: the same rejection costs one block."""
    spec = _spec()
    block = spec.qos.acceptance.min_trials
    judge = (goal_of(spec), acceptance_of(spec))
    hard = 100 + 3 * block + 5
    natural = validate_closed_loop(ScriptedApp(failing={hard}), {}, *judge, 50, trial=1, region_predicted_valid=True,
                                   seed_base=100)
    assert (natural.runs, natural.failed_seeds, natural.worst_seed) == (4 * block, [hard], hard)

    key = spec.content_hash("evaluator", "qos")
    cache = ValidationBlocks.of(tmp_path, {"a": "pruned-1"}, key, judge[0])
    app = ScriptedApp(failing={hard})
    first = validate_closed_loop(app, {}, *judge, 50, trial=1, region_predicted_valid=True, seed_base=100,
                                 first_seeds=[hard], cache=cache)
    assert app.seeds == list(range(100 + 3 * block, 100 + 4 * block))  # only the failing scene's block ran
    assert (first.runs, first.failures, first.failed_seeds, first.worst_seed, first.accepted) == (block, 1, [hard], hard,
                                                                                                 False)
    clean = ScriptedApp(failing=set())  # a configuration that passes the scene runs every block, the same verdict
    v = validate_closed_loop(clean, {}, *judge, 50, trial=2, region_predicted_valid=True, seed_base=100,
                             first_seeds=[hard])
    assert (v.runs, v.failed_seeds, v.accepted) == (50, [], True) and sorted(clean.seeds) == list(range(100, 150))
    assert clean.seeds[:block] == list(range(100 + 3 * block, 100 + 4 * block))
    resumed = ScriptedApp(failing={hard})  # blocks keep their seeds in any order: the cached block is found again
    assert validate_closed_loop(resumed, {}, *judge, 50, trial=1, region_predicted_valid=True, seed_base=100,
                                cache=cache, first_seeds=[hard]) == first and resumed.seeds == []


def test_too_few_runs_to_accept_still_run_all_unless_proven_invalid():
    spec = _spec()
    app = ScriptedApp(failing={100})
    v = validate_closed_loop(app, {}, goal_of(spec), acceptance_of(spec), 6, trial=1, region_predicted_valid=True, seed_base=100)
    assert (v.runs, v.failures, v.verdict) == (6, 1, "undecided")


@pytest.mark.parametrize(("failing", "runs", "first"), [(set(), 50, ()), ({100 + 9}, 50, ()), ({100}, 6, ()),
                                                      ({100, 130}, 48, ()), (set(), 6, ()), ({130, 131}, 48, (30,)),
                                                      ({130, 131}, 48, (0, 30))])
def test_replay_decides_as_the_runs_did(failing, runs, first):
    """Scoring recorded ground truth offline (benchmarks/fidelity.py) spends and decides exactly what running would,
    the blocks holding ``first`` run first."""
    spec = _spec()
    v = validate_closed_loop(ScriptedApp(failing=failing), {}, goal_of(spec), acceptance_of(spec), runs, trial=1,
                             region_predicted_valid=True, seed_base=100, first_seeds=[100 + i for i in first])
    passed = [100 + i not in failing for i in range(runs)]
    assert replay(passed, acceptance_of(spec), runs, first) == (v.runs, v.failures, Verdict(v.verdict))


def test_an_evaluator_without_closed_loop_runs_is_named():
    class InjectionOnly:
        nn_names = ("a", "b")

        def evaluate(self, injectors, seeds):
            return [{"errors": 0.0} for _ in seeds]

    with pytest.raises(ApplicationError, match=r"InjectionOnly has no method evaluate_perception\(nns, seeds, "
                                               r"render_threads=1\); closed-loop validation"):
        validate_closed_loop(InjectionOnly(), {}, goal_of(_spec()), acceptance_of(_spec()), 8, trial=1,
                             region_predicted_valid=True)


def test_cached_blocks_resume_a_killed_validation_and_serve_a_longer_one(tmp_path):
    spec, block = _spec(), _spec().qos.acceptance.min_trials
    judge = (goal_of(spec), acceptance_of(spec))
    key = spec.content_hash("evaluator", "qos")
    cache = ValidationBlocks.of(tmp_path, {"a": "pruned-1", "b": "int8-2"}, key, judge[0])
    with pytest.raises(KeyboardInterrupt):
        validate_closed_loop(ScriptedApp(set(), dies_at=100 + 2 * block + 1), {}, *judge, 5 * block, trial=1,
                             region_predicted_valid=True, seed_base=100, cache=cache)
    uncached = validate_closed_loop(ScriptedApp(set()), {}, *judge, 5 * block, trial=1, region_predicted_valid=True,
                                    seed_base=100)

    resumed = ScriptedApp(set())
    v = validate_closed_loop(resumed, {}, *judge, 5 * block, trial=1, region_predicted_valid=True, seed_base=100,
                             cache=cache)
    assert v == uncached and v.metrics["collisions"].total == 0  # an integer read back from the cache is still a count
    assert resumed.seeds == list(range(100 + 2 * block, 100 + 5 * block))  # the two blocks before the kill are kept

    with ThreadPoolExecutor(3) as ex:  # a longer validation of the same NNs runs only its new block, on any workers
        longer = ScriptedApp(set())
        v = validate_closed_loop(longer, {}, *judge, 6 * block, trial=1, region_predicted_valid=True, seed_base=100,
                                 cache=ValidationBlocks.of(tmp_path, {"a": "pruned-1", "b": "int8-2"}, key, judge[0]),
                                 executor=ex)
    assert v.runs == 6 * block and sorted(longer.seeds) == list(range(100 + 5 * block, 100 + 6 * block))

    other = ScriptedApp(set())  # other NNs share nothing
    validate_closed_loop(other, {}, *judge, block, trial=1, region_predicted_valid=True, seed_base=100,
                         cache=ValidationBlocks.of(tmp_path, {"a": "pruned-1", "b": "int8-3"}, key, judge[0]))
    assert other.seeds == list(range(100, 100 + block))


def test_acceptance_probability_is_what_the_stop_rule_accepts_over_every_outcome():
    """The report's chances of acceptance, exact, against the product's stop rule over all 2^12 run outcomes."""
    import itertools

    from qaopt.closed_loop import acceptance_probability, validation_power

    test = AcceptanceTest(0.4, 0.9, 4, 12, block=4)
    rate = 0.15
    enumerated = 0.0
    for outcome in itertools.product((True, False), repeat=12):
        if replay(list(outcome), test, 12)[2] == Verdict.VALID:
            failures = outcome.count(False)
            enumerated += rate**failures * (1 - rate) ** (12 - failures)
    assert acceptance_probability(test, 12, rate) == pytest.approx(enumerated, rel=1e-9)
    assert acceptable_failures(test, 12) == 2  # a tail of several terms
    power = validation_power(AcceptanceTest(0.05, 0.9), 50)
    assert power.tolerated == 0 and power.accept_probability["0.01"] == pytest.approx(0.99**50, abs=1e-4)
    assert "0.60" in power.line and validation_power(AcceptanceTest(0.05, 0.9), 6).tolerated == -1
