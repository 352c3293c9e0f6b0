"""Calibration: evaluate points with injected errors and search the region.

:class:`Calibration` binds an application (a :class:`QoSEvaluator`), the error
space, an error model per NN, the QoS goal and the acceptance test. It evaluates
one point (a sequential test over cached seed blocks) and runs a region search
strategy within a budget of evaluations (a point's runs count as one), folding
in any external evidence first.

An evaluator that raises, or returns something that is not one finite QoS
value per seed, fails only that point: the failure is recorded with its message
and the search goes on. Nothing is cached for a failed block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from qaopt.calibrate.acceptance import AcceptanceTest, QoSGoal, Verdict
from qaopt.calibrate.error_models import ErrorModel
from qaopt.calibrate.errors import CalibrationError
from qaopt.calibrate.protocols import Injector, QoSEvaluator, is_qos_value, records_problem
from qaopt.calibrate.region import ErrorRegion, Evidence, Observation
from qaopt.calibrate.space import ErrorSpace
from qaopt.calibrate.strategies import Strategy, make_strategy
from qaopt.calibrate.trials import TrialCache, block_seeds


@dataclass(frozen=True)
class Progress:
    """Reported after every seed block and when a point is decided (``observation`` set)."""

    evaluation: int  # 1-based index of the point being evaluated
    budget: int
    errors: dict[str, float]
    trials: int  # runs so far at this point
    total_trials: int  # runs so far in this search (cached ones included)
    observation: Observation | None = None


class BadEvaluation(Exception):
    """An evaluator raised or returned garbage; the point is recorded as failed."""


class Calibration:
    """Evaluates error points of one application and searches its error region.

    Every point is run with the same seeds (common random numbers), so two points
    differ only in the errors injected, which makes neighbouring verdicts consistent.
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
        seed_base: int = 0,
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
        self.goal, self.acceptance, self.app_key = goal, acceptance, app_key
        self.seed_base = seed_base  # seeds of block b: seed_base + b*block ... (same at every point)
        self.cache = TrialCache(cache_dir)

    # -- one point ------------------------------------------------------------------
    def injection(self, errors: Mapping[str, float]) -> dict[str, dict]:
        """The full description of what is injected at a point (part of the cache key)."""
        return {nn: {"model": self.models[nn].config(), "setting": s}
                for nn, s in self.space.settings(errors).items()}

    def injectors(self, errors: Mapping[str, float]) -> dict[str, Injector]:
        return {nn: self.models[nn].injector(s) for nn, s in self.space.settings(errors).items()}

    def run_seeds(self, errors: Mapping[str, float], seeds: list[int]) -> list[bool]:
        """Pass/fail per seed of one evaluator call, from the cache or by running the evaluator.

        The seed list is the unit of caching: an evaluator may draw its noise from the
        whole list (the simulator runs it in lock-step), so a run's outcome is only
        reproducible for the same list.
        """
        key = TrialCache.key(self.app_key, self.injection(errors), seeds)
        records = self.cache.get(key)
        if records is None or records_problem(records, seeds, self.goal.metric):  # a stale entry is run again
            try:
                records = self.evaluator.evaluate(self.injectors(errors), seeds)
            except Exception as e:  # noqa: BLE001 - any evaluator failure fails only this point
                raise BadEvaluation(f"evaluator raised {type(e).__name__}: {e}") from e
            problem = records_problem(records, seeds, self.goal.metric)
            if problem:
                raise BadEvaluation(f"evaluator returned {problem}")
            records = [{k: float(v) for k, v in r.items() if is_qos_value(v)} for r in records]
            self.cache.put(key, records)
        return [self.goal.passes(r[self.goal.metric]) for r in records]

    def evaluate(self, errors: Mapping[str, float],
                 on_block: Callable[[int], None] | None = None) -> Observation:
        """The sequential test at one point: blocks until the verdict is decided or runs run out."""
        errors = dict(errors)
        passes = failures = 0
        verdict = Verdict.UNDECIDED
        try:
            for block in range(self.acceptance.looks[-1] // self.acceptance.block):
                outcome = self.run_seeds(errors, block_seeds(block, self.acceptance.block, self.seed_base))
                passes += sum(outcome)
                failures += len(outcome) - sum(outcome)
                if on_block:
                    on_block(passes + failures)
                if passes + failures in self.acceptance.looks:
                    verdict = self.acceptance.decide(failures, passes + failures)
                    if verdict is not Verdict.UNDECIDED:
                        break
        except BadEvaluation as e:
            return Observation(errors, passes, failures, Verdict.FAILED, message=str(e))
        return Observation(errors, passes, failures, verdict)

    def evaluate_fixed(self, errors: Mapping[str, float], trials: int, first_seed: int = 0) -> Observation:
        """``trials`` runs in one call (seeds ``first_seed, ...``), verdict by one fixed test.

        For ground truth: give it seeds the searches never use.
        """
        errors = dict(errors)
        try:
            outcome = self.run_seeds(errors, list(range(first_seed, first_seed + trials)))
        except BadEvaluation as e:
            return Observation(errors, 0, 0, Verdict.FAILED, message=str(e))
        fails = len(outcome) - sum(outcome)
        return Observation(errors, sum(outcome), fails, self.acceptance.decide_fixed(fails, len(outcome)))

    # -- the search -----------------------------------------------------------------
    def search(
        self,
        strategy: str | Strategy = "monotone",
        budget: int = 20,
        evidence: Sequence[Evidence] = (),
        seed: int = 0,
        progress: Callable[[Progress], None] | None = None,
    ) -> ErrorRegion:
        """Spend up to ``budget`` evaluations to chart the region; points monotonicity decides are free."""
        if not isinstance(budget, int) or budget < 1:
            raise CalibrationError(f"calibration.budget: {budget!r} evaluations; give at least 1")
        name = strategy if isinstance(strategy, str) else type(strategy).__name__
        strat = make_strategy(strategy, self.space.dim, seed) if isinstance(strategy, str) else strategy
        region = ErrorRegion(
            self.space, self.acceptance,
            metrics={nn: m.config()["metric"] for nn, m in self.models.items() if nn in self.space.nns},
            info={"strategy": name, "budget": budget, "goal": self.goal.to_json(), "app_key": self.app_key,
                  "error_models": {nn: self.models[nn].config() for nn in self.space.nns}},
        )
        region.add_evidence(list(evidence))
        for p in region.labelled():
            strat.tell(p.unit, p.valid)
        spent = total = free = 0
        while spent < budget:
            x = strat.ask()
            if x is None:
                break
            implied = region.dominance().implied(x)
            if implied is not None and free < 100_000:
                free += 1
                strat.tell(x, implied)
                continue
            errors = self.space.from_unit(x)

            def on_block(n: int, _e=errors, _i=spent + 1) -> None:
                if progress:
                    progress(Progress(_i, budget, _e, n, total + n))

            ob = self.evaluate(errors, on_block)
            spent += 1
            total += ob.trials
            region.add(ob)
            strat.tell(x, None if ob.verdict is Verdict.FAILED else ob.verdict is Verdict.VALID)
            if progress:
                progress(Progress(spent, budget, errors, ob.trials, total, ob))
        return region
