"""The Optuna search over per-NN knobs, constrained to the calibrated error region.

Each trial samples every NN's knobs (pruning ratio, dtype, fine-tuning budget) and
the pipeline schedule, builds the candidates (cached by :mod:`qaopt.approx`),
places their measured errors in the error space, and reports feasibility through
``trial.set_constraint``. Only feasible trials are compiled and tuned on the target
(:mod:`qaopt.kernels`); infeasible ones get a quick untuned measurement so the
sampler still learns the cost side of the space. A candidate whose outputs on its
validation data hold NaN or inf has no point in the error space: its trial is
infeasible, with the reason, and the study goes on.

Two studies run over the same space and share every cached candidate:

- ``aware``: feasible when the error vector is inside the region (application-aware);
- ``agnostic``: feasible when each NN's error stays within its reference error
  (accuracy-preserving compression, today's practice), the baseline of the report,
  by the rule of :mod:`qaopt.tolerance` (the upper confidence bound of the excess error).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from math import inf
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from qaopt import kernels
from qaopt.app_spec import QaoptError
from qaopt.approx import Candidate, Knobs, TargetNN, build
from qaopt.approx.merge import MergeGroup, build_merged
from qaopt.calibrate import ErrorRegion
from qaopt.events import Measured, StageEvents, TrialPhase
from qaopt.events import Trial as TrialEvent
from qaopt.kernels import schedules_for, threads_of
from qaopt.measuring import MeasuredConfiguration, measure_configuration, quick_latency
from qaopt.plan import MergePlan, RunPlan
from qaopt.second_look import SecondLook
from qaopt.seeding import Unit, configuration_params, informed_trials, precision_trials
from qaopt.stress import StressSet, cached_errors, stressed_coordinate
from qaopt.study_lock import DIALECTS, study_lock
from qaopt.tolerance import CONFIDENCE, RULE, Judgement, judge
from qaopt.result import (
    AgnosticRule,
    Configuration,
    InformedStart,
    NNTolerance,
    Rebuilt,
    SecondLookTrial,
    StudySummary,
    TrialRecord,
    UnresolvedTrial,
    Validation,
)

Mode = Literal["aware", "agnostic"]
MODES: tuple[Mode, ...] = ("aware", "agnostic")

# The trial attributes a trial writes and :func:`summarize` alone reads.
ATTR_ERRORS = "errors"
ATTR_FEASIBLE = "feasible"
ATTR_CONFIGURATION = "configuration"
ATTR_FAILURE = "error"
ATTR_INFEASIBLE = "infeasible"
"""Why a trial is infeasible whatever its errors (an NN that outputs NaN)."""
ATTR_REGION_VERSION = "region_version"
"""The version of the region that judged the trial (:class:`VersionedRegion`)."""
ATTR_SKIPPED = "skipped"
"""A study attribute: why the study ran no trial (an agnostic merged unit that cannot be within tolerance)."""
ATTR_HELD = "held"
"""An agnostic unit study's attribute: knob -> why it holds that knob at the reference's setting."""
ATTR_INFORMED = "informed"
"""A study attribute: how the aware study chose its informed first trials (:class:`~qaopt.result.InformedStart`)."""
ATTR_REFERENCES = "references"
"""A study attribute: the fingerprint (weights, architecture, data, metric) of each reference NN its trials were
built from and measured against, set when the study begins (:func:`open_study`)."""
CHECK_ATTR_PREFIX = "closed_loop_check:"
"""A study attribute per in-search closed-loop check (``closed_loop_check:<trial>``): one key per trial, so
workers sharing the study never overwrite each other's, and a resumed run sees what was checked."""
OUTSIDE = 1.0
"""The constraint value of a trial with no point in the error space: as far outside as the region's scale goes."""
HEARTBEAT_S = 30
GRACE_S = 120
"""A trial whose process sent no heartbeat for GRACE_S seconds is failed and retried by the next worker."""


class OptimizeError(QaoptError):
    """A run that cannot go on (an unreachable study storage, an empty region, ...)."""


def open_storage(url: str) -> RDBStorage:
    """An Optuna RDB storage on SQLite or PostgreSQL (:mod:`qaopt.study_lock` has a lock for both); fails fast with
    the reason when the database cannot be reached.

    Heartbeats let a re-run (or another worker) recognise trials of a killed process as
    failed, and the retry callback re-enqueues them so no trial is lost.
    """
    try:
        dialect = sqlalchemy.engine.make_url(url).get_backend_name()
    except sqlalchemy.exc.ArgumentError:
        raise OptimizeError(f"search.storage: {_redact(url)!r} is not a database URL; give sqlite:///path/study.db "
                            "or postgresql://user@host/database") from None
    if dialect not in DIALECTS:
        raise OptimizeError(f"search.storage: {_redact(url)} is a {dialect} database; qaopt shares studies through "
                            "SQLite (sqlite:///path/study.db, one machine) or PostgreSQL (postgresql://user@host/"
                            "database, several)")
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("postgresql"):
        engine_kwargs["connect_args"] = {"connect_timeout": 5}
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs["connect_args"] = {"timeout": 60}
    for attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=GRACE_S,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=2),
                )
        except Exception as exc:  # sqlalchemy raises many kinds; all but a lost race mean "cannot use this storage"
            if lost_table_race(exc):
                time.sleep(1.0 + attempt)  # the tables exist now: the retry reads them
                continue
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OptimizeError(f"search.storage: cannot open {_redact(url)}: {reason}") from None
    raise OptimizeError(f"search.storage: cannot create the tables of {_redact(url)}: other workers keep conflicting")


