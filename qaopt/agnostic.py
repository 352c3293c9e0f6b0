"""The application-agnostic baseline, converged: each NN (or merge group) searched alone, then combined.

The agnostic constraint is per NN (each NN within its own tolerance, :mod:`qaopt.tolerance`),
so its optimum is separable: the fastest configuration is each unit's fastest candidate
within tolerance, put together. A joint study over every NN's knobs at once wastes its
trials on combinations where one NN is outside (the real result's agnostic study found 8
feasible trials in 40 and stopped at unpruned int8), so here each **unit** (an NN alone, or
a merge group's merged NN, whose every head must stay within its own NN's tolerance) gets
an Optuna study of its own:

- named ``<app>-<spec hash>-agnostic.<unit>`` in the run's storage, so a resumed run
  continues it and the result summarises it like the aware study;
- with the aware study's trial budget (``plan.trials``) per unit;
- objective: the unit's own latency, its candidate(s) compiled, tuned and measured alone on
  the target (:meth:`SearchContext.measure`; an infeasible one gets the quick untuned figure);
- holding at the reference's setting each knob whose least damaging setting, built as a trial
  builds it, is already outside tolerance by its point error (:func:`hopeless_knobs`: the
  smallest pruning ratio or the largest input scale below 1, with the most fine-tuning the
  space samples; what approximates more errs more, so no other setting of it could be within;
  one the data merely cannot show within stays searched). On CropFollow's
  quick run the sampler had spent three of each NN's six trials pruning and scaling NNs,
  each fine-tuned, far outside a 2 % tolerance;
- seeded with the reference, each precision probe alone (int8, fp16, bf16: unpruned), each
  knob's least damaging setting found within tolerance, and the deepest pruning ratio within
  tolerance (a ladder's rungs, else the ratio grid; bisection, at most
  :data:`~qaopt.seeding.WALK_BUILDS` builds).

A merge group's study is skipped, with its reason in the result (``StudySummary.skipped``), when
its merged NN with nothing else approximated (full precision and resolution, unpruned, so not fine-tuned
further: :func:`~qaopt.seeding.most_finetuned`) is already outside a member's tolerance: by the premise the
walks rest on (what approximates more errs more), no trial of it could be within, and on
CropFollow its six trials cost 40 s of a ten-minute quick run.

Then every layout (each merge group merged or apart) takes its units' winners, and each
layout's whole frame is measured once through :meth:`SearchContext.measure` on every
schedule the target allows, as the aware side's configurations are; the fastest frame is
the agnostic configuration.

A test at a 2 % bound is only as sharp as the validation data: where a trial faster than
its unit's winner erred inside every bound by its point excess but was rejected on the
upper bound (:attr:`~qaopt.tolerance.Judgement.unresolved`), the study's least-data such
trial is reported (``AgnosticRule.unresolved``) with how many times the validation data
would decide it. Each trial keeps its judgements (``ATTR_JUDGED``) so a resumed run reports
the same. On ResNet-18 CropFollow (640 validation frames) every candidate but the reference
was rejected so, and the baseline was the uncompressed NNs.

Such trials are also put together as a second baseline, **by point error**
(``AgnosticSearch.by_point``): each unit's fastest trial whose every NN errs inside its bound by
the point excess, measured whole as the baseline is. It is what accuracy-preserving compression
ships when it trusts its validation estimate, as common practice does, so aware over it says how
much of the ratio the test's resolution, not the application's headroom, made: a CropFollow
default run measured 4.88x over the tested baseline and 2.72x over the one by point error, whose
heading NN at input 0.5 in int8 1.24x the validation frames would decide
(docs/benchmarks/knobs_default/cropfollow-session45/result.json, ``speedups``; the by-point
ratio's timing marked untrusted). It is reported, not validated closed-loop.

Convergence (``Result.agnostic_converged``): ``best_ms_by_trial[t]`` is the fastest layout's
sum of its units' best latencies (each measured alone) after the first ``t + 1`` trials of
every unit, ``None`` while some unit has none within tolerance; ``trials`` is the trials
spent in all. A curve that is flat well before its end says more trials would not have found
a faster baseline. The final frame is measured as one, so it may differ from the curve's last
sum by what running the units together costs.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import inf

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from qaopt.approx import Candidate, Knobs, KnobSpace
from qaopt.approx.passes import get_pass, knob_owners
from qaopt.approx.passes.pruning import GRID, PruningConfig
from qaopt.events import StageEvents
from qaopt.kernels import schedules_for, threads_of
from qaopt.measuring import frame_models
from qaopt.plan import RunPlan
from qaopt.result import (
    Configuration,
    ConvergenceCurve,
    ExcessJudged,
    SecondLookTrial,
    StudySummary,
    UnresolvedTrial,
)
from qaopt.search import (
    ATTR_CONFIGURATION,
    ATTR_ERRORS,
    ATTR_FEASIBLE,
    ATTR_HELD,
    ATTR_INFEASIBLE,
    ATTR_SKIPPED,
    OUTSIDE,
    RegionSource,
    SearchContext,
    existing_study,
    failures_recorded,
    finished_trials,
    nonfinite,
    open_study,
    optimize_until,
    summarize,
)
from qaopt.seeding import Unit, merged_units, most_finetuned, walk
from qaopt.study_lock import study_lock
from qaopt.tolerance import Judgement

MODE = "agnostic"
AGNOSTIC_STUDY_PREFIX = f"{MODE}."
"""A unit study's key in ``Result.studies`` (``agnostic.heading``) and the tail of its Optuna study name."""
CONSTRAINT = "reference_error"
OBJECTIVES = ("latency",)
"""A unit study minimises the unit's own latency: memory is a frame's, judged once the units are combined."""
ATTR_JUDGED = "judged"
"""A unit trial's attribute: NN -> its :class:`~qaopt.tolerance.Judgement` fields."""
ATTR_SECOND_LOOK = "second_look"
"""A unit study's attribute: trial number (a string) -> its second look (:func:`second_looks`): ``judged`` (NN ->
its judgement on both validation splits) and, when every one is within, ``configuration`` (the unit measured)."""

