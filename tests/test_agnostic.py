"""The converged application-agnostic baseline (qaopt.agnostic) against exhaustive enumeration of a toy knob space.

The tiny application's two NNs (and their merged NN) are pruned over a grid of 11 ratios, with no fine-tuning, on
real candidates judged by the real tolerance rule; only latency is scripted (a candidate's cost is its MACs), so the
optimum is decided by the errors, not by timing noise on 0.1 ms NNs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from qaopt.agnostic import AGNOSTIC_STUDY_PREFIX, layouts, search_agnostic, units_of
from qaopt.approx import Knobs
from qaopt.events import Events
from qaopt.measuring import MeasuredConfiguration, MeasuredNN, frame_models
from qaopt.plan import BoundApplication, build_plan
from qaopt.profiles import get_profile
from qaopt.result import Latency, NNChoice
from qaopt.search import FixedRegion, SearchContext, open_storage
from qaopt.spec import load_spec
from qaopt.stages.region import calibrated_region
from qaopt.tolerance import Judgement, Tolerance

APPS = Path(__file__).resolve().parent / "apps"
RATIOS = [round(0.05 * k, 2) for k in range(11)]
TRIALS = 8


def cost(candidate) -> float:
    """The scripted latency (ms) of one frame model: its MACs (ratios that keep the same channels cost the same)."""
    return candidate.macs / 1e4


class ScriptedLatency(SearchContext):
    """The tiny app's real candidates, timed by :func:`cost` instead of on the CPU."""

    def measure(self, candidates, schedule, incumbent_ms=None) -> MeasuredConfiguration:
        models = frame_models(candidates)
        served = {c.key: cost(c) for c in models.values()}
        total = sum(served.values())
        nns = {n: MeasuredNN(c, None, NNChoice(
            knobs=c.knobs.model_dump(mode="json"), candidate=c.key, error=c.error, metric=c.metric, backend="scripted",
            latency_ms=served[c.key], memory_bytes=0, macs=c.macs, params=c.params,
            serves=list(c.serves) if len(c.serves) > 1 else [])) for n, c in candidates.items()}
        return MeasuredConfiguration(nns, total, 0, Latency(ci_ms=(total, total), samples_ms=[[total]], trusted=True,
                                                             epoch="scripted"))

    def quick(self, candidates) -> tuple[float, int | None]:
        return sum(cost(c) for c in frame_models(candidates).values()), 0


def _context(tmp_path: Path, monkeypatch, round_to: int = 4, dtypes: tuple[str, ...] = ("fp32",),
             more_validation: dict | None = None) -> ScriptedLatency:
    """The toy under scripted latency; ``more_validation``: NN a's second validation split (its data args)."""
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    data = yaml.safe_load((APPS / "tiny.yaml").read_text())
    if more_validation is not None:
        data["nns"]["a"]["data"]["more_validation"] = more_validation
    data["approximations"] = {"all": {"pruning": {"ratio": [0.0, 0.5], "round_to": round_to},
                                      "quantization": {"dtypes": list(dtypes)}}}
    data["search"]["trials"] = TRIALS
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(tmp_path / "tiny.yaml")
    region = calibrated_region(BoundApplication(spec), 4, tmp_path / "run").region
    plan = build_plan(spec, get_profile("quick"), trials=TRIALS, out=tmp_path / "run")
    ctx = ScriptedLatency(plan, plan.application.target_nns(plan.cache_dir), region)
    # The toy NNs pruned without fine-tuning err several times their references, by amounts their training decides:
    # the bounds are set between the measured levels, so NN a may take its first level of pruning and NN b its last.
    levels = {}
    for nn in ctx.nns:
        space = plan.knob_spaces[nn]
        judged = [ctx.judgement(nn, ctx.build(nn, space.base(prune_ratio=r, seed=plan.seed))) for r in RATIOS[1:]]
        levels[nn] = sorted({j.ucb / j.reference for j in judged if j.ucb > 0})
    assert len(levels["a"]) > 1, f"the toy prunes to several error levels: {levels}"
    tolerances = {"a": Tolerance("l1", levels["a"][0] * 1.01), "b": Tolerance("l1", levels["b"][-1] * 1.01)}
    return ScriptedLatency(dataclasses.replace(plan, tolerances=tolerances), ctx.nns, region)