TABLE_RACE_STATES = frozenset({"42P07", "42710"})
"""PostgreSQL's SQLSTATEs for a table or a type that another session created first (duplicate_table,
duplicate_object)."""


def lost_table_race(exc: BaseException) -> bool:
    """Whether opening a storage failed because another worker created the same tables at that moment.

    Optuna creates its tables on first use; two workers starting on a new database both try, and the loser's
    ``CREATE TABLE`` fails with a unique violation on the catalog (an IntegrityError) or, on PostgreSQL, with
    duplicate_table when the winner committed first (a ProgrammingError). Either way the tables are there.
    """
    if isinstance(exc, sqlalchemy.exc.IntegrityError):
        return True
    return (isinstance(exc, sqlalchemy.exc.DBAPIError)
            and getattr(exc.orig, "sqlstate", None) in TABLE_RACE_STATES)


def _redact(url: str) -> str:
    """Hide a password in a database URL before printing it."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return url


@dataclass(frozen=True)
class VersionedRegion:
    """The region trials are judged by, and its version: 0 as the run began, +1 each time closed-loop evidence
    corrected it. Each trial records the version that judged it (``ATTR_REGION_VERSION``)."""

    version: int
    region: ErrorRegion


class RegionSource(Protocol):
    """Whoever owns the region a study searches in (the closed-loop checks): the version to judge the next trial by."""

    def current(self) -> VersionedRegion: ...


@dataclass(frozen=True)
class FixedRegion:
    """A region nobody corrects during the study (the agnostic study; a run without closed-loop checks)."""

    region: ErrorRegion

    def current(self) -> VersionedRegion:
        return VersionedRegion(0, self.region)


@dataclass(frozen=True)
class SearchContext:
    """What every trial, validation and export of a run builds and measures with: the one place ``optimize``
    builds candidates. Immutable; its dictionaries are memos of this process's measurements and judgements, so one
    configuration never carries two different figures in a run.

    ``space`` maps NN errors to the region's axes (:meth:`ErrorRegion.errors_of`); which region
    judges a point is the caller's (:class:`RegionSource`). ``stress``, the spec's stress strata, moves an NN
    that errs worse than the reference where the application fails outward (:mod:`qaopt.stress`).
    """

    plan: RunPlan
    nns: Mapping[str, TargetNN]
    space: ErrorRegion
    stress: StressSet | None = None
    say: Callable[[str], None] = field(default=lambda message: None, repr=False, compare=False)
    """Where a long build reports how far it is (a search stage's notes: a merged NN's distillation takes minutes)."""
    _measured: dict[tuple, MeasuredConfiguration] = field(default_factory=dict, repr=False, compare=False)
    _quick: dict[tuple, tuple[float, int | None]] = field(default_factory=dict, repr=False, compare=False)
    _strata: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict, repr=False, compare=False)
    _shared_outputs: dict[str, dict] = field(default_factory=dict, repr=False, compare=False)
    _judged: dict[tuple[str, str], Judgement] = field(default_factory=dict, repr=False, compare=False)
    _rebuilt: dict[tuple, Rebuilt] = field(default_factory=dict, repr=False, compare=False)

    @property
    def target(self) -> kernels.Target:
        """Where trials are timed (:attr:`qaopt.plan.RunPlan.search_target`)."""
        return self.plan.search_target

    @property
    def cache_dir(self) -> Path:
        return self.plan.cache_dir

    @property
    def reference_knobs(self) -> dict[str, Knobs]:
        """Each NN with nothing approximated, under the run's seed."""
        return {name: Knobs(seed=self.plan.seed) for name in self.nns}

    def build(self, name: str, knobs: Knobs | Mapping[str, Any], serves: Sequence[str] = ()) -> Candidate:
        """NN ``name``'s candidate for ``knobs`` (a :class:`Knobs` or the dict a result stores), built or loaded;
        with ``serves`` (two or more NNs, ``name`` among them), its view of the merged candidate of those NNs."""
        knobs = knobs if isinstance(knobs, Knobs) else Knobs.model_validate(knobs)
        if len(serves) > 1:
            return self.build_merged(self._merge_plan(serves), knobs)[name]
        return build(self.nns[name], knobs, cache_dir=self.cache_dir, recipe=self.plan.finetune,
                     backend=self.plan.backend_name, onnx=kernels.onnx, device=self.plan.train_device)

    def build_merged(self, group: MergePlan, knobs: Knobs) -> dict[str, Candidate]:
        """The merged candidate of ``group`` for ``knobs``, one view per member NN (:func:`qaopt.approx.build_merged`)."""
        return build_merged(self.merge_group(group), knobs, cache_dir=self.cache_dir, recipe=self.plan.finetune,
                            backend=self.plan.backend_name, onnx=kernels.onnx, device=self.plan.train_device,
                            progress=self.say)

    def merge_group(self, group: MergePlan) -> MergeGroup:
        return MergeGroup.from_section(group, self.nns)

    @cached_property
    def merge_leads(self) -> dict[MergePlan, str]:
        """Each merge group's lead: the NN whose backbone and knob space the merged NN takes."""
        return {g: self.merge_group(g).lead().name for g in self.plan.merge_groups}

    def _merge_plan(self, serves: Sequence[str]) -> MergePlan:
        for group in self.plan.merge_groups:
            if set(group.nns) == set(serves):
                return group
        raise QaoptError(f"a merged candidate serves {', '.join(serves)}, but search.merge has no such group; "
                         "restore the group in the spec, or run optimize again")

    def build_unit(self, unit: Unit, knobs: Knobs) -> dict[str, Candidate]:
        """The candidates of one part of a configuration: an NN alone, or a merge group's views."""
        return self.build_merged(unit.group, knobs) if unit.group is not None else {unit.nn: self.build(unit.nn, knobs)}

    def candidates(self, config: Configuration) -> dict[str, Candidate]:
        """The candidates of a configuration as a result stores it (merged NNs rebuilt as merged).

        They must be the bytes the configuration records: one whose NNs may have been rebuilt since the
        search measured them goes through :meth:`rechecked` first, and a mismatch here is an error, never
        a silent substitution of NNs whose errors nobody checked.
        """
        candidates = self._built(config)
        changed = _rebuilt_nns(config, candidates)
        if changed:
            raise OptimizeError("; ".join(
                f"nns.{n}: candidate {candidates[n].key} now has the bytes {candidates[n].bytes_hash}, not the "
                f"{config.nns[n].bytes_hash} its configuration (trial {config.trial}) was checked with: it was rebuilt "
                "during this run (its cache entry removed or damaged?); run `qaopt optimize` again, which re-checks "
                "the rebuilt NN against the region" for n in changed))
        return candidates

    def _built(self, config: Configuration) -> dict[str, Candidate]:
        return {n: self.build(n, c.knobs, c.serves) for n, c in config.nns.items()}

    def rechecked(self, config: Configuration, mode: Mode, region: ErrorRegion,
                  note: Callable[[str], None] = lambda line: None) -> Configuration | None:
        """``config`` as its NNs are now: itself when every NN has the bytes the search measured (or recorded none),
        else with the rebuilt NNs' errors, re-placed in ``region``; ``None`` when that leaves it infeasible in
        its ``mode``'s study (aware: outside the region), so it is neither validated nor chosen.

        The approximation cache is not part of a run's state and GPU fine-tuning is not bitwise reproducible:
        a run resumed on another machine, or with a fresh cache, rebuilds other bytes under the same knobs. A
        rebuilt NN was measured on its validation data by its build; :meth:`errors_of` places it again, and
        :meth:`violation` judges it as its study judged the trial. ``note`` gets the one line that says so (once
        per configuration and verdict); :attr:`rebuilds` keeps each for the result.
        """
        candidates = self._built(config)
        changed = _rebuilt_nns(config, candidates)
        if not changed:
            return config
        errors = self.errors_of(candidates)
        feasible = self.violation(mode, errors, candidates, region) <= 0
        rebuilt = Rebuilt(
            study=mode, trial=config.trial,
            hashes={n: (config.nns[n].bytes_hash, candidates[n].bytes_hash) for n in changed},
            nn_errors={n: (config.nns[n].error, candidates[n].error) for n in changed},
            searched_errors=config.errors, errors=errors, probability=region.probability(errors), feasible=feasible)
        key = (mode, config.trial, _nns_key(candidates))
        known = self._rebuilt.get(key)
        if known is None or known.feasible != feasible:
            note(rebuilt.line)
        self._rebuilt[key] = rebuilt
        if not feasible:
            return None
        nns = {n: c.model_copy(update={"bytes_hash": candidates[n].bytes_hash, "error": candidates[n].error})
               for n, c in config.nns.items()}
        return config.model_copy(update={"nns": nns, "errors": errors, "in_region": region.contains(errors)})

    @property
    def rebuilds(self) -> list[Rebuilt]:
        """Every configuration :meth:`rechecked` found rebuilt in this run, as last judged."""
        return list(self._rebuilt.values())

    @cached_property
    def reference(self) -> dict[str, Candidate]:
        """The reference NNs (nothing approximated), as candidates."""
        return {name: self.build(name, knobs) for name, knobs in self.reference_knobs.items()}

    def measure(self, candidates: Mapping[str, Candidate], schedule: str, incumbent_ms: float | None = None
                ) -> MeasuredConfiguration:
        """Compile and measure a configuration once per run: both studies and the reference share it,
        so their latencies compare without measurement noise between them, and a configuration Optuna
        samples again costs nothing and gets the same figure (the measurement memo). ``incumbent_ms``
        (the study's fastest so far) lets kernel tuning stop where it cannot win."""
        key = (_nns_key(candidates), schedule)
        if key not in self._measured:
            self._measured[key] = measure_configuration(candidates, schedule, self.target, self.cache_dir,
                                                        incumbent_ms)
        return self._measured[key]

    def quick(self, candidates: Mapping[str, Candidate]) -> tuple[float, int | None]:
        """The untuned figure (latency ms, memory bytes) of an infeasible configuration, once per run.

        A configuration already measured in full answers with that figure, so one configuration
        never carries two different latencies in a run.
        """
        nns = _nns_key(candidates)
        full = self._measured.get((nns, "sequential"))
        if full is not None:
            return full.latency_ms, full.memory_bytes
        if nns not in self._quick:
            self._quick[nns] = quick_latency(candidates, self.target, self.cache_dir)
        return self._quick[nns]

    def errors_of(self, candidates: Mapping[str, Candidate]) -> dict[str, float]:
        """The configuration's point in the region's axes (NNs not calibrated are left out), stress strata included."""
        point = self._measured_point(candidates)
        if self.stress is None:
            return point
        reference = self._measured_point(self.reference)
        for axis in self.space.space.axes:
            if axis.component == "metric" and axis.nn in candidates:
                point[axis.name] = stressed_coordinate(
                    self.space.metrics.get(axis.nn, "l1"), point[axis.name], reference[axis.name],
                    self.stratum_errors(candidates[axis.nn]), self.stratum_errors(self.reference[axis.nn]))
        return point

    def _measured_point(self, candidates: Mapping[str, Candidate]) -> dict[str, float]:
        """The point of the candidates' errors on their error data alone."""
        calibrated = {a.nn for a in self.space.space.axes}
        return self.space.errors_of(
            {n: np.concatenate([np.ravel(r) for r in c.residuals]) for n, c in candidates.items() if n in calibrated}
        )

    def stratum_errors(self, candidate: Candidate) -> dict[str, float]:
        """The candidate's error metric on each stress stratum (measured once per run, and kept in the cache)."""
        key = (candidate.nn, candidate.key)
        if key not in self._strata:
            metric = self.nns[candidate.nn].metric
            # a merged NN's views share its outputs: one run of it per stratum's frames serves every view
            shared = None if candidate.columns is None else self._shared_outputs.setdefault(candidate.key, {})
            self._strata[key] = cached_errors(self.stress, self.cache_dir, candidate.nn, candidate.key, lambda: (
                self.stress.errors(candidate.nn, candidate.outputs, metric, candidate.columns, shared)))
        return self._strata[key]

    def judgement(self, name: str, candidate: Candidate) -> Judgement:
        """NN ``name``'s candidate against its reference by the agnostic rule (:func:`qaopt.tolerance.judge`), once per
        candidate in a run."""
        key = (name, candidate.key)
        if key not in self._judged:
            self._judged[key] = judge(self.plan.tolerances[name], candidate.residuals, self.reference[name].residuals)
        return self._judged[key]

    @cached_property
    def second_look(self) -> SecondLook:
        """Each NN's second validation split (``nns.<name>.data.more_validation``), for the agnostic test's second
        look at the trials the first split cannot decide (:mod:`qaopt.second_look`)."""
        return SecondLook(self.nns, self.plan.application.more_validation, self.cache_dir)

    def judgement_on_both(self, name: str, candidate: Candidate) -> Judgement | None:
        """NN ``name``'s candidate by the agnostic rule on both validation splits together (``None``: it has no
        second split)."""
        return self.second_look.judge(self.plan.tolerances[name], name, candidate, self.reference[name])

    def over_tolerance(self, candidates: Mapping[str, Candidate]) -> float:
        """How far the worst of ``candidates`` is outside its NN's agnostic tolerance (<= 0: every one within)."""
        return max((self.judgement(n, c).violation(self.plan.tolerances[n]) for n, c in candidates.items()),
                   default=0.0)

    def agnostic_rule(self, chosen: Configuration | None, unresolved: Mapping[str, UnresolvedTrial] | None = None,
                      second_looks: Sequence[SecondLookTrial] = ()) -> AgnosticRule:
        """The agnostic rule, each NN's bound, the NNs of ``chosen`` (the agnostic configuration) judged by it (on
        both validation splits where the first could not decide), each unit's trial that only the test's resolution
        rejected (:func:`qaopt.agnostic.unresolved_trial`) and the trials judged again on both splits."""
        candidates = self.candidates(chosen) if chosen is not None else {}
        nns = {}
        for name, reference in self.reference.items():
            tolerance = self.plan.tolerances[name]
            judged = self.judgement(name, candidates[name]) if name in candidates else None
            if judged is not None and not judged.within:
                judged = self.judgement_on_both(name, candidates[name]) or judged
            nns[name] = NNTolerance(
                metric=tolerance.metric, bound=tolerance.bound, absolute=tolerance.absolute,
                reference_error=judged.reference if judged else reference.error,
                allowed_excess=judged.allowed if judged else tolerance.allowed(reference.error),
                chosen_error=judged.candidate if judged else None, chosen_excess_ucb=judged.ucb if judged else None,
                chosen_frames=judged.frames if judged else None)
        return AgnosticRule(rule=RULE, confidence=CONFIDENCE, nns=nns, unresolved=dict(unresolved or {}),
                            second_looks=list(second_looks))

    def violation(self, mode: Mode, errors: Mapping[str, float], candidates: Mapping[str, Candidate],
                  region: ErrorRegion) -> float:
        """Optuna constraint value: <= 0 when feasible, else how far outside (relative); ``region`` judges aware trials."""
        if mode == "agnostic":
            return self.over_tolerance(candidates)
        calibrated = {a.nn for a in region.space.axes}
        # An NN outside the error space has no proven headroom: it keeps its reference error, by the agnostic rule.
        if self.over_tolerance({n: c for n, c in candidates.items() if n not in calibrated}) > 0:
            return 1.0
        if region.contains(errors):
            return 0.0
        return max(1e-3, 1.0 - region.probability(errors))