def units_of(ctx: SearchContext) -> list[Unit]:
    """Every unit a layout may use: each NN alone, then each merge group merged."""
    nns, plan = list(ctx.nns), ctx.plan
    return list(dict.fromkeys(u for merged in (False, True)
                              for u in merged_units(nns, plan.merge_groups, ctx.merge_leads, merged)))


def layouts(ctx: SearchContext) -> list[list[Unit]]:
    """Each way of running the NNs: every merge group merged or apart, independently."""
    groups = ctx.plan.merge_groups
    out = []
    for merged in itertools.product((False, True), repeat=len(groups)):
        chosen = {g for g, m in zip(groups, merged, strict=True) if m}
        grouped = {n for g in chosen for n in g.nns}
        out.append([Unit(ctx.merge_leads[g], g) for g in chosen] + [Unit(n) for n in ctx.nns if n not in grouped])
    return out


@dataclass(frozen=True)
class AgnosticSearch:
    """The agnostic stage's artifact: each unit study's summary, the combined configuration and the convergence curve."""

    studies: dict[str, StudySummary]
    """``agnostic.<unit>`` -> its study's summary."""
    chosen: Configuration | None
    converged: ConvergenceCurve
    unresolved: dict[str, UnresolvedTrial] = dataclasses.field(default_factory=dict)
    """unit -> its trial that only the test's resolution rejected (:func:`unresolved_trial`)."""
    second_looks: list[SecondLookTrial] = dataclasses.field(default_factory=list)
    """The trials judged again on both validation splits (:func:`second_looks`)."""
    by_point: Configuration | None = None
    """The baseline by point error (the module docstring); ``None`` where it is ``chosen``'s NNs."""


