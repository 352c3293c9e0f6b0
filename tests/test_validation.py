"""Closed-loop validation runs in blocks until its sequential test decides, or acceptance is out of reach."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from qaopt.app_spec import load
from qaopt.application import ApplicationError
from qaopt.calibrate import AcceptanceTest, SequentialTest, Verdict
from qaopt.closed_loop import ValidationBlocks, replay, validate_closed_loop
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
    """The tiny app's spec with the shipped example's acceptance test (<= 5 % failing runs at 90 %, 400 runs at most)."""
    spec = load(SPEC)
    acceptance = spec.qos.acceptance.model_copy(update={"max_failure_rate": 0.05, "confidence": 0.9,
                                                        "max_trials": 400})
    return spec.model_copy(update={"qos": spec.qos.model_copy(update={"metric": "errors", "max": 0.0, "acceptance": acceptance})})


def _simulate(test: SequentialTest, rate: float, sequences: int, seed: int) -> np.ndarray:
    """Whether each of ``sequences`` simulated validations (runs failing independently at ``rate``) ends accepted,
    decided look by look with the test's own :meth:`~SequentialTest.decide`."""
    rng = np.random.default_rng(seed)
    looks = np.array(test.looks)
    failures = np.cumsum(rng.binomial(np.diff(looks, prepend=0), rate, size=(sequences, looks.size)), axis=1)
    table = {(f, n): test.decide(int(f), int(n)) for n in looks for f in range(n + 1)}
    accepted = np.zeros(sequences, dtype=bool)
    for k in range(sequences):
        for f, n in zip(failures[k], looks):
            verdict, stop = table[(f, n)]
            if stop:
                accepted[k] = verdict == Verdict.VALID
                break
    return accepted


def test_sequential_test_holds_its_goal_and_its_stated_power_over_simulated_runs():
    """10,000 simulated validations per rate: accepting at the goal's rate is at most 1 - confidence, and at half the
    goal the acceptance rate is the one the report states (exact), within simulation error."""
    test = SequentialTest(0.05, 0.9, cap=400, block=8, min_trials=8)
    n = 10_000
    at_goal = _simulate(test, 0.05, n, seed=1).mean()
    assert at_goal <= 0.1 + 3 * np.sqrt(0.1 * 0.9 / n)
    assert test.operating(0.05)[0] <= 0.1
    stated = test.operating(test.powered_rate)[0]
    assert stated >= 0.8  # the shipped examples' cap powers the test at half the goal
    assert _simulate(test, test.powered_rate, n, seed=2).mean() == pytest.approx(stated, abs=4 * np.sqrt(0.25 / n))
    assert f"{stated:.2f}" in test.power_line() and "2.5%" in test.power_line()


def test_one_early_failure_and_none_later_is_accepted_where_the_bound_allows():
    spec = _spec()
    app = ScriptedApp(failing={101})  # the second run fails, no other
    v = validate_closed_loop(app, {}, goal_of(spec), acceptance_of(spec), 400, trial=1, region_predicted_valid=True,
                             seed_base=100)
    test = SequentialTest.of(acceptance_of(spec), 400)
    first_accepting = next(n for n in test.looks if test.decide(1, n) == (Verdict.VALID, True))
    assert (v.runs, v.failures, v.verdict, v.accepted) == (first_accepting, 1, "valid", True)
    clean = validate_closed_loop(ScriptedApp(set()), {}, goal_of(spec), acceptance_of(spec), 400, trial=1,
                                 region_predicted_valid=True, seed_base=100)
    assert clean.accepted and clean.runs < v.runs  # a failure costs runs, not the verdict


def test_clean_configuration_is_accepted_at_the_first_look_that_allows_it():
    spec = _spec()
    app = ScriptedApp(failing=set())
    cap = spec.qos.acceptance.max_trials
    v = validate_closed_loop(app, {}, goal_of(spec), acceptance_of(spec), cap, trial=1, region_predicted_valid=True,
                             seed_base=100, threads=2)
    test = SequentialTest.of(acceptance_of(spec), cap)
    runs = next(n for n in test.looks if test.decide(0, n)[0] == Verdict.VALID)
    assert (v.runs, v.failures, v.verdict, v.accepted) == (runs, 0, "valid", True)
    assert app.seeds == list(range(100, 100 + runs)) and set(app.options) == {2}