@contextmanager
def failures_recorded(trial: optuna.Trial) -> Iterator[None]:
    """Whatever ends a trial early is recorded as its failure reason before Optuna fails the trial; an interruption
    (Ctrl-C) too, whose retry :func:`optimize_until` enqueues."""
    try:
        yield
    except Exception as exc:
        trial.set_user_attr(ATTR_FAILURE, f"{type(exc).__name__}: {exc}")
        raise
    except BaseException as exc:
        trial.set_user_attr(ATTR_FAILURE, interruption(exc))
        raise


class Objective:
    """One Optuna trial: sample knobs, build, check the region, then compile, tune and measure.

    The study's incumbent (its fastest feasible frame so far) is the objective's own state:
    kernel tuning of a later candidate stops where it cannot beat it.
    """

    mode: Mode = "aware"

    def __init__(self, ctx: SearchContext, region: RegionSource, events: StageEvents):
        self.ctx = ctx
        self.region = region
        self.events = events
        self.incumbent_ms: float | None = None
        self.trial: optuna.Trial | None = None
        """The trial this process runs now (the one an interruption leaves unfinished)."""

    def __call__(self, trial: optuna.Trial) -> list[float]:
        ctx = self.ctx
        self.trial = trial
        with failures_recorded(trial):
            schedule = trial.suggest_categorical("schedule", list(schedules_for(len(ctx.nns), threads_of(ctx.target))))
            candidates = self._candidates(trial)
            unusable = nonfinite(candidates)
            if unusable:
                return self._unusable(trial, candidates, unusable)
            judged_by = self.region.current()
            errors = ctx.errors_of(candidates)
            violation = ctx.violation(self.mode, errors, candidates, judged_by.region)
            trial.set_constraint("region", violation)
            trial.set_user_attr(ATTR_ERRORS, errors)
            trial.set_user_attr(ATTR_FEASIBLE, violation <= 0)
            trial.set_user_attr(ATTR_REGION_VERSION, judged_by.version)
            if violation > 0:
                # Infeasible: never tuned; a quick untuned figure keeps the sampler informed.
                latency, memory = ctx.quick(candidates)
                self._say(trial, "finished")
                return self._values(latency, memory)
            self._say(trial, "measuring")
            frame = ctx.measure(candidates, schedule, self.incumbent_ms)
            self.incumbent_ms = min(frame.latency_ms, self.incumbent_ms if self.incumbent_ms is not None else inf)
            self.events.emit(Measured(self.events.stage, self.mode, trial.number, frame.latency_ms,
                                      frame.latency.trusted))
            config = Configuration(
                trial=trial.number,
                nns={n: m.choice for n, m in frame.nns.items()},
                schedule=schedule,
                latency_ms=frame.latency_ms,
                memory_bytes=frame.memory_bytes,
                errors=errors,
                in_region=True,
                latency=frame.latency,
            )
            trial.set_user_attr(ATTR_CONFIGURATION, config.model_dump(mode="json"))
            self._say(trial, "finished")
            return self._values(frame.latency_ms, frame.memory_bytes)

    def _say(self, trial: optuna.Trial, phase: TrialPhase, detail: str = "") -> None:
        self.events.emit(TrialEvent(self.events.stage, self.mode, trial.number, phase, detail))

    def _unusable(self, trial: optuna.Trial, candidates: Mapping[str, Candidate], reason: str) -> list[float]:
        """An infeasible trial that names why: an NN with NaN or inf outputs has no errors to place in the region."""
        self._say(trial, "infeasible", reason)
        trial.set_constraint("region", OUTSIDE)
        trial.set_user_attr(ATTR_ERRORS, {})
        trial.set_user_attr(ATTR_FEASIBLE, False)
        trial.set_user_attr(ATTR_INFEASIBLE, reason)
        values = self._values(*self.ctx.quick(candidates))
        self._say(trial, "finished")
        return values

    def _candidates(self, trial: optuna.Trial) -> dict[str, Candidate]:
        """Sample the trial's knobs and build its candidates (:func:`trial_units`)."""
        ctx = self.ctx
        units = trial_units(ctx, trial)
        self._say(trial, "building")
        candidates: dict[str, Candidate] = {}
        for unit, knobs in units.items():
            candidates.update(ctx.build_unit(unit, knobs))
        return {name: candidates[name] for name in ctx.nns}

    def _values(self, latency: float, memory: int | None) -> list[float]:
        figures = {"latency": latency, "memory": (memory or 0) / 2**20}
        return [figures[o] for o in self.ctx.plan.objectives]