def test_the_agnostic_search_reaches_the_optimum_exhaustive_enumeration_finds(tmp_path, monkeypatch):
    ctx = _context(tmp_path, monkeypatch)
    plan = ctx.plan
    # Exhaustive: every unit at every ratio of its grid, judged by the tolerance rule; its fastest within tolerance.
    optimum = {}
    for unit in units_of(ctx):
        space = plan.knob_spaces[unit.nn]
        within = []
        for ratio in RATIOS:
            candidates = ctx.build_unit(unit, space.base(prune_ratio=ratio, seed=plan.seed))
            if ctx.over_tolerance(candidates) <= 0:
                within.append((sum(cost(c) for c in frame_models(candidates).values()), ratio))
        optimum[unit] = min(within, default=None)
    frames = [sum(optimum[u][0] for u in layout) for layout in layouts(ctx) if all(optimum[u] for u in layout)]
    assert any(o is not None and o[1] > 0 for o in optimum.values()), f"the toy is not trivial: {optimum}"
    assert len({o[0] for o in optimum.values() if o is not None}) > 1, f"each unit has its own optimum: {optimum}"

    found = search_agnostic(ctx, open_storage(f"sqlite:///{tmp_path / 'study.db'}"), FixedRegion(ctx.space),
                            Events().for_stage("agnostic search"))

    assert set(found.studies) == {f"{AGNOSTIC_STUDY_PREFIX}{u.label}" for u in units_of(ctx)}
    searched = [u for u in units_of(ctx) if not found.studies[f"{AGNOSTIC_STUDY_PREFIX}{u.label}"].skipped]
    assert 0 < len(searched) < len(units_of(ctx)), "the toy's merged NN is outside its tolerance before any knob"
    for unit in units_of(ctx):
        summary = found.studies[f"{AGNOSTIC_STUDY_PREFIX}{unit.label}"]
        # A merge group is skipped only when its merged NN is outside before any knob, and then nothing is within.
        assert summary.trials_complete == (TRIALS if unit in searched else 0), unit.label
        assert unit in searched or (unit.group is not None and optimum[unit] is None
                                    and "already outside tolerance" in summary.skipped), unit.label
    for unit in units_of(ctx):
        feasible = found.studies[f"{AGNOSTIC_STUDY_PREFIX}{unit.label}"].feasible_configurations()
        best = feasible[0].latency_ms if feasible else None
        assert best == (optimum[unit][0] if optimum[unit] else None), unit.label
    assert found.chosen is not None and found.chosen.latency_ms == min(frames)
    assert found.converged.trials == TRIALS * len(searched)
    assert len(found.converged.best_ms_by_trial) == TRIALS and found.converged.best_ms_by_trial[-1] <= min(frames)

    # Resumed: the studies hold their budget already, nothing runs again and the answer is the same.
    again = search_agnostic(ctx, open_storage(f"sqlite:///{tmp_path / 'study.db'}"), FixedRegion(ctx.space),
                            Events().for_stage("agnostic search"))
    assert again.chosen == found.chosen and again.converged == found.converged