class UnitObjective:
    """One trial of a unit's study: sample the unit's knobs, build, judge each served NN, then measure the unit alone."""

    def __init__(self, ctx: SearchContext, unit: Unit):
        self.ctx = ctx
        self.unit = unit
        self.incumbent_ms: float | None = None
        self.trial: optuna.Trial | None = None

    def __call__(self, trial: optuna.Trial) -> float:
        ctx, plan = self.ctx, self.ctx.plan
        self.trial = trial
        with failures_recorded(trial):
            space = plan.knob_spaces[self.unit.nn].holding(trial.study.user_attrs.get(ATTR_HELD, {}))
            candidates = ctx.build_unit(self.unit, space.sample(trial, self.unit.nn, seed=plan.seed))
            unusable = nonfinite(candidates)
            violation = OUTSIDE if unusable else ctx.over_tolerance(candidates)
            trial.set_constraint(CONSTRAINT, violation)
            if not unusable:
                trial.set_user_attr(ATTR_JUDGED, {n: dataclasses.asdict(ctx.judgement(n, c))
                                                  for n, c in candidates.items()})
            trial.set_user_attr(ATTR_ERRORS, {} if unusable else {n: c.error for n, c in candidates.items()})
            trial.set_user_attr(ATTR_FEASIBLE, violation <= 0)
            if unusable:
                trial.set_user_attr(ATTR_INFEASIBLE, unusable)
            if violation > 0:
                return ctx.quick(candidates)[0]
            frame = ctx.measure(candidates, "sequential", self.incumbent_ms)
            self.incumbent_ms = min(frame.latency_ms, self.incumbent_ms if self.incumbent_ms is not None else inf)
            config = Configuration(trial=trial.number, nns={n: m.choice for n, m in frame.nns.items()},
                                   schedule="sequential", latency_ms=frame.latency_ms, memory_bytes=frame.memory_bytes,
                                   errors={n: c.error for n, c in candidates.items()}, in_region=False,
                                   latency=frame.latency)
            trial.set_user_attr(ATTR_CONFIGURATION, config.model_dump(mode="json"))
            return frame.latency_ms


def seeds(ctx: SearchContext, unit: Unit, space: KnobSpace, mild: Sequence[Knobs] = ()) -> list[Knobs]:
    """The knobs a unit's study tries first: the reference, each precision probe alone (unpruned), the least damaging
    settings found within tolerance (``mild``), and the deepest pruning ratio within tolerance."""
    reference = Knobs(seed=ctx.plan.seed)
    probes = [Knobs.model_validate({**reference.model_dump(), **p}) for p in space.probes(alone=True)]
    deepest = deepest_ratio(ctx, unit, space)
    return [reference, *probes, *mild, *([deepest] if deepest is not None else [])]


def hopeless_knobs(ctx: SearchContext, unit: Unit) -> tuple[dict[str, str], list[Knobs]]:
    """The knobs the unit's study holds at the reference's setting, each with why, and the least damaging settings
    of the others (as their trials build them) found within tolerance.

    Each damaging pass's least damaging setting (:meth:`~qaopt.approx.KnobSpace.mildest`) is built with the most
    fine-tuning the space samples (:func:`~qaopt.seeding.most_finetuned`) and judged: outside tolerance by its point
    error, by the premise the walks rest on (what approximates more errs more), no setting of that knob could be
    within. Outside only by the bound (:attr:`~qaopt.tolerance.Judgement.unresolved`: the validation data cannot
    show it within, nor outside), the knob stays searched: fine-tuning moves a candidate's error by more than a 2 %
    bound, either way. On CropFollow distance's mildest pruning (0.05, 160 steps) erred 0.03431 and was rejected by
    the bound (docs/benchmarks/knobs_default/cropfollow-session38/result.json, ``studies["agnostic.distance"]``),
    where distance 15 % pruned with the same steps was within tolerance at 0.03297
    (docs/benchmarks/knobs_default/cropfollow-session32/result.json, trial 24)."""
    space = ctx.plan.knob_spaces[unit.nn]
    held: dict[str, str] = {}
    mild: list[Knobs] = []
    for setting in space.mildest().values():
        knobs = most_finetuned(space, space.base(seed=ctx.plan.seed, **setting))
        candidates = ctx.build_unit(unit, knobs)
        why = outside(ctx, candidates)
        if why is None:
            mild.append(knobs)
            continue
        judged = [ctx.judgement(n, c) for n, c in candidates.items()]
        if not nonfinite(candidates) and all(j.excess <= j.allowed for j in judged):
            continue
        owners = dict.fromkeys(get_pass(knob_owners()[k]) for k in setting)
        described = ", ".join(f"{label} {value}" for p in owners for label, value in p.describe(knobs).items())
        held.update({knob: f"its least damaging setting ({described}, {knobs.finetune_steps} fine-tuning steps) is "
                           f"already outside tolerance ({why}), so no trial setting it could be within"
                     for knob in setting})
    return held, mild