def trial_units(ctx: SearchContext, trial: optuna.Trial | optuna.trial.FixedTrial) -> dict[Unit, Knobs]:
    """What a trial builds: each merge group merged or apart, then every NN not merged on its own knobs. A merged
    group's knobs are its lead's (sampled under the lead's name)."""
    plan = ctx.plan
    merged = [g for g in plan.merge_groups if trial.suggest_categorical(g.param, [False, True])]
    leads = {g: ctx.merge_leads[g] for g in merged}
    units = {Unit(lead, g): plan.knob_spaces[lead].sample(trial, lead, seed=plan.seed) for g, lead in leads.items()}
    units.update({Unit(name): plan.knob_spaces[name].sample(trial, name, seed=plan.seed) for name in ctx.nns
                  if not any(name in g.nns for g in merged)})
    return units


def built_by(ctx: SearchContext, params: Mapping[str, Any]) -> tuple | None:
    """What a trial of ``params`` builds and how it runs it (its schedule, each unit and its knobs), or ``None`` when
    the parameters leave part of it to the sampler. Two sets of parameters may build the same configuration (a
    merged trial does not read its other members' parameters): the study's seeds are told apart by this."""
    fixed = optuna.trial.FixedTrial(dict(params))
    try:
        schedule = fixed.suggest_categorical("schedule", list(schedules_for(len(ctx.nns), threads_of(ctx.target))))
        units = trial_units(ctx, fixed)
    except ValueError:  # a parameter the trial would suggest is not given
        return None
    return schedule, tuple(sorted((u.label, k.model_dump_json()) for u, k in units.items()))