def test_the_aware_study_runs_the_agnostic_choice_as_one_of_its_trials(tmp_path, monkeypatch):
    """The baseline's choice (here NN a at its first pruning level, b at its last: no trial samples it by chance) is
    enqueued in the aware study, so the aware side can never end slower than the baseline for want of proposing it."""
    from qaopt.search import run_study, summarize
    from qaopt.seeding import configuration_params

    ctx = _context(tmp_path, monkeypatch)
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    chosen = search_agnostic(ctx, storage, FixedRegion(ctx.space), Events().for_stage("agnostic search")).chosen
    assert chosen is not None and all(c.knobs["prune_ratio"] > 0 for c in chosen.nns.values()), chosen

    study = run_study(ctx, storage, FixedRegion(ctx.space), Events().for_stage("aware search"), known=[chosen])

    wanted = configuration_params(ctx, chosen)
    [trial] = [t for t in summarize(study, ctx.plan.objectives).trials if wanted.items() <= t.params.items()]
    assert trial.state == "complete" and trial.errors == chosen.errors
    if trial.configuration is not None:
        built = {n: c.candidate for n, c in trial.configuration.nns.items()}
        assert built == {n: c.candidate for n, c in chosen.nns.items()}


def _unresolved(tmp_path: Path, monkeypatch) -> tuple[ScriptedLatency, Judgement]:
    """The toy with NN a's bound between its mildest pruning level's point excess and upper bound, and that level."""
    ctx = _context(tmp_path, monkeypatch)
    plan = ctx.plan
    space = plan.knob_spaces["a"]
    judged = [ctx.judgement("a", ctx.build("a", space.base(prune_ratio=r, seed=plan.seed))) for r in RATIOS[1:]]
    level = min((j for j in judged if j.excess > 0), key=lambda j: j.excess)
    bound = (level.excess + level.ucb) / 2 / level.reference
    return ScriptedLatency(dataclasses.replace(plan, tolerances={**plan.tolerances, "a": Tolerance("l1", bound)}),
                           ctx.nns, ctx.space), level


def test_a_trial_only_the_test_rejected_is_reported_with_the_data_that_would_decide_it(tmp_path, monkeypatch):
    """NN a's bound set between a pruning level's point excess and its upper bound: the baseline keeps NN a nearer the
    reference, and the result names that trial, how much more validation data would decide it, and where to give it."""
    from qaopt.result import AgnosticRule

    ctx, _ = _unresolved(tmp_path, monkeypatch)
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")

    found = search_agnostic(ctx, storage, FixedRegion(ctx.space), Events().for_stage("agnostic search"))

    unresolved = found.unresolved["a"]
    [j] = unresolved.judged.values()
    assert j.excess <= j.allowed < j.ucb and unresolved.data_needed > 1
    assert unresolved.baseline_ms is None or unresolved.quick_ms < unresolved.baseline_ms
    assert j.frames > 0 and j.blocks > 0
    text = unresolved.describe()
    assert f"trial {unresolved.trial}" in text and "nns.a.data" in text and "agnostic_tolerance" in text
    rule = ctx.agnostic_rule(found.chosen, found.unresolved)
    assert AgnosticRule.model_validate_json(rule.model_dump_json()).unresolved == found.unresolved
    # Resumed, the trials' own records give the same report.
    again = search_agnostic(ctx, storage, FixedRegion(ctx.space), Events().for_stage("agnostic search"))
    assert again.unresolved == found.unresolved


def test_the_baseline_by_point_error_admits_what_only_the_test_rejected(tmp_path, monkeypatch):
    """With NN a's bound between a pruning level's point excess and its upper bound, the baseline by point error runs
    NN a pruned so (faster than the tested baseline); with a bound the level's upper bound meets, there is none."""
    ctx, level = _unresolved(tmp_path, monkeypatch)
    plan = ctx.plan
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")

    found = search_agnostic(ctx, storage, FixedRegion(ctx.space), Events().for_stage("agnostic search"))

    point, tested = found.by_point, found.chosen
    assert point is not None and tested is not None
    assert point.latency_ms < tested.latency_ms and point.candidate_keys() != tested.candidate_keys()
    for nn, choice in point.nns.items():  # every NN inside its bound by its point error, one only so
        j = ctx.judgement(nn, ctx.build(nn, Knobs.model_validate(choice.knobs)))
        assert j.excess <= j.allowed
    assert any(not ctx.judgement(n, ctx.build(n, Knobs.model_validate(c.knobs))).within for n, c in point.nns.items())

    wide = ScriptedLatency(dataclasses.replace(plan, tolerances={**plan.tolerances, "a": Tolerance(
        "l1", level.ucb / level.reference * 1.01)}), ctx.nns, ctx.space)
    again = search_agnostic(wide, open_storage(f"sqlite:///{tmp_path / 'wide.db'}"), FixedRegion(ctx.space),
                            Events().for_stage("agnostic search"))
    assert again.by_point is None