def outside(ctx: SearchContext, candidates: Mapping[str, Candidate]) -> str | None:
    """Why ``candidates`` (a unit's) are outside their NNs' tolerances, each NN at fault named with its error and
    bound; ``None`` when every one is within."""
    if unusable := nonfinite(candidates):
        return f"outputs NaN or inf ({unusable})"
    over = {n: j for n, c in candidates.items() if not (j := ctx.judgement(n, c)).within}
    if not over:
        return None
    return "; ".join(f"{n}: error {candidates[n].error:.4g}, excess bound {j.ucb:.4g} over its allowed {j.allowed:.4g}"
                     for n, j in over.items())


def deepest_ratio(ctx: SearchContext, unit: Unit, space: KnobSpace) -> Knobs | None:
    """The unit's knobs at the deepest pruning ratio its space reaches (a ladder's rungs, else the ratio grid) whose
    candidate is within tolerance, by bisection; ``None`` when the space prunes nothing, holds the ratio, or no ratio
    tried is within."""
    plan = ctx.plan
    pruning = space.configs.get("pruning")
    if not isinstance(pruning, PruningConfig) or "prune_ratio" in space.held:
        return None
    lo, hi = pruning.ratios()
    step = pruning.ladder.step if pruning.ladder is not None else GRID
    ratios = [r for k in range(int(round((hi - lo) / step)) + 1) if (r := round(lo + k * step, 6)) > 0]

    def within(ratio: float) -> bool:
        candidates = ctx.build_unit(unit, space.base(prune_ratio=ratio, seed=plan.seed))
        return not nonfinite(candidates) and ctx.over_tolerance(candidates) <= 0

    accepted = walk([(-r, r) for r in ratios], within)  # the deepest ratio is the cheapest
    if not accepted:
        return None
    # Judged without fine-tuning, which is cheap and only errs more; the seed is a point of the search space (a
    # pruned NN is fine-tuned), with the most fine-tuning it samples, so within tolerance a fortiori.
    return most_finetuned(space, space.base(prune_ratio=accepted[-1][1], seed=plan.seed))


def merge_outside(ctx: SearchContext, unit: Unit) -> str | None:
    """Why no trial of a merged ``unit`` can be within tolerance (``None``: it may be, or it is one NN alone).

    Judged on the merged NN with nothing else approximated, as a trial of it builds it (no further fine-tuning).
    """
    if unit.group is None:
        return None
    space = ctx.plan.knob_spaces[unit.nn]
    why = outside(ctx, ctx.build_unit(unit, most_finetuned(space, space.base(seed=ctx.plan.seed))))
    if why is None:
        return None
    return (f"the merged NN, unpruned at full precision and resolution, is already outside tolerance ({why}), so no "
            "trial of it could be within")


def unit_study_name(plan: RunPlan, unit: Unit) -> str:
    """The name of ``unit``'s study in the run's storage (it holds the spec's hash, so a resumed run continues it)."""
    return plan.study_name(f"{AGNOSTIC_STUDY_PREFIX}{unit.label}")


def units_finished(ctx: SearchContext, storage: BaseStorage) -> bool:
    """Whether every unit's study is done (skipped, or holding the budget's trials): running them adds nothing."""
    for unit in units_of(ctx):
        study = existing_study(storage, unit_study_name(ctx.plan, unit))
        if study is None or (ATTR_SKIPPED not in study.user_attrs and finished_trials(study) < ctx.plan.trials):
            return False
    return True