def _nns_key(candidates: Mapping[str, Candidate]) -> tuple[tuple[str, str], ...]:
    """What identifies a configuration's NNs in the measurement cache: each NN's candidate key."""
    return tuple(sorted((n, c.key) for n, c in candidates.items()))


def _rebuilt_nns(config: Configuration, candidates: Mapping[str, Candidate]) -> list[str]:
    """The NNs of ``config`` whose candidates now have other bytes than it records (none recorded: taken as they are)."""
    recorded = {n: config.nns[n].bytes_hash for n in candidates}
    return [n for n, c in candidates.items() if recorded[n] is not None and recorded[n] != c.bytes_hash]


def nonfinite(candidates: Mapping[str, Candidate]) -> str:
    """Why these candidates cannot be placed in the error space (empty when they can): each NN with NaN or inf outputs."""
    return "; ".join(f"nns.{name}: candidate {c.key} outputs {c.nonfinite_outputs} on its validation data"
                     for name, c in candidates.items() if c.nonfinite_outputs)


def run_study(
    ctx: SearchContext,
    storage: BaseStorage,
    region: RegionSource,
    events: StageEvents,
    on_done: Callable[[optuna.Study, FrozenTrial], None] = lambda study, trial: None,
    known: Sequence[Configuration] = (),
) -> optuna.Study:
    """Create or resume the application-aware study and run it until it holds the plan's number of finished trials
    (the agnostic baseline is a study per NN or merge group: :mod:`qaopt.agnostic`).

    ``known`` are configurations found before the study (the agnostic choice), each enqueued as a trial after the
    informed ones (:mod:`qaopt.seeding`), so the study measures and judges them as its own.

    Several workers (processes, machines) may run this on one storage at once: the
    trial count is shared, so together they run ``plan.trials``. Each trial is judged by
    ``region.current()``; ``on_done`` sees the study after each trial this process finishes,
    before the next one starts (the in-search closed-loop checks, :mod:`qaopt.stages.checks`,
    correct the region there). ``events`` gets each trial's phases.
    """
    plan = ctx.plan
    study = open_study(plan.study_name("aware"), storage, plan.seed, len(plan.objectives),
                       {n: t.fingerprint for n, t in ctx.nns.items()}, events.warn)
    with study_lock(storage, study.study_name):  # workers starting this study together seed it once
        _seed(ctx, study, region, events, known)
    optimize_until(study, lambda: Objective(ctx, region, events), plan.trials, on_done)
    return study