def test_an_unresolved_trial_past_any_practical_data_is_told_to_widen_the_bound_only():
    """The ResNet-18 real result's distance trial sits at its bound (point excess +0.000369, allowed 0.000372): about
    75,800x the validation frames would decide it (docs/benchmarks/real_result.json, ``agnostic_unresolved``).
    "More validation sequences" is then no advice; only the bound is."""
    from qaopt.result import ExcessJudged, UnresolvedTrial
    from qaopt.tolerance import PRACTICAL_DATA_FACTOR

    def trial(excess: float) -> UnresolvedTrial:
        judged = ExcessJudged(excess=excess, ucb=0.0011, allowed=0.000372, frames=1920, blocks=96)
        needed = ((judged.ucb - excess) / (judged.allowed - excess)) ** 2
        return UnresolvedTrial(unit="distance", trial=3, params={}, quick_ms=3.92, baseline_ms=5.11,
                               judged={"distance": judged}, data_needed=needed)

    near, at_bound = trial(0.0), trial(0.0003695)
    assert near.data_needed <= PRACTICAL_DATA_FACTOR < at_bound.data_needed
    assert "more validation sequences in nns.distance.data" in near.describe()
    text = at_bound.describe()
    assert "more validation sequences" not in text and "agnostic_tolerance in nns.distance" in text
    assert "more than any practical amount" in text


def test_a_knob_whose_least_damaging_setting_is_outside_tolerance_is_held_at_the_reference(tmp_path, monkeypatch):
    """NN b's bound below what its mildest pruning errs by its point error: no pruned trial of it can be within (what
    prunes more errs more), so its study holds prune_ratio at 0 and says why. (Channels rounded to single ones, so
    that the mildest ratio removes one.)"""
    ctx = _context(tmp_path, monkeypatch, round_to=1)
    plan = ctx.plan
    space = plan.knob_spaces["b"]
    [mildest] = space.mildest().values()
    judged = ctx.judgement("b", ctx.build("b", space.base(seed=plan.seed, **mildest)))
    if judged.excess <= 0:  # the toy's training follows the CPU's float kernels: on an AVX2-only EPYC it errs less
        pytest.skip(f"on this CPU the toy's mildest pruning of NN b errs no more than its reference (excess "
                    f"{judged.excess:+.4f}): the case needs one that errs more")
    tight = Tolerance("l1", judged.excess / 2 / judged.reference)
    ctx = ScriptedLatency(dataclasses.replace(plan, tolerances={**plan.tolerances, "b": tight}), ctx.nns, ctx.space)

    found = search_agnostic(ctx, open_storage(f"sqlite:///{tmp_path / 'study.db'}"), FixedRegion(ctx.space),
                            Events().for_stage("agnostic search"))

    summary = found.studies[f"{AGNOSTIC_STUDY_PREFIX}b"]
    assert set(summary.held) == {"prune_ratio"} and "already outside tolerance" in summary.held["prune_ratio"]
    assert all(t.params.get("b.prune_ratio", 0.0) == 0.0 for t in summary.trials), "no trial prunes NN b"
    assert summary.trials_complete == TRIALS
    assert found.studies[f"{AGNOSTIC_STUDY_PREFIX}a"].held == {}, "NN a's mildest pruning is within its bound"
    assert found.chosen is not None and found.chosen.nns["b"].knobs["prune_ratio"] == 0.0