def run_unit(ctx: SearchContext, unit: Unit, storage: BaseStorage, events: StageEvents, done: list[int]
             ) -> optuna.Study:
    """Create or resume the unit's study and run it to the aware study's budget (``done`` counts trials for progress)."""
    plan = ctx.plan
    study = open_study(unit_study_name(plan, unit), storage, plan.seed, len(OBJECTIVES),
                       {n: ctx.nns[n].fingerprint for n in unit.serves}, events.warn)
    with study_lock(storage, study.study_name):  # workers starting this study together seed it once
        if ATTR_SKIPPED not in study.user_attrs and not study.get_trials(deepcopy=False):  # a new study
            _seed(ctx, unit, study, events)
    if ATTR_SKIPPED in study.user_attrs:
        return study

    def tick(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        done[0] += 1
        events.progress(completed=done[0], description=f"{MODE} {unit.label}: trial {trial.number}")

    optimize_until(study, lambda: UnitObjective(ctx, unit), plan.trials, tick)
    return study


def looked(study: optuna.Study) -> dict[int, dict]:
    """The study's second looks (:data:`ATTR_SECOND_LOOK`) by trial number."""
    return {int(k): v for k, v in study.user_attrs.get(ATTR_SECOND_LOOK, {}).items()}


def judged_of(trial: optuna.trial.FrozenTrial, second: Mapping[int, dict]) -> dict[str, Judgement]:
    """Each NN of a finished unit trial as last judged: on both validation splits where it had a second look."""
    judged = second[trial.number]["judged"] if trial.number in second else trial.user_attrs.get(ATTR_JUDGED, {})
    return {n: Judgement(**j) for n, j in judged.items()}


def within(trial: optuna.trial.FrozenTrial, second: Mapping[int, dict]) -> bool:
    """Whether a finished unit trial is within tolerance: on the first split, or on both at its second look."""
    return bool(trial.user_attrs.get(ATTR_FEASIBLE)) or "configuration" in second.get(trial.number, {})


def best_by_trial(study: optuna.Study) -> list[float]:
    """The study's best latency within tolerance after each of its finished trials, in order (inf before the first);
    a trial within at its second look counts with its measured latency."""
    second = looked(study)
    best, out = inf, []
    for t in sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)),
                    key=lambda t: t.number):
        if t.state == TrialState.COMPLETE and t.values:
            if t.user_attrs.get(ATTR_FEASIBLE):
                best = min(best, t.values[0])
            elif "configuration" in second.get(t.number, {}):
                best = min(best, second[t.number]["configuration"]["latency_ms"])
        out.append(best)
    return out


def within_by_point(trial: optuna.trial.FrozenTrial, second: Mapping[int, dict]) -> bool:
    """Whether every NN of a finished unit trial erred inside its bound by its point excess (a feasible trial did)."""
    judged = judged_of(trial, second).values()
    return bool(trial.values) and (within(trial, second)
                                   or (bool(judged) and all(j.excess <= j.allowed for j in judged)))


def trial_knobs(ctx: SearchContext, unit: Unit, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> Knobs:
    """The knobs a finished unit trial built."""
    space = ctx.plan.knob_spaces[unit.nn].holding(study.user_attrs.get(ATTR_HELD, {}))
    return space.sample(optuna.trial.FixedTrial(dict(trial.params)), unit.nn, seed=ctx.plan.seed)


def point_knobs(ctx: SearchContext, unit: Unit, study: optuna.Study) -> Knobs | None:
    """The knobs of the unit's fastest trial within every bound by its point excess (its latency as the study recorded
    it: measured when feasible, the untuned estimate when only the bound rejected it); ``None`` when there is none."""
    second = looked(study)
    found = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if within_by_point(t, second)]
    if not found:
        return None
    return trial_knobs(ctx, unit, study, min(found, key=lambda t: t.values[0]))