def _seed(ctx: SearchContext, study: optuna.Study, region: RegionSource, events: StageEvents,
          known: Sequence[Configuration]) -> None:
    """Enqueue the aware study's seeds that it does not hold yet (all of them in a new study), each configuration
    once: the agnostic choice is often a precision trial too, and the informed cheapest a merged NN's precision trial
    (a quick profile's six trials once ran two of them twice, and never the merged int8 NN)."""
    plan = ctx.plan
    seeded = {built_by(ctx, t.params or t.system_attrs.get("fixed_params", {}))
              for t in study.get_trials(deepcopy=False)} - {None}

    def enqueue(params: dict[str, Any]) -> None:
        built = built_by(ctx, params)
        if built is None or built not in seeded:
            study.enqueue_trial(params, skip_if_exists=True)
            seeded.add(built)

    # The reference configuration (nothing approximated) is always the first trial.
    reference_knobs = ctx.reference_knobs
    spaces = {nn: plan.knob_spaces[nn] for nn in reference_knobs}
    params: dict[str, Any] = {}
    for nn, k in reference_knobs.items():
        params.update(spaces[nn].params_of(k, nn))
    params["schedule"] = "sequential"
    params.update({group.param: False for group in plan.merge_groups})
    enqueue(params)
    # Then the cheapest combination of probes found inside the study's bounds and a milder fallback
    # (qaopt.seeding), so that a short study does not have to come upon them by sampling.
    if len(study.get_trials(deepcopy=False)) <= 1:  # a new study (a resumed one has its informed trials)
        informed, start = informed_trials(ctx, region.current().region, events.note)
        if start is not None:
            study.set_user_attr(ATTR_INFORMED, start.model_dump(mode="json"))
        for trial in informed:
            enqueue(trial)
    for config in known:
        enqueue(configuration_params(ctx, config))
    # Then each precision alone, apart and then on each merged NN (precision_trials).
    probes = {nn: spaces[nn].probes(alone=True) for nn in reference_knobs}
    leads = {g: ctx.merge_leads[g] for g in plan.merge_groups}
    for trial in precision_trials(params, reference_knobs, probes, leads):
        enqueue(trial)


