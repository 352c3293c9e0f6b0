"""Calibration: evaluate points with injected errors and search the region.

:class:`Calibration` binds an application (a :class:`QoSEvaluator`), the error
space, an error model per NN, the QoS goal and the acceptance test. It evaluates
one point (a sequential test over cached seed blocks, or as many blocks as the
strategy asks for) and runs a region search strategy within a budget of
evaluations (a point's runs count as one) and, optionally, of simulator runs,
folding in any external evidence first. The reference point (every axis at its
minimum: the least error the space holds) is always evaluated first; if it fails,
nothing can be valid and the search stops there, saying so.

An evaluator that raises, runs past its time limit, or returns something that is not one
finite QoS value per seed is an application error, not a measurement
(:mod:`qaopt.calibrate.app_calls`): after the spec's retries the search stops with
:class:`~qaopt.calibrate.app_calls.ApplicationFault`, naming the method, the seeds and the
point. Nothing of the failed block is cached or recorded, so the region of a run after the
bug is fixed is the region of a run that never had it.

Seed blocks may run on a :class:`concurrent.futures.Executor` (a process pool, a
Dask cluster's) through the seed-block engine (:func:`~qaopt.calibrate.blocks.run_blocks`):
a point's next blocks are dispatched ahead, as many as the executor has workers, and
their outcomes are consumed strictly in block order, the test (or the strategy's
``more``) asked after each exactly as in the serial loop. The verdict, the runs counted
and the cache's content are therefore the same for any number of workers; blocks
dispatched past the decision are cached when they finish (blocks not yet started are
cancelled) and are not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from qaopt.calibrate.acceptance import AcceptanceTest, QoSGoal, Verdict
from qaopt.calibrate.app_calls import ApplicationFault, Outcome, RunLimits, call_application
from qaopt.calibrate.blocks import Given, run_blocks, workers_of
from qaopt.calibrate.error_models import ErrorModel
from qaopt.calibrate.errors import CalibrationError
from qaopt.calibrate.protocols import Injector, QoSEvaluator, is_qos_value, records_problem
from qaopt.calibrate.region import CERTIFIERS, ErrorRegion, Evidence, Observation
from qaopt.calibrate.space import ErrorSpace
from qaopt.calibrate.strategies import Strategy, make_strategy
from qaopt.calibrate.trials import PointTrials, TrialCache, block_seeds, point_seed_start


@dataclass(frozen=True)
class Progress:
    """Reported after every seed block and when a point is decided (``observation`` set)."""

    evaluation: int  # 1-based index of the point being evaluated
    budget: int
    errors: dict[str, float]
    trials: int  # runs so far at this point
    total_trials: int  # runs so far in this search (cached ones included)
    observation: Observation | None = None


def evaluate_block(make: Callable[[], QoSEvaluator], injectors: Mapping[str, Injector], limits: RunLimits,
                   metric: str, seeds: list[int]) -> Outcome:
    """One seed block on a worker: the evaluator's records, or its failure (raised, hung, garbage) to be named.

    ``make()`` builds (or returns) the evaluator there; an exception from it is not the
    block's (a worker that cannot build the application) and propagates.
    """
    return call_application(make(), "evaluate", injectors, seeds, limits,
                            check=partial(records_problem, seeds=seeds, metric=metric))


def point_text(errors: Mapping[str, float]) -> str:
    """A point as the console shows it: ``heading=2.5, distance=0.1``."""
    return ", ".join(f"{k}={v:.3g}" for k, v in errors.items())


class Calibration:
    """Evaluates error points of one application and searches its error region.

    Every point draws its own seeds from ``seed`` and the point
    (:func:`~qaopt.calibrate.trials.point_seed_start`): verdicts at different points are
    independent evidence, and a set of unusually easy seeds cannot make the whole
    region look easy. ``certifier`` is how the region certifies points (see
    :class:`~qaopt.calibrate.region.ErrorRegion`).
    """

    def __init__(
        self,
        evaluator: QoSEvaluator,
        space: ErrorSpace,
        models: Mapping[str, ErrorModel],
        goal: QoSGoal,
        acceptance: AcceptanceTest,
        cache_dir: str | Path,
        app_key: str,
        seed: int = 0,
        certifier: str = "pooled",
        executor: Executor | None = None,
        workers: int | None = None,
        remote_evaluator: Callable[[], QoSEvaluator] | None = None,
        limits: RunLimits = RunLimits(),
    ):
        space.check_nns(tuple(evaluator.nn_names))
        for a in space.axes:
            if a.nn not in models:
                raise CalibrationError(f"calibration: no error model for NN '{a.nn}'")
            if a.component not in models[a.nn].components:
                raise CalibrationError(
                    f"calibration.space: axis '{a.name}' needs component '{a.component}', which the "
                    f"{models[a.nn].config()['model']} error model of NN '{a.nn}' does not provide"
                )
        self.evaluator, self.space, self.models = evaluator, space, dict(models)
        CERTIFIERS.lookup(certifier)  # a misspelt certifier fails before any run, naming the registered ones
        self.goal, self.acceptance, self.app_key = goal, acceptance, app_key
        self.seed, self.certifier, self.limits = seed, certifier, limits
        self.cache = TrialCache(cache_dir)
        self.use(executor, workers, remote_evaluator)

    def use(self, executor: Executor | None, workers: int | None = None,
            remote_evaluator: Callable[[], QoSEvaluator] | None = None) -> None:
        """Run seed blocks on ``executor`` (``None``: in this process), up to ``workers`` blocks of a point at once.

        ``workers`` defaults to the executor's ``workers`` (or ``_max_workers``) attribute.
        ``remote_evaluator`` is a picklable zero-argument callable that builds the evaluator
        on a worker; without it (and none given before) the evaluator itself is pickled with each block.
        """
        self.executor = executor
        self.workers = workers_of(executor, workers)
        if remote_evaluator is not None or not hasattr(self, "_remote"):
            self._remote = remote_evaluator if remote_evaluator is not None else Given(self.evaluator)

    # -- one point ------------------------------------------------------------------
    def injection(self, errors: Mapping[str, float]) -> dict[str, dict]:
        """The full description of what is injected at a point (part of the cache key)."""
        return {nn: {"model": self.models[nn].config(), "setting": s}
                for nn, s in self.space.settings(errors).items()}

    def injectors(self, errors: Mapping[str, float]) -> dict[str, Injector]:
        return {nn: self.models[nn].injector(s) for nn, s in self.space.settings(errors).items()}

    def run_seeds(self, errors: Mapping[str, float], seeds: list[int]) -> list[bool]:
        """Pass/fail per seed of one evaluator call, from the cache or by running the evaluator in this process.

        The seed list is the unit of caching: an evaluator may draw its noise from the
        whole list (the simulator runs it in lock-step), so a run's outcome is only
        reproducible for the same list. :class:`~qaopt.calibrate.app_calls.ApplicationFault` when the evaluator fails.
        """
        with closing(self._blocks(dict(errors), [seeds], serial=True)) as blocks:
            return self._outcome(next(blocks))

    def _blocks(self, errors: dict[str, float], seeds: list[list[int]], serial: bool = False) -> Iterator[list[dict]]:
        """Each seed block's records at ``errors``, in block order, from the cache or run (on the executor unless ``serial``).

        Closing the iterator (the point is decided) cancels the blocks not yet started;
        those already running are cached when they finish, so their runs are never lost.
        """
        injectors = self.injectors(errors)
        options = (injectors, self.limits, self.goal.metric)
        return run_blocks(
            seeds, partial(evaluate_block, Given(self.evaluator), *options), partial(self._accept, errors),
            executor=None if serial else self.executor, remote=partial(evaluate_block, self._remote, *options),
            width=self.workers, cache=PointTrials(self.cache, self.app_key, self.injection(errors), self.goal.metric))

    @staticmethod
    def _accept(errors: dict[str, float], seeds: list[int], results: list[Outcome]) -> list[dict]:
        """A block's records from its one :func:`evaluate_block` call, made plain; :class:`ApplicationFault` if it failed."""
        [outcome] = results
        if outcome.failure is not None:
            raise ApplicationFault.raised(outcome.failure, f"calibration point {point_text(errors)}")
        raw: Any = outcome.result
        return [{k: float(v) for k, v in r.items() if is_qos_value(v)} for r in raw]

    def _outcome(self, records: list[dict]) -> list[bool]:
        return [self.goal.passes(r[self.goal.metric]) for r in records]

    def evaluate(self, errors: Mapping[str, float], on_block: Callable[[int], None] | None = None,
                 more: Callable[[int, int], bool] | None = None, max_runs: int | None = None) -> Observation:
        """Runs at one point, a seed block at a time, and their verdict.

        Without ``more`` the acceptance test decides when to stop (its sequential
        verdict); with it, ``more(passes, failures)`` is asked after every block and the
        verdict is the test's fixed-sample one. ``max_runs`` caps the runs (a run budget).
        """
        errors = dict(errors)
        start = point_seed_start(self.seed, self.injection(errors))
        cap = self.acceptance.looks[-1] if more is None else self.acceptance.max_trials
        if max_runs is not None:
            cap = min(cap, max_runs)
        passes = failures = 0
        verdict = Verdict.UNDECIDED
        size = self.acceptance.block
        blocks = self._blocks(errors, [block_seeds(start, b, size) for b in range(cap // size)])
        try:
            for records in blocks:
                outcome = self._outcome(records)
                passes += sum(outcome)
                failures += len(outcome) - sum(outcome)
                if on_block:
                    on_block(passes + failures)
                if more is not None:
                    if not more(passes, failures):
                        break
                elif passes + failures in self.acceptance.looks:
                    verdict = self.acceptance.decide(failures, passes + failures)
                    if verdict is not Verdict.UNDECIDED:
                        break
        finally:
            blocks.close()
        if more is not None:
            verdict = self.acceptance.decide_fixed(failures, passes + failures)
        return Observation(errors, passes, failures, verdict)

    def evaluate_fixed(self, errors: Mapping[str, float], trials: int, first_seed: int) -> Observation:
        """``trials`` runs in one call (seeds ``first_seed, ...``), verdict by one fixed test.

        For ground truth: give it seeds below :data:`~qaopt.calibrate.trials.CALIBRATION_SEED_FLOOR`,
        which no search uses.
        """
        errors = dict(errors)
        outcome = self.run_seeds(errors, list(range(first_seed, first_seed + trials)))
        fails = len(outcome) - sum(outcome)
        return Observation(errors, sum(outcome), fails, self.acceptance.decide_fixed(fails, len(outcome)))

    # -- the search -----------------------------------------------------------------
    def search(
        self,
        strategy: str | Strategy = "boundary",
        budget: int = 20,
        evidence: Sequence[Evidence] = (),
        seed: int = 0,
        progress: Callable[[Progress], None] | None = None,
        runs: int | None = None,
    ) -> ErrorRegion:
        """Spend up to ``budget`` evaluations (and ``runs`` simulator runs, when given) to chart the region.

        The reference point comes first and counts as one evaluation. Points whose label
        monotonicity already implies are free for strategies that judge points one at a time.
        """
        if not isinstance(budget, int) or budget < 1:
            raise CalibrationError(f"calibration.budget: {budget!r} evaluations; give at least 1")
        if runs is not None and runs < self.acceptance.min_trials:
            raise CalibrationError(
                f"calibration.runs: {runs} simulator runs cannot judge even the reference point, which needs "
                f"at least qos.acceptance.min_trials = {self.acceptance.min_trials}; raise calibration.runs "
                "or leave it out")
        name = strategy if isinstance(strategy, str) else type(strategy).__name__
        strat = (make_strategy(strategy, self.space.dim, seed, self.acceptance) if isinstance(strategy, str)
                 else strategy)
        more = getattr(strat, "more", None)
        region = ErrorRegion(
            self.space, self.acceptance,
            metrics={nn: m.config()["metric"] for nn, m in self.models.items() if nn in self.space.nns},
            info={"strategy": name, "budget": budget, "runs_budget": runs, "seed": self.seed,
                  "goal": self.goal.to_json(), "app_key": self.app_key,
                  "error_models": {nn: self.models[nn].config() for nn in self.space.nns}},
            certifier=self.certifier,
        )
        region.add_evidence(list(evidence))
        for p in region.labelled():
            strat.tell(p.unit, p.valid)
        spent = total = free = 0
        seen: set[tuple] = set()
        reference = np.zeros(self.space.dim)
        while spent < budget and (runs is None or total < runs):
            x = reference if spent == 0 else strat.ask()
            if x is None:
                break
            key = tuple(np.round(x, 9))
            implied = region.dominance().implied(x)
            if spent > 0 and (key in seen or (more is None and implied is not None)) and free < 100_000:
                free += 1
                strat.tell(x, implied)
                continue
            seen.add(key)
            errors = self.space.from_unit(x)

            def on_block(n: int, _e=errors, _i=spent + 1) -> None:
                if progress:
                    progress(Progress(_i, budget, _e, n, total + n))

            point_more = None if more is None or spent == 0 else (lambda p, f, _x=x: more(_x, p, f))
            ob = self.evaluate(errors, on_block, point_more, None if runs is None else runs - total)
            spent += 1
            total += ob.trials
            region.add(ob)
            strat.tell(x, ob.verdict is Verdict.VALID,
                       ob.passes, ob.failures)
            if progress:
                progress(Progress(spent, budget, errors, ob.trials, total, ob))
            if spent == 1 and ob.verdict is Verdict.INVALID:
                break  # nothing with more error than the reference can be valid
        return region
