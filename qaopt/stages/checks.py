"""Closed-loop checks during the search: real NNs correct the region while the aware study still runs.

The region is charted with *injected* errors; a real pruned or quantized NN errs in its
own way, and validation (:mod:`.validation`) finds out only after the search settled, for
the few configurations it runs. So the search is multi-fidelity: every trial is judged by
the region (cheap, injection), and after every ``search.closed_loop.every`` completed
trials of the application-aware study a few configurations get closed-loop runs with
their real NNs (expensive), where the answer can change a decision (Trimmer's cost-aware
idea): the feasible configurations on the study's current Pareto front (only they can
become the result), still inside the region and not checked yet, the one nearest the
region's boundary (lowest P(valid)) first, at most ``search.closed_loop.configurations``
of them, and under the profile's cap (``closed_loop_checks``). No round follows the
study's last trial: no trial is left to correct, and validation runs the front next.

A check is one block of the acceptance test's runs (``qos.acceptance.min_trials``, at most
the profile's validation runs), run by :func:`.validation.validate_configuration`: the
same seeds as validation's first block, the same cache (a resumed run reads it back), the
same executor (a round's configurations run at once when it has several workers). A check
with a failing run is recorded as validation records one (:func:`.validation.with_validation`,
into ``closed_loop.json``) and the search's region is refolded with it: where the runs at its
point decide it invalid, later trials at points that dominate it are infeasible and
validation never chooses it (one failure in a block decides nothing, see
:meth:`~qaopt.calibrate.region.ErrorRegion.runs`). A check whose runs all passed changes nothing, so the region is refitted (the pooled certifier
takes up to tens of seconds) only when a verdict can change a decision. Every check is
also recorded in the study (:func:`qaopt.search.record_check`): workers sharing the study,
and a run resumed after a kill, see what was checked and fold in its failures.
"""

from __future__ import annotations

import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import optuna
from optuna.trial import FrozenTrial, TrialState

from qaopt.events import StageEvents
from qaopt.report import format_errors
from qaopt.result import Configuration, StudySummary, Validation
from qaopt.search import (
    SearchContext,
    VersionedRegion,
    finished_trials,
    record_check,
    recorded_checks,
    summarize,
)
from qaopt.stages.region import CalibratedRegion, ClosedLoopEvidence
from qaopt.stages.validation import validate_configuration, with_validation


def front(summary: StudySummary) -> list[Configuration]:
    """The study's feasible, measured configurations that no other one beats on every objective."""
    measured = [t for t in summary.trials if t.feasible and t.configuration is not None and t.objectives]

    def beats(a, b) -> bool:
        return all(a.objectives[o] <= b.objectives[o] for o in b.objectives) and a.objectives != b.objectives

    return [t.configuration for t in measured if not any(beats(other, t) for other in measured)]