def open_study(name: str, storage: BaseStorage, seed: int, objectives: int, references: Mapping[str, str],
               warn: Callable[[str], None]) -> optuna.Study:
    """Create or load (resume) the study ``name`` of ``objectives`` minimised values, with the run's seeded sampler.

    ``references`` are the fingerprints of the reference NNs its trials build from, recorded when the study begins.
    The study's name holds the spec's hash, not the NNs' weights: a model factory that trains when called can
    return other weights in another process (torch's CPU kernels sum in another order at another thread count; a
    GPU's training is not bitwise reproducible), and a resumed run or a second worker then adds to a study whose
    earlier trials were measured against other NNs. That is what a resume on another machine already meets for
    every candidate (docs/faults.md): each configuration is re-checked with the NNs rebuilt here before it is
    validated or chosen, so the run goes on, and ``warn`` says why its earlier trials may not hold.
    """
    optuna.logging.set_verbosity(logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    try:
        study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                    directions=["minimize"] * objectives, load_if_exists=True)
    except optuna.exceptions.DuplicatedStudyError:  # another worker created it between our check and insert
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    if (changed := _changed_references(study, references)) is not None:
        warn(changed)
    return study


def _changed_references(study: optuna.Study, references: Mapping[str, str]) -> str | None:
    """Record the study's reference fingerprints when it has none yet; else say how this run's NNs differ, if they do."""
    current = dict(sorted(references.items()))
    recorded = study.user_attrs.get(ATTR_REFERENCES)
    if recorded is None:  # a new study (or one from before fingerprints were recorded): these NNs are its references
        study.set_user_attr(ATTR_REFERENCES, current)
        return None
    changed = [n for n in sorted(set(recorded) | set(current)) if recorded.get(n) != current.get(n)]
    if not changed:
        return None
    return (f"study {study.study_name!r} began with other reference NNs than this run loaded: "
            + "; ".join(f"NN {n!r} is {current.get(n, 'absent')} now, was {recorded.get(n, 'absent')}" for n in changed)
            + " (fingerprints of each NN's weights, architecture, data and metric). Its earlier trials were measured "
            "against those; every configuration is re-checked with NNs built from these before it is validated or "
            "chosen (docs/faults.md, \"A run resumed on another machine\"). A model factory that trains when it is "
            "called should return the same weights in every process: fix its seeds and torch's thread count "
            "(torch.set_num_threads) while it trains, or load weights saved once. To search these NNs from the "
            "start, give the run another --out or --storage.")


class TrialObjective(Protocol):
    """An objective that knows the trial it runs now (the one an interruption leaves unfinished)."""

    trial: optuna.Trial | None

    def __call__(self, trial: optuna.Trial) -> float | list[float]: ...


def optimize_until(study: optuna.Study, objective: Callable[[], TrialObjective], trials: int,
                   on_done: Callable[[optuna.Study, FrozenTrial], None] = lambda study, trial: None) -> None:
    """Run ``study`` until it holds ``trials`` finished trials (:func:`finished_trials`); ``objective`` makes the
    objective when any trial is left. An interruption fails the running trial and enqueues its retry."""

    def stop_when_done(study: optuna.Study, trial: FrozenTrial) -> None:
        on_done(study, trial)
        if finished_trials(study) >= trials:
            study.stop()

    if finished_trials(study) >= trials:
        return
    running = objective()
    try:
        study.optimize(running, catch=(Exception,), callbacks=[stop_when_done], gc_after_trial=True)
    except BaseException as exc:  # Ctrl-C (KeyboardInterrupt, or the CLI's own), SystemExit: not a trial's fault
        if not isinstance(exc, Exception) and running.trial is not None:
            record_interruption(study, running.trial, exc)
        raise