def winner(study: optuna.Study) -> Configuration | None:
    """The unit's fastest configuration within tolerance (on the first validation split, or at a second look)."""
    measured = [Configuration.model_validate(t.user_attrs[ATTR_CONFIGURATION])
                for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.user_attrs.get(ATTR_FEASIBLE) and ATTR_CONFIGURATION in t.user_attrs]
    measured += [Configuration.model_validate(v["configuration"]) for v in looked(study).values()
                 if "configuration" in v]
    return min(measured, key=lambda c: c.latency_ms, default=None)


def second_looks(ctx: SearchContext, unit: Unit, study: optuna.Study, events: StageEvents) -> None:
    """Judge again on both validation splits (:mod:`qaopt.second_look`) each trial faster than the unit's winner (by
    its untuned estimate) that the first split left unresolved and whose every unresolved NN has a second split,
    fastest first, until the winner is faster than the rest; each look is kept in the study (:data:`ATTR_SECOND_LOOK`),
    so a resumed run looks once."""
    if not any(ctx.second_look.available(n) for n in unit.serves):
        return
    second = looked(study)
    best = winner(study)
    pending = sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                      if t.number not in second and not t.user_attrs.get(ATTR_FEASIBLE) and within_by_point(t, second)),
                     key=lambda t: t.values[0])
    by_params = {_params_key(t): second[t.number] for t in study.get_trials(deepcopy=False) if t.number in second}
    for t in pending:
        if best is not None and t.values[0] >= best.latency_ms:
            break
        first = judged_of(t, second)
        if not all(ctx.second_look.available(n) for n, j in first.items() if not j.within):
            continue
        if _params_key(t) in by_params:  # the sampler proposed a trial's knobs again: the same NNs, decided already
            second[t.number] = by_params[_params_key(t)]
            study.set_user_attr(ATTR_SECOND_LOOK, {str(k): v for k, v in second.items()})
            continue
        candidates = ctx.build_unit(unit, trial_knobs(ctx, unit, study, t))
        judged = {n: ctx.judgement_on_both(n, c) or first[n] for n, c in candidates.items()}
        entry: dict = {"judged": {n: dataclasses.asdict(j) for n, j in judged.items()}}
        if all(j.within for j in judged.values()):
            frame = ctx.measure(candidates, "sequential", best.latency_ms if best is not None else None)
            config = Configuration(trial=t.number, nns={n: m.choice for n, m in frame.nns.items()},
                                   schedule="sequential", latency_ms=frame.latency_ms, memory_bytes=frame.memory_bytes,
                                   errors={n: c.error for n, c in candidates.items()}, in_region=False,
                                   latency=frame.latency)
            entry["configuration"] = config.model_dump(mode="json")
            if best is None or config.latency_ms < best.latency_ms:
                best = config
        second[t.number] = by_params[_params_key(t)] = entry
        study.set_user_attr(ATTR_SECOND_LOOK, {str(k): v for k, v in second.items()})
        events.note(second_look_record(unit, t, entry).describe())


def _params_key(trial: optuna.trial.FrozenTrial) -> tuple:
    return tuple(sorted(trial.params.items()))


def unit_summary(study: optuna.Study) -> StudySummary:
    """The unit study as the result holds it, a trial within at its second look counted feasible with the configuration
    that look measured (Optuna's finished trials cannot change, so the study itself still says infeasible)."""
    summary = summarize(study, OBJECTIVES)
    decided = {n: Configuration.model_validate(e["configuration"]) for n, e in looked(study).items()
               if "configuration" in e}
    if not decided:
        return summary
    trials = [t.model_copy(update={"feasible": True, "configuration": decided[t.number]}) if t.number in decided else t
              for t in summary.trials]
    return summary.model_copy(update={"trials": trials,
                                      "trials_feasible": sum(t.feasible for t in trials if t.state == "complete")})