@dataclass
class ClosedLoopChecks:
    """The in-search checks of one run, and the owner of the region the aware study is judged by.

    Called after each trial of the aware study (``run_study``'s ``on_done``). ``evidence``
    starts as the run folder's ``closed_loop.json`` and grows with each failing check; each
    time it grows, the region (the calibrated one with the evidence folded in) gets a new
    version, which :meth:`current` hands to the next trial. ``events`` gets what ran, why,
    and what it changed.
    """

    ctx: SearchContext
    calibrated: CalibratedRegion
    events: StageEvents
    executor: Executor | None = None
    evidence: ClosedLoopEvidence = field(init=False)
    _region: VersionedRegion = field(init=False)

    def __post_init__(self) -> None:
        self.evidence = self.calibrated.evidence
        self._region = VersionedRegion(0, self.calibrated.searched(self.evidence))

    def current(self) -> VersionedRegion:
        """The region the next trial is judged by (:class:`qaopt.search.RegionSource`)."""
        return self._region

    @property
    def every(self) -> int:
        """Completed trials between two rounds; 0 when the spec or the profile turns the checks off."""
        return self.ctx.plan.closed_loop.every

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if not self.every or trial.state != TrialState.COMPLETE or finished_trials(study) >= self.ctx.plan.trials:
            return
        complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        if complete % self.every == 0:
            self.round(study, f"after {complete} completed trials")

    def round(self, study: optuna.Study, when: str) -> list[Validation]:
        """Check the front's unchecked configurations nearest the boundary; the checks this round ran."""
        summary, checked = self.absorb(study)
        region, candidates = self._region.region, front(summary)
        unchecked = [c for c in candidates if c.trial not in checked and region.contains(c.errors)]
        chosen: list[Configuration] = []
        for searched in sorted(unchecked, key=lambda c: region.probability(c.errors)):
            if len(chosen) >= self._allowed(len(checked)):
                break
            config = self.ctx.rechecked(searched, "aware", region, self.events.note)  # NNs rebuilt since: re-placed
            if config is not None:
                chosen.append(config)
        if not chosen:
            return []
        runs = self.ctx.plan.closed_loop.runs
        self.events.note(f"closed-loop checks {when}: "
                         + "; ".join(f"trial {c.trial} (P(valid) {region.probability(c.errors):.2f} at "
                                     f"{format_errors(c.errors)})" for c in chosen)
                         + f", {runs} runs each: the front's unchecked configurations nearest the region's boundary")
        checks = self._run(chosen, runs)
        self._update(chosen, checks, candidates)
        for check in checks:  # after the evidence is saved: a check recorded here is never lost from the region
            record_check(study, check)
        return checks

    def absorb(self, study: optuna.Study) -> tuple[StudySummary, dict[int, Validation]]:
        """Fold every check recorded in the study (other workers', or before a kill) into the evidence and region.

        Returns the study's summary and its recorded checks by trial, as read for this.
        """
        summary = summarize(study, self.ctx.plan.objectives)
        configs = {t.number: t.configuration for t in summary.trials if t.configuration is not None}
        recorded = recorded_checks(study)
        known = [n for n in recorded if n in configs]
        self._update([configs[n] for n in known], [recorded[n] for n in known], front(summary))
        return summary, recorded

    def _allowed(self, checked: int) -> int:
        """Configurations this round may check: the spec's per round, within what the profile's cap leaves."""
        plan = self.ctx.plan.closed_loop
        return plan.per_round if plan.cap is None else max(0, min(plan.per_round, plan.cap - checked))

    def _run(self, configs: list[Configuration], runs: int) -> list[Validation]:
        """Each configuration's check, in order; at once on an executor (each check is one block of runs)."""
        check = partial(validate_configuration, self.ctx, runs=runs, executor=self.executor, events=self.events,
                        label="closed-loop check, ", show_runs=False)
        if self.executor is None or len(configs) < 2:
            return [check(c) for c in configs]
        with ThreadPoolExecutor(len(configs)) as threads:
            return list(threads.map(check, configs))

    def _update(self, configs: list[Configuration], checks: list[Validation], watched: list[Configuration]) -> None:
        """Add the failing checks to the evidence; when it grew, save it, make the region's next version, and say
        which of the ``watched`` configurations (the front) it no longer contains."""
        evidence = self.evidence
        for config, check in zip(configs, checks, strict=True):
            evidence = with_validation(evidence, self.calibrated.application, config, check)
        if evidence is self.evidence:
            return
        self.evidence = evidence
        evidence.save(self.ctx.plan.run_dir)
        start = time.perf_counter()
        region = self.calibrated.searched(evidence)
        outside = [f"trial {c.trial}" for c in watched if not region.contains(c.errors)]  # fits the region, once
        self._region = VersionedRegion(self._region.version + 1, region)
        self.events.note("closed-loop evidence: " + ", ".join(f"{c.name}: {c.failures} of {c.runs} runs failed"
                                                              for c in checks if c.failures)
                         + f"; region refitted with it in {time.perf_counter() - start:.1f} s (version "
                         + f"{self._region.version}), the front's "
                         + (f"{', '.join(outside)} now outside it" if outside else "configurations all still inside it")
                         + "; later trials are judged by it")