INTERRUPTED = "interrupted"
"""How an interrupted trial's failure reason begins."""


def interruption(exc: BaseException) -> str:
    """The failure reason an interrupted trial carries.

    Ctrl-C arrives as a ``KeyboardInterrupt``, or under the CLI as its own ``BaseException``
    (:class:`qaopt.commands.runner.Interrupted`); only ``SystemExit`` and ``GeneratorExit`` are something else.
    """
    cause = f"({type(exc).__name__})" if isinstance(exc, (SystemExit, GeneratorExit)) else "by Ctrl-C"
    return f"{INTERRUPTED} {cause}; re-run on resume"


def record_interruption(study: optuna.Study, trial: optuna.Trial, exc: BaseException) -> None:
    """Fail an interrupted trial with its reason and enqueue its retry, so a resumed run runs it again first.

    Like a trial of a killed process (failed by heartbeat), it does not count against the
    budget (:func:`finished_trials`): a resumed run still ends with the budget's number of trials.
    """
    frozen = study._storage.get_trial(trial._trial_id)
    if frozen.state.is_finished() and not str(frozen.user_attrs.get(ATTR_FAILURE, "")).startswith(INTERRUPTED):
        return  # interrupted between trials: the last one finished (or failed on its own), nothing to redo
    if not frozen.state.is_finished():  # interrupted outside the objective, or Optuna let the CLI's interruption by
        if ATTR_FAILURE not in frozen.user_attrs:
            trial.set_user_attr(ATTR_FAILURE, interruption(exc))
        study.tell(trial, state=TrialState.FAIL)
    history = [*frozen.system_attrs.get("retry_history", []), frozen.number]
    study.add_trial(optuna.create_trial(
        state=TrialState.WAITING, params=frozen.params, distributions=frozen.distributions,
        system_attrs={**frozen.system_attrs, "failed_trial": frozen.system_attrs.get("failed_trial", frozen.number),
                      "retry_history": history},
    ))


def existing_study(storage: BaseStorage, name: str) -> optuna.Study | None:
    """The study ``name`` in ``storage``, or ``None`` when no run has begun it (nothing is created)."""
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def finished_trials(study: optuna.Study) -> int:
    """Trials that count against the budget: completed or failed, except failures that were retried.

    A trial of a killed process is failed by heartbeat and re-enqueued; only its retry counts,
    so a resumed run still ends with the budget's number of trials.
    """
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    return sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED) or (t.state == TrialState.FAIL and t.number not in retried)
        for t in trials
    )


def record_check(study: optuna.Study, validation: Validation) -> None:
    """Record an in-search closed-loop check of trial ``validation.trial`` in the study (see :data:`CHECK_ATTR_PREFIX`)."""
    study.set_user_attr(f"{CHECK_ATTR_PREFIX}{validation.trial}", validation.model_dump(mode="json"))


def recorded_checks(study: optuna.Study) -> dict[int, Validation]:
    """Every closed-loop check recorded in the study (by any worker, or before a kill), by trial number."""
    return {int(key.removeprefix(CHECK_ATTR_PREFIX)): Validation.model_validate(value)
            for key, value in study.user_attrs.items() if key.startswith(CHECK_ATTR_PREFIX)}


def summarize(study: optuna.Study, objectives: Sequence[str]) -> StudySummary:
    """The study as the result holds it: counts, every finished trial and the closed-loop checks, read once."""
    records = [_record(t, objectives) for t in study.get_trials(deepcopy=False)
               if t.state in (TrialState.COMPLETE, TrialState.FAIL)]
    return StudySummary(
        name=study.study_name,
        trials_complete=sum(r.state == "complete" for r in records),
        trials_failed=sum(r.state == "failed" for r in records),
        trials_feasible=sum(r.feasible for r in records if r.state == "complete"),
        failures=[f"trial {r.number}: {r.error or 'failed'}" for r in records if r.state == "failed"],
        trials=records,
        closed_loop_checks=[v for _, v in sorted(recorded_checks(study).items())],
        skipped=study.user_attrs.get(ATTR_SKIPPED),
        held=study.user_attrs.get(ATTR_HELD, {}),
        informed=InformedStart.model_validate(start) if (start := study.user_attrs.get(ATTR_INFORMED)) else None,
    )


def _record(trial: FrozenTrial, objectives: Sequence[str]) -> TrialRecord:
    attrs = trial.user_attrs
    configuration = attrs.get(ATTR_CONFIGURATION)
    return TrialRecord(
        number=trial.number,
        state="complete" if trial.state == TrialState.COMPLETE else "failed",
        params=dict(trial.params),
        feasible=bool(attrs.get(ATTR_FEASIBLE)),
        objectives=dict(zip(objectives, trial.values, strict=True)) if trial.values else {},
        errors=attrs.get(ATTR_ERRORS, {}),
        configuration=Configuration.model_validate(configuration) if configuration else None,
        error=attrs.get(ATTR_FAILURE),
        infeasible=attrs.get(ATTR_INFEASIBLE),
    )