def second_look_records(unit: Unit, study: optuna.Study) -> list[SecondLookTrial]:
    """The unit study's second looks as the result keeps them, by trial number, each set of knobs once (at the first
    trial that proposed it)."""
    second = looked(study)
    first = {}
    for t in study.get_trials(deepcopy=False):
        if t.number in second:
            first.setdefault(_params_key(t), t)
    return [second_look_record(unit, t, second[t.number]) for t in first.values()]


def second_look_record(unit: Unit, trial: optuna.trial.FrozenTrial, entry: Mapping) -> SecondLookTrial:
    """A second look as the result keeps it."""
    config = entry.get("configuration")
    return SecondLookTrial(
        unit=unit.label, trial=trial.number, params=dict(trial.params), within=config is not None,
        judged={n: _excess(Judgement(**j)) for n, j in entry["judged"].items()},
        latency_ms=config["latency_ms"] if config is not None else None)


def _excess(j: Judgement) -> ExcessJudged:
    return ExcessJudged(excess=j.excess, ucb=j.ucb, allowed=j.allowed, frames=j.frames, blocks=j.blocks)


def unresolved_trial(unit: Unit, study: optuna.Study, best: Configuration | None) -> UnresolvedTrial | None:
    """The unit's trial faster than its winner ``best`` (by its untuned estimate) whose every NN erred inside its bound
    by the point excess, at least one rejected on the upper bound alone (on both splits, where it had a second
    look), that the least extra validation data would decide; ``None`` when there is none (the winner is not the
    test's artefact)."""
    baseline = best.latency_ms if best is not None else None
    second = looked(study)
    found: UnresolvedTrial | None = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if (within(t, second) or not within_by_point(t, second)
                or (baseline is not None and t.values[0] >= baseline)):
            continue
        judged = judged_of(t, second)
        needed = max(j.data_needed() for j in judged.values())
        if found is None or needed < found.data_needed:
            found = UnresolvedTrial(
                unit=unit.label, trial=t.number, params=dict(t.params), quick_ms=t.values[0],
                baseline_ms=baseline, data_needed=needed,
                judged={n: _excess(j) for n, j in judged.items()})
    return found


def convergence(ctx: SearchContext, curves: Mapping[Unit, Sequence[float]]) -> ConvergenceCurve:
    """The combined best-so-far by round of unit trials (the module docstring)."""
    rounds = max((len(c) for c in curves.values()), default=0)

    def at(unit: Unit, t: int) -> float:
        curve = curves[unit]
        return curve[min(t, len(curve) - 1)] if curve else inf

    best = [min(sum(at(u, t) for u in layout) for layout in layouts(ctx)) for t in range(rounds)]
    return ConvergenceCurve(trials=sum(len(c) for c in curves.values()), units=[u.label for u in curves],
                            best_ms_by_trial=[None if b == inf else round(b, 6) for b in best])


def combine(ctx: SearchContext, winners: Mapping[Unit, Knobs | None], region: RegionSource) -> Configuration | None:
    """Each layout's frame of its units' winners (their knobs), measured whole on every schedule; the fastest, or
    ``None`` when no layout has a winner for every unit."""
    judged_by = region.current().region
    best: Configuration | None = None
    for layout in layouts(ctx):
        if any(winners.get(u) is None for u in layout):
            continue
        candidates: dict[str, Candidate] = {}
        for unit in layout:
            candidates.update(ctx.build_unit(unit, winners[unit]))
        candidates = {n: candidates[n] for n in ctx.nns}
        errors = ctx.errors_of(candidates)
        for schedule in schedules_for(len(frame_models(candidates)), threads_of(ctx.target)):
            frame = ctx.measure(candidates, schedule, best.latency_ms if best is not None else None)
            if best is None or frame.latency_ms < best.latency_ms:
                best = Configuration(trial=None, nns={n: m.choice for n, m in frame.nns.items()}, schedule=schedule,
                                     latency_ms=frame.latency_ms, memory_bytes=frame.memory_bytes, errors=errors,
                                     in_region=judged_by.contains(errors), latency=frame.latency)
    return best


