"""Informed first trials: the cheapest combination of knobs inside the study's bounds, and a milder fallback, found
before sampling.

With a handful of trials (the quick profile runs six) and a space of pruning ratios,
input scales, dtypes and merge groups, random sampling rarely lands on the
combination that wins: the smallest resolution the application tolerates, on the
fastest dtype, merged. So each study starts from informed trials:

1. **Screening (cheap).** Every probe a pass declares (each dtype, each input scale)
   other than the reference's own setting is built alone on each reference NN and on
   each merge group's merged NN, with no fine-tuning, and timed untuned. Latency does not depend on the weights, so this
   costs one export and a short timing per probe, and no training.
2. **Estimating.** A combination's latency is estimated as the unit's reference
   latency times each of its knobs' measured factors (a unit is an NN alone or a
   merged group). The estimate only orders the walk; trials measure the real figure.
3. **Walking.** The weights of a combination (its input scales, merged or apart) decide
   its error; its precisions barely move it (CropFollow's int8 heading NN errs 1.499
   against the reference's 1.484: docs/benchmarks/readme_runs/session41-quick/result.json,
   ``studies.aware``). So the walk bisects over weights, sorted by their
   estimate at the cheapest precision, for the cheapest weights inside the region, and
   judges each weights in its cheapest precision mix first, then with no precision knob
   (outside there, outside at any), then bisects between (:func:`cheapest_precision`).
   A combination is built with the run's full fine-tuning budget where a trial of it
   fine-tunes (:func:`most_finetuned`: not an NN only quantized) and judged whole (the
   agnostic baseline seeds its per-unit studies itself, :mod:`qaopt.agnostic`); the
   precision mixes of one weights share its fine-tuned float NN, so each costs only its
   outputs. At most :data:`WALK_BUILDS` weights per walk; every candidate built here is
   cached and reused by the trials. A bisection over every combination at once can skip
   the merged int8 NN (between two merged NNs at input 0.75 found outside) and end on an
   fp32 heading NN at input 0.375: 1.16x over the agnostic baseline
   (docs/benchmarks/readme_runs/session37-profile/result.json), where a run that chose the
   merged int8 NN gave 2.52x (docs/benchmarks/readme_runs/session36-batch8/result.json; both
   timings marked untrusted). Layouts (merge groups
   merged, or every NN alone) are walked cheapest first, and a later walk judges only
   weights estimated faster than what an earlier one found.

Two informed configurations are enqueued right after the reference: the cheapest one
the walks found inside the region, and a milder one to fall back on when closed-loop runs
reject the cheapest (the region is a model of the application; validation takes the
fastest configuration that passes, so a fallback that is already built and measured costs
one cached trial). The fallback must run other weights than the cheapest, not only another
precision of them: the same weights in fp32 or int8 err alike (1.499 against 1.484 above),
so on CropFollow's hard seeds the merged NN at a reduced input fails the same closed-loop
runs in both precisions, and a fallback of its other precision falls with it. So it is the dearest
one the walks found whose knobs other than precision differ from the cheapest's, else the
cheapest's layout and precisions with no other knob (the merged NN at full resolution),
when that is inside the region; walks consider only what is estimated faster than the
reference, which is trial 0. A probe the screening found slower than the reference on
every unit is not tried as a trial. What the screening timed and every combination the
walks built are kept with the study (:class:`~qaopt.result.InformedStart`): the report's
"How the search started". Then comes the application-agnostic choice
(:func:`configuration_params`): it is inside the aware study's space and usually inside the
region, so the aware study always measures it, and its front can never be slower than the
baseline for want of proposing it (a study's sampled trials need not come near it). Then each precision
alone, apart and on each merged NN (:func:`precision_trials`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qaopt.approx import Candidate, Knobs, KnobSpace
from qaopt.calibrate import ErrorRegion
from qaopt.plan import MergePlan
from qaopt.result import InformedStart, WalkTry

if TYPE_CHECKING:
    from qaopt.result import Configuration
    from qaopt.search import SearchContext

WALK_BUILDS = 6
"""Weights (a layout's input scales and merges) a walk judges at most (bisection: enough for 64 of them)."""
PRECISION_BUILDS = 2
"""Precision mixes a weights' judgement builds at most between its cheapest and its dearest
(:func:`cheapest_precision`)."""

Probe = Mapping[str, Any]


@dataclass(frozen=True)
class Unit:
    """What one part of a configuration runs: one NN alone, or a merge group's merged NN (``group``)."""

    nn: str
    """The NN whose knob space applies (a group's lead)."""
    group: MergePlan | None = None

    @property
    def serves(self) -> tuple[str, ...]:
        return self.group.nns if self.group is not None else (self.nn,)

    @property
    def label(self) -> str:
        """The unit's name in study names, results and logs: ``heading``, or ``heading+distance`` for a group."""
        return "+".join(self.serves)


@dataclass(frozen=True)
class Screening:
    """Each unit's untuned reference latency (ms) and each probe's latency factor on it."""

    reference_ms: Mapping[Unit, float]
    factors: Mapping[Unit, Mapping[tuple, float]]

    def estimate(self, unit: Unit, combination: Sequence[Probe]) -> float:
        return self.reference_ms[unit] * math.prod(self.factors[unit][_key(p)] for p in combination)

    def slower_everywhere(self, probe: Probe) -> bool:
        """Whether ``probe`` alone was slower than the reference on every unit (not worth a trial)."""
        return all(f[_key(probe)] > 1.0 for f in self.factors.values())


def _key(probe: Probe) -> tuple:
    return tuple(sorted(probe.items()))


def families(probes: Sequence[Probe]) -> list[list[Probe]]:
    """The probes grouped by the knobs they set, each family led by ``{}`` (the knob left as the reference has it)."""
    grouped: dict[tuple[str, ...], list[Probe]] = {}
    for p in probes:
        grouped.setdefault(tuple(sorted(p)), []).append(p)
    return [[{}, *ps] for ps in grouped.values()]


def combinations(probes: Sequence[Probe]) -> list[tuple[Probe, ...]]:
    """Every way of taking at most one probe per family (the reference's setting included)."""
    return [tuple(p for p in combo if p) for combo in itertools.product(*families(probes))]


def screen(units: Sequence[Unit], probes: Mapping[Unit, Sequence[Probe]],
           latency: Callable[[Unit, Probe], float]) -> Screening:
    """Time each unit's reference (``latency(unit, {})``) and each probe alone on the NNs that run alone.

    A merged unit takes its lead's factors: it is the lead's backbone with a wider output layer, so only its
    reference is timed (and the costly probes of a merged NN are never built unless the walk wants them).
    """
    reference = {u: latency(u, {}) for u in units}
    factors = {u: {_key(p): latency(u, p) / max(reference[u], 1e-9) for p in probes[u]}
               for u in units if u.group is None}
    for u in units:
        if u.group is not None:
            factors[u] = factors.get(Unit(u.nn)) or {
                _key(p): latency(u, p) / max(reference[u], 1e-9) for p in probes[u]}
    return Screening(reference, factors)


def walk(options: Sequence[tuple[float, Any]], feasible: Callable[[Any], bool], budget: int = WALK_BUILDS
         ) -> list[tuple[float, Any]]:
    """The ``(estimated ms, option)`` pairs of ``options`` whose option ``feasible`` accepted while bisecting for
    the cheapest one, in the order tried (each cheaper than the one before, so the last is the cheapest found);
    at most ``budget`` tried, empty when none tried is.

    Bisection assumes what costs less errs more (the cheaper, the more aggressive the knobs), so the feasible
    options form the dearer end of the list; where that does not hold exactly it still returns feasible
    options, if not always the cheapest one.
    """
    ordered = sorted(options, key=lambda o: o[0])
    accepted, lo, hi = [], 0, len(ordered) - 1
    for _ in range(budget):
        if lo > hi:
            break
        mid = (lo + hi) // 2
        if feasible(ordered[mid][1]):
            accepted.append(ordered[mid])
            hi = mid - 1
        else:
            lo = mid + 1
    return accepted


def merged_units(nns: Sequence[str], groups: Sequence[MergePlan], leads: Mapping[MergePlan, str],
                 merged: bool) -> list[Unit]:
    """The units of a configuration in which every group is merged (``merged``) or every NN runs alone."""
    if not merged:
        return [Unit(n) for n in nns]
    grouped = {n for g in groups for n in g.nns}
    return [Unit(leads[g], g) for g in groups] + [Unit(n) for n in nns if n not in grouped]


def most_finetuned(space: KnobSpace, knobs: Knobs) -> Knobs:
    """``knobs`` with the most fine-tuning steps a trial of them samples: what a walk builds and judges, since
    fine-tuning only lowers a damaged NN's error. None where nothing is damaged (an NN only quantized, a merged NN
    otherwise intact): a trial of those runs none, and fine-tuning them would judge, and spend minutes building,
    a candidate no trial runs."""
    steps = max(space.choices("finetune_steps") or [0]) if space.offers("finetune_steps", knobs) else 0
    return knobs_of(knobs, [{"finetune_steps": steps}])


def knobs_of(base: Knobs, combination: Sequence[Probe]) -> Knobs:
    """``base`` with every probe of ``combination`` applied."""
    settings: dict[str, Any] = {}
    for probe in combination:
        settings.update(probe)
    return Knobs.model_validate({**base.model_dump(), **settings})


# ---------------------------------------------------------------- a study's informed trials


def informed_trials(ctx: SearchContext, region: ErrorRegion, note: Callable[[str], None]
                    ) -> tuple[list[dict[str, Any]], InformedStart | None]:
    """The trial parameters of the cheapest configuration of reference, probes and merges found inside the region,
    then of the dearest one found there when it differs (the module docstring), and the record of how they were
    found; no trials when nothing tried within the walks' budget is inside, and no record either when the space
    has no probe and no merge group."""
    plan = ctx.plan
    nns = list(ctx.nns)
    layouts = [merged_units(nns, plan.merge_groups, ctx.merge_leads, merged)
               for merged in ([False, True] if plan.merge_groups else [False])]
    units = list(dict.fromkeys(u for layout in layouts for u in layout))
    base = {u: plan.knob_spaces[u.nn].base(seed=plan.seed) for u in units}
    # A probe that sets a knob to the reference's own value (dtype fp32) is its family's "as the reference": walked
    # as a setting of its own, it would only spend one of the walk's builds judging the same NN twice.
    probes = {u: [p for p in plan.knob_spaces[u.nn].probes() if knobs_of(base[u], [p]) != base[u]] for u in units}
    if not any(probes.values()) and not plan.merge_groups:
        return [], None

    def judged(unit: Unit, combo: Sequence[Probe]) -> Knobs:
        return most_finetuned(plan.knob_spaces[unit.nn], knobs_of(base[unit], combo))

    def latency(unit: Unit, probe: Probe) -> float:
        # Timing needs a probe's shape, not its training: a scale is timed unadapted (an export, not an adaptation
        # of every NN to every scale, most of which no trial takes).
        knobs = knobs_of(base[unit], [probe] if probe else [])
        return ctx.quick(ctx.build_unit(unit, knobs.model_copy(update={"input_adapt_steps": 0})))[0]

    note(f"aware: timing {sum(len(p) for u, p in probes.items() if u.group is None)} probes on the reference NNs "
         "(untuned, no fine-tuning) to choose the first trials")
    screening = screen(units, probes, latency)
    tried: list[WalkTry] = []

    def feasible(choice: Mapping[Unit, tuple[Probe, ...]]) -> bool:
        described = _describe(choice)
        if (known := next((t for t in tried if t.choice == described), None)) is not None:
            return known.inside
        candidates: dict[str, Candidate] = {}
        for unit, combo in choice.items():
            candidates.update(ctx.build_unit(unit, judged(unit, combo)))
        inside = (not any(c.nonfinite_outputs for c in candidates.values())
                  and ctx.violation("aware", ctx.errors_of(candidates), candidates, region) <= 0)
        tried.append(WalkTry(choice=described, estimated_ms=_estimate(screening, choice), inside=inside))
        return inside

    precisions = {u: [p for p in plan.knob_spaces[u.nn].probes(alone=True) if p in probes[u]] for u in units}

    reference_ms = sum(screening.reference_ms[u] for u in layouts[0])

    def precision_options(choice: Mapping[Unit, tuple[Probe, ...]]) -> list[tuple[float, dict]]:
        """``choice``'s weights in every mix of each unit's precisions (its own, or one probe) estimated faster than
        the reference (no slower mix is worth a trial)."""
        mixes = itertools.product(*[[(), *((p,) for p in precisions[u])] for u in choice])
        options = [{u: (*choice[u], *mix) for u, mix in zip(choice, per_unit, strict=True)} for per_unit in mixes]
        return [(e, o) for o in options if (e := _estimate(screening, o)) < reference_ms]

    def judge(choice: Mapping[Unit, tuple[Probe, ...]], bound: float) -> tuple[float, dict] | None:
        return cheapest_precision([o for o in precision_options(choice) if o[0] < bound], feasible)

    joints = []
    for layout in layouts:
        options = [[c for c in combinations(probes[u]) if not any(p in precisions[u] for p in c)] for u in layout]
        weights = [dict(zip(layout, parts, strict=True)) for parts in itertools.product(*options)]
        joints.append([(min(e for e, _ in mixes), w) for w in weights if (mixes := precision_options(w))])

    def relaxed(choice: Mapping[Unit, tuple[Probe, ...]]) -> dict[Unit, tuple[Probe, ...]]:
        return {u: () for u in choice}

    chosen = cheapest_and_fallback(joints, judge, ceiling=reference_ms, relaxed=relaxed)
    roles = {_describe(choice): role for (_, choice), role in zip(chosen, ("cheapest", "fallback"), strict=False)}
    record = InformedStart(
        reference_ms={u.label: screening.reference_ms[u] for u in units},
        factors={u.label: {describe_probe(dict(k)): f for k, f in screening.factors[u].items()} for u in units},
        reference_frame_ms=reference_ms,
        walk=[t.model_copy(update={"role": roles.get(t.choice)}) if t.inside else t for t in tried],
    )
    if not chosen:
        note(f"aware: no combination of probes estimated faster than the reference and inside the study's bounds "
             f"within {WALK_BUILDS} weights per layout; the search starts from the reference")
        return [], record
    for (estimate, choice), role in zip(chosen, ("cheapest", "fallback"), strict=False):
        note(f"aware: informed trial ({role}) {_describe(choice)} (estimated {estimate:.2f} ms untuned, "
             f"reference {reference_ms:.2f} ms)")
    return [_params(ctx, {u: judged(u, combo) for u, combo in choice.items()}) for _, choice in chosen], record


def cheapest_precision(options: Sequence[tuple[float, Any]], feasible: Callable[[Any], bool],
                       budget: int = PRECISION_BUILDS) -> tuple[float, Any] | None:
    """The cheapest of one weights' ``(estimated ms, option)`` precision mixes that ``feasible`` accepts, or ``None``.

    A lower precision moves an NN's error far less than its weights do (CropFollow: int8 heading 1.499 against the
    reference's 1.484), so the cheapest mix is tried first and, where it fails, the dearest (no precision knob):
    outside the region at its own precision, the weights are outside at any. Between them, bisection with
    ``budget`` builds. Every mix shares its weights' fine-tuned float NN, so each try costs its outputs only.
    """
    ordered = sorted(options, key=lambda o: o[0])
    if not ordered:
        return None
    if feasible(ordered[0][1]):
        return ordered[0]
    if len(ordered) == 1 or not feasible(ordered[-1][1]):
        return None
    between = walk(ordered[1:-1], feasible, budget)
    return between[-1] if between else ordered[-1]


def cheapest_and_fallback(joints: Sequence[Sequence[tuple[float, Any]]],
                          judge: Callable[[Any, float], tuple[float, Any] | None], ceiling: float = math.inf,
                          relaxed: Callable[[Any], Any] | None = None) -> list[tuple[float, Any]]:
    """Walk each layout's ``(estimated ms, weights)`` list (each weights at its cheapest precision), the layout with
    the cheapest weights first, each walk given only the weights estimated below ``ceiling`` (the reference: an
    option no faster is no trial worth enqueueing, not even as the fallback) and below the cheapest found so far.
    ``judge(weights, bound)`` is the ``(estimated ms, option)`` of the weights' cheapest precision inside among
    those estimated below ``bound``, or ``None``: a precision no faster than what was found is not built.

    Returns the cheapest found and a fallback with other weights: the dearest found, else ``relaxed(cheapest
    weights)`` (the same layout with no knob but precisions) when it differs and is found inside below ``ceiling``.
    Empty when no walk found one."""
    found: list[tuple[Any, tuple[float, Any]]] = []  # (weights, its judged option) of each weights found inside
    for joint in sorted(joints, key=lambda j: min((e for e, _ in j), default=math.inf)):
        bound = min((option[0] for _, option in found), default=ceiling)
        below = [(e, w) for e, w in joint if e < bound]
        judged: dict[int, tuple[float, Any] | None] = {}

        def inside(i: int, below=below, bound=bound, judged=judged) -> bool:
            judged[i] = judge(below[i][1], bound)
            return judged[i] is not None

        accepted = walk([(e, i) for i, (e, _) in enumerate(below)], inside)
        found += [(below[i][1], judged[i]) for _, i in accepted]
    if not found:
        return []
    weights, cheapest = min(found, key=lambda f: f[1][0])
    others = [option for w, option in found if w is not weights]
    if others:
        return [cheapest, max(others, key=lambda o: o[0])]
    if relaxed is not None and (mild := relaxed(weights)) != weights:
        option = judge(mild, ceiling)
        if option is not None:
            return [cheapest, option]
    return [cheapest]


def precision_trials(reference: Mapping[str, Any], knobs: Mapping[str, Knobs], probes: Mapping[str, Sequence[Probe]],
                     leads: Mapping[MergePlan, str]) -> list[dict[str, Any]]:
    """The trial parameters of each precision probe alone, no other knob: first on every NN apart that has it (what
    accuracy-preserving compression tries first), then on each merge group's merged NN (``leads``: each group's
    lead, whose knobs the merged NN takes). ``reference`` is the reference trial's parameters.

    Merging at full resolution gets trials of its own because the walk bisects over every knob at once and may
    never build it, while a well-distilled merged NN keeps the references' accuracy (docs/knobs.md, "How long to
    distil").
    """
    def changed(nn: str, probe: Probe) -> dict[str, Any]:
        return {f"{nn}.{knob}": value for knob, value in probe.items() if getattr(knobs[nn], knob) != value}

    trials = []
    for probe in [dict(p) for p in dict.fromkeys(tuple(sorted(p.items())) for ps in probes.values() for p in ps)]:
        apart = {k: v for nn in knobs if probe in probes[nn] for k, v in changed(nn, probe).items()}
        if apart:
            trials.append({**reference, **apart})
    for group, lead in leads.items():
        trials += [{**reference, group.param: True, **changed(lead, probe)} for probe in probes[lead]
                   if changed(lead, probe)]
    return trials


def configuration_params(ctx: SearchContext, config: Configuration) -> dict[str, Any]:
    """The study's trial parameters under which a trial builds ``config`` (its NNs' knobs, each merge group merged
    or apart as it is there, its schedule): a configuration found elsewhere, such as the agnostic choice, enqueued.

    A merged NN takes its group lead's knobs; the other members' parameters are left to the sampler (a merged
    trial does not read them).
    """
    units: dict[Unit, Knobs] = {}
    for group in ctx.plan.merge_groups:
        lead = ctx.merge_leads[group]
        if sorted(config.nns[lead].serves) == sorted(group.nns):
            units[Unit(lead, group)] = Knobs.model_validate(config.nns[lead].knobs)
    merged = {nn for unit in units for nn in unit.serves}
    units.update({Unit(nn): Knobs.model_validate(c.knobs) for nn, c in config.nns.items() if nn not in merged})
    return {**_params(ctx, units), "schedule": config.schedule}


def describe_probe(probe: Probe) -> str:
    """``dtype int8``, ``input_scale 0.75``: a probe (or several knobs' settings) as the report and the log name it."""
    return ", ".join(f"{k} {v}" for k, v in probe.items())


def _describe(choice: Mapping[Unit, tuple[Probe, ...]]) -> str:
    return "; ".join(f"{unit.label}: {', '.join(describe_probe(p) for p in combo) or 'as the reference'}"
                     for unit, combo in choice.items())


def _estimate(screening: Screening, choice: Mapping[Unit, tuple[Probe, ...]]) -> float:
    return sum(screening.estimate(u, c) for u, c in choice.items())


def _params(ctx: SearchContext, knobs: Mapping[Unit, Knobs]) -> dict[str, Any]:
    """The study's trial parameters under which a trial builds each unit with its ``knobs`` (the merge flags set,
    sequential)."""
    plan = ctx.plan
    params: dict[str, Any] = {"schedule": "sequential", **{g.param: False for g in plan.merge_groups}}
    for unit, unit_knobs in knobs.items():
        params.update(plan.knob_spaces[unit.nn].params_of(unit_knobs, unit.nn))
        if unit.group is not None:
            params[unit.group.param] = True
    return params