def test_failures_stop_validation_once_acceptance_is_out_of_reach():
    """Failures too sparse to reject, but more than any acceptance within the cap tolerates: the runs stop at the
    look after the one too many, undecided, without spending the rest of the cap."""
    spec = _spec()
    cap = spec.qos.acceptance.max_trials
    test = SequentialTest.of(acceptance_of(spec), cap)
    failing = [100 + 24 * k for k in range(test.tolerated + 1)]
    app = ScriptedApp(failing=set(failing))
    v = validate_closed_loop(app, {}, goal_of(spec), acceptance_of(spec), cap, trial=1, region_predicted_valid=True,
                             seed_base=100)
    stop = next(n for n in test.looks if n > failing[-1] - 100)
    assert test.decide(len(failing), stop) == (Verdict.UNDECIDED, True)
    assert (v.runs, v.failures, v.verdict, v.accepted) == (stop, len(failing), "undecided", False) and stop < cap
    assert app.seeds == list(range(100, 100 + stop))


def test_many_failures_are_rejected_at_once():
    spec = _spec()
    block = spec.qos.acceptance.min_trials
    app = ScriptedApp(failing=set(range(100 + block, 100 + 2 * block)))
    v = validate_closed_loop(app, {}, goal_of(spec), acceptance_of(spec), spec.qos.acceptance.max_trials, trial=1,
                             region_predicted_valid=True, seed_base=100)
    assert (v.runs, v.verdict) == (2 * block, "invalid")


def test_seeds_that_failed_before_run_first_and_decide_the_same(tmp_path):
    """Scenes that failed another configuration run in the first blocks: the same rejection costs fewer runs."""
    spec = _spec()
    block = spec.qos.acceptance.min_trials
    judge, cap = (goal_of(spec), acceptance_of(spec)), spec.qos.acceptance.max_trials
    hard = [100 + k * block * 6 + 5 for k in range(5)]  # one failing scene in each of five blocks far apart
    natural = validate_closed_loop(ScriptedApp(failing=set(hard)), {}, *judge, cap, trial=1,
                                   region_predicted_valid=True, seed_base=100)
    assert natural.failures >= 4 and natural.runs > hard[3] - 100  # in seed order, the scenes come late

    key = spec.content_hash("evaluator", "qos")
    cache = ValidationBlocks.of(tmp_path, {"a": "pruned-1"}, key, judge[0])
    app = ScriptedApp(failing=set(hard))
    first = validate_closed_loop(app, {}, *judge, cap, trial=1, region_predicted_valid=True, seed_base=100,
                                 first_seeds=hard, cache=cache)
    assert app.seeds == [s for h in hard for s in range(h - 5, h - 5 + block)]  # only the failing scenes' blocks ran
    assert (first.runs, first.failures, first.verdict) == (5 * block, 5, "invalid") and first.runs < natural.runs
    clean = ScriptedApp(failing=set())  # a configuration that passes the scenes: the same verdict as in seed order
    v = validate_closed_loop(clean, {}, *judge, cap, trial=2, region_predicted_valid=True, seed_base=100,
                             first_seeds=hard)
    in_order = validate_closed_loop(ScriptedApp(set()), {}, *judge, cap, trial=2, region_predicted_valid=True,
                                    seed_base=100)
    assert (v.runs, v.failed_seeds, v.accepted) == (in_order.runs, [], True)
    assert clean.seeds[:block] == list(range(100, 100 + block))  # the first hard block is the first block anyway
    assert clean.seeds[block:2 * block] == list(range(hard[1] - 5, hard[1] - 5 + block))
    resumed = ScriptedApp(failing=set(hard))  # blocks keep their seeds in any order: the cached blocks are found again
    assert validate_closed_loop(resumed, {}, *judge, cap, trial=1, region_predicted_valid=True, seed_base=100,
                                cache=cache, first_seeds=hard) == first and resumed.seeds == []


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


def test_acceptance_probability_is_what_the_test_accepts_over_every_outcome():
    """The report's chances of acceptance, exact, against the product's decisions over all 2^12 run outcomes."""
    import itertools

    from qaopt.closed_loop import validation_power

    test = AcceptanceTest(0.4, 0.9, 4, 12, block=4)
    rate = 0.15
    enumerated = runs = 0.0
    for outcome in itertools.product((True, False), repeat=12):
        used, _, verdict = replay(list(outcome), test, 12)
        failures = outcome.count(False)
        weight = rate**failures * (1 - rate) ** (12 - failures)
        enumerated += weight if verdict == Verdict.VALID else 0.0
        runs += weight * used
    accept, _, expected = SequentialTest.of(test).operating(rate)
    assert accept == pytest.approx(enumerated, rel=1e-9) and expected == pytest.approx(runs, rel=1e-9)
    power = validation_power(AcceptanceTest(0.05, 0.9, 8, 400, block=8), 400)
    assert power.runs == 400 and power.accept_probability["0.025"] >= 0.8 and power.accept_probability["0.05"] <= 0.1
    assert f"{power.accept_probability['0.025']:.2f}" in power.line
    assert not SequentialTest.of(AcceptanceTest(0.05, 0.9), 6).can_accept
    assert "no configuration can be accepted" in validation_power(AcceptanceTest(0.05, 0.9), 6).line