def _seed(ctx: SearchContext, unit: Unit, study: optuna.Study, events: StageEvents) -> None:
    """Enqueue a new unit study's seeds, or mark it not searched (``ATTR_SKIPPED``) where its merged NN, with
    nothing else approximated, cannot be within tolerance."""
    if unit.group is not None:  # its first build distils the merged NN: minutes on a CPU, once per cache
        events.note(f"{MODE} {unit.label}: building the merged NN with nothing else approximated, to see "
                    "whether any trial of it can be within tolerance")
    if why := merge_outside(ctx, unit):
        events.note(f"{MODE} {unit.label}: not searched: {why}")
        study.set_user_attr(ATTR_SKIPPED, why)
        return
    if mildest := ctx.plan.knob_spaces[unit.nn].mildest():
        events.note(f"{MODE} {unit.label}: building the least damaging setting of "
                    f"{', '.join(k for m in mildest.values() for k in m)}, to see whether any trial setting it can be "
                    "within tolerance")
    held, mild = hopeless_knobs(ctx, unit)
    study.set_user_attr(ATTR_HELD, held)
    for knob, why in held.items():
        events.note(f"{MODE} {unit.label}: {knob} held at the reference's setting: {why}")
    events.note(f"{MODE} {unit.label}: seeding with the reference, each precision alone and the deepest "
                "pruning ratio within tolerance")
    space = ctx.plan.knob_spaces[unit.nn].holding(held)
    first = seeds(ctx, unit, space, mild)
    for knobs in dict.fromkeys(tuple(sorted(space.params_of(k, unit.nn).items())) for k in first):
        study.enqueue_trial(dict(knobs), skip_if_exists=True)


def search_agnostic(ctx: SearchContext, storage: BaseStorage, region: RegionSource, events: StageEvents
                    ) -> AgnosticSearch:
    """Every unit's study to the aware budget, then the fastest combination (``region`` only says whether it is inside)."""
    units = units_of(ctx)
    done = [0]
    events.progress(completed=0, total=len(units) * ctx.plan.trials)
    studies = {unit: run_unit(ctx, unit, storage, events, done) for unit in units}
    for unit, study in studies.items():
        with study_lock(storage, study.study_name):  # workers finishing together look once
            second_looks(ctx, unit, study, events)
    winners = {u: winner(s) for u, s in studies.items()}
    tested = {u: None if w is None else Knobs.model_validate(w.nns[u.nn].knobs) for u, w in winners.items()}
    chosen = combine(ctx, tested, region)
    unresolved = {u.label: found for u, s in studies.items()
                  if (found := unresolved_trial(u, s, winners[u])) is not None}
    for found in unresolved.values():
        events.note(found.describe())
    return AgnosticSearch(
        studies={f"{AGNOSTIC_STUDY_PREFIX}{u.label}": unit_summary(s) for u, s in studies.items()},
        chosen=chosen,
        converged=convergence(ctx, {u: best_by_trial(s) for u, s in studies.items()}),
        unresolved=unresolved,
        second_looks=[record for u, s in studies.items() for record in second_look_records(u, s)],
        by_point=by_point(ctx, studies, tested, chosen, region, events) if unresolved else None,
    )


def by_point(ctx: SearchContext, studies: Mapping[Unit, optuna.Study], tested: Mapping[Unit, Knobs | None],
             chosen: Configuration | None, region: RegionSource, events: StageEvents) -> Configuration | None:
    """The baseline by point error (the module docstring), or ``None`` where it runs ``chosen``'s NNs."""
    knobs = {u: point_knobs(ctx, u, s) for u, s in studies.items()}
    if knobs == dict(tested):
        return None
    found = combine(ctx, knobs, region)
    if found is None or (chosen is not None and found.candidate_keys() == chosen.candidate_keys()):
        return None
    events.note(f"{MODE}: with every trial inside its bounds by its point errors admitted, the baseline would run "
                f"{found.latency_ms:.3g} ms a frame" + (f" (the tested one {chosen.latency_ms:.3g} ms)" if chosen
                                                       else "") + "; the report compares the aware side with both")
    return found