def test_a_knob_whose_least_damaging_setting_only_the_bound_rejects_stays_searched(tmp_path, monkeypatch):
    """NN a's bound between its mildest pruning's point excess and that excess's upper bound: the validation data
    cannot show it within, nor outside, and another ratio may be shown within, so no knob is held."""
    ctx = _context(tmp_path, monkeypatch, round_to=1)
    plan = ctx.plan
    space = plan.knob_spaces["a"]
    [mildest] = space.mildest().values()
    judged = ctx.judgement("a", ctx.build("a", space.base(seed=plan.seed, **mildest)))
    assert judged.excess < judged.ucb
    between = Tolerance("l1", (max(judged.excess, 0.0) + judged.ucb) / 2 / judged.reference)
    ctx = ScriptedLatency(dataclasses.replace(plan, tolerances={**plan.tolerances, "a": between}), ctx.nns, ctx.space)
    assert ctx.judgement("a", ctx.build("a", space.base(seed=plan.seed, **mildest))).unresolved

    found = search_agnostic(ctx, open_storage(f"sqlite:///{tmp_path / 'study.db'}"), FixedRegion(ctx.space),
                            Events().for_stage("agnostic search"))

    assert found.studies[f"{AGNOSTIC_STUDY_PREFIX}a"].held == {}


def test_the_aware_study_enqueues_each_configuration_once(tmp_path, monkeypatch):
    """Two parameter sets can build one configuration (a merged trial reads only its lead's knobs): the merged NN in
    bf16 enqueued first as the walk enqueues it is not enqueued again as the merged NN's precision trial, which names
    every NN's parameters, so a short study wastes no trial (a quick run once ran two of its six twice)."""
    import optuna

    from qaopt.search import _seed, built_by

    import qaopt.kernels.runnable as runnable

    # What is tested is the enqueueing, not this CPU's bf16: keep bf16 in the space where it would only be emulated.
    monkeypatch.setattr(runnable, "emulated_dtypes", lambda *args, **kwargs: {})
    ctx = _context(tmp_path, monkeypatch, dtypes=("fp32", "bf16"))
    [group] = ctx.plan.merge_groups
    lead = ctx.merge_leads[group]
    reference = {k: v for nn in ctx.nns for k, v in ctx.plan.knob_spaces[nn].params_of(ctx.reference_knobs[nn],
                                                                                       nn).items()}
    walked = {"schedule": "sequential", group.param: True,
              **{k: v for k, v in reference.items() if k.startswith(f"{lead}.")}, f"{lead}.dtype": "bf16"}
    precision = {**reference, "schedule": "sequential", group.param: True, f"{lead}.dtype": "bf16"}
    assert walked != precision and built_by(ctx, walked) == built_by(ctx, precision) is not None
    assert built_by(ctx, {"schedule": "sequential"}) is None, "parameters the trial would still sample"
    study = optuna.create_study(directions=["minimize"] * len(ctx.plan.objectives))
    study.enqueue_trial(walked)

    _seed(ctx, study, FixedRegion(ctx.space), Events().for_stage("aware search"), known=[])

    built = [built_by(ctx, t.system_attrs["fixed_params"]) for t in study.get_trials(deepcopy=False)]
    assert built.count(built_by(ctx, walked)) == 1 and len(set(built)) == len(built), "no configuration twice"


SECOND_SPLIT = {"drives": 48}
"""NN a's second validation split in the toy: the last six of 48 drives (the first split holds the last six of 24)."""


def test_a_second_validation_split_decides_a_trial_the_first_could_not(tmp_path, monkeypatch):
    """NN a's bound set between a pruning level's upper bound on both splits together and on the first alone: the
    first split leaves the level unresolved, the second look (on twice the frames) admits it, and NN a's study takes
    it (or a faster one) as its winner; resumed, the looks are read back, not taken again."""
    import optuna

    from qaopt.agnostic import second_look_records, unit_study_name, winner
    from qaopt.seeding import Unit

    ctx = _context(tmp_path, monkeypatch, more_validation=SECOND_SPLIT)
    plan = ctx.plan
    space = plan.knob_spaces["a"]
    levels = [ctx.build("a", space.base(prune_ratio=r, seed=plan.seed)) for r in RATIOS[1:]]
    level = min((c for c in levels if ctx.judgement("a", c).excess > 0), key=lambda c: ctx.judgement("a", c).excess)
    first, both = ctx.judgement("a", level), ctx.judgement_on_both("a", level)
    assert both is not None and both.frames == 2 * first.frames
    assert max(both.ucb, first.excess) < first.ucb, f"twice the frames narrow the interval: {first} {both}"
    bound = (max(both.ucb, first.excess) + first.ucb) / 2 / first.reference
    ctx = ScriptedLatency(dataclasses.replace(plan, tolerances={**plan.tolerances, "a": Tolerance("l1", bound)}),
                          ctx.nns, ctx.space)
    assert ctx.judgement("a", level).unresolved and ctx.judgement_on_both("a", level).within
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")

    found = search_agnostic(ctx, storage, FixedRegion(ctx.space), Events().for_stage("agnostic search"))

    looks = [look for look in found.second_looks if look.unit == "a"]
    assert looks, "the trial the first split left unresolved was judged again"
    for look in looks:
        j = look.judged["a"]
        assert j.frames == 2 * first.frames and look.within == (j.ucb <= j.allowed)
        assert (look.latency_ms is not None) == look.within
        assert f"trial {look.trial} judged again on both validation splits" in look.describe()
    study = optuna.load_study(study_name=unit_study_name(plan, Unit("a")), storage=storage)
    best = winner(study)
    assert best is not None and best.latency_ms <= min(look.latency_ms for look in looks if look.within)
    assert "a" not in found.unresolved or found.unresolved["a"].judged["a"].frames == 2 * first.frames
    rule = ctx.agnostic_rule(found.chosen, found.unresolved, found.second_looks)
    assert rule.second_looks == found.second_looks
    assert {t.chosen_frames for t in rule.nns.values()} <= {first.frames, 2 * first.frames}
    summary = found.studies[f"{AGNOSTIC_STUDY_PREFIX}a"]  # the report's trial table: the looks that admitted
    admitted = {look.trial for look in looks if look.within}
    assert admitted and all(t.feasible and t.configuration is not None for t in summary.trials if t.number in admitted)
    assert summary.feasible_configurations()[0].latency_ms == best.latency_ms

    again = search_agnostic(ctx, storage, FixedRegion(ctx.space), Events().for_stage("agnostic search"))
    assert again.second_looks == found.second_looks and again.chosen == found.chosen
    assert second_look_records(Unit("a"), study) == looks


def test_without_a_second_split_nothing_is_judged_again(tmp_path, monkeypatch):
    """The same unresolved trial without ``more_validation``: no second look, and the result names the trial the data
    could not decide, with the second split among the fixes."""
    ctx, _ = _unresolved(tmp_path, monkeypatch)

    found = search_agnostic(ctx, open_storage(f"sqlite:///{tmp_path / 'study.db'}"), FixedRegion(ctx.space),
                            Events().for_stage("agnostic search"))

    assert found.second_looks == [] and "a" in found.unresolved
    assert "more_validation" in found.unresolved["a"].describe()


def test_a_second_split_that_changes_nothing_is_refused_at_its_line(tmp_path):
    """``more_validation`` whose args are already the data's would judge the same frames twice."""
    from qaopt.app_spec.errors import SpecError

    data = yaml.safe_load((APPS / "tiny.yaml").read_text())
    data["nns"]["a"]["data"]["more_validation"] = {"target": "a"}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        load_spec(tmp_path / "tiny.yaml")
    except SpecError as exc:
        text = str(exc)
    else:
        raise AssertionError("a second split equal to the first loaded")
    assert "nns.a.data" in text and "more_validation" in text and "changes nothing" in text
