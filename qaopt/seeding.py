"""Informed first trials: the cheapest combination of knobs inside the study's bounds, found before sampling.

With a handful of trials (the quick profile runs six) and a space of pruning ratios,
input scales, dtypes and merge groups, random sampling rarely lands on the
combination that wins: the smallest resolution the application tolerates, on the
fastest dtype, merged. So each study starts from an informed trial:

1. **Screening (cheap).** Every probe a pass declares (each dtype, each input scale)
   is built alone on each reference NN and on each merge group's merged NN, with no
   fine-tuning, and timed untuned. Latency does not depend on the weights, so this
   costs one export and a short timing per probe, and no training.
2. **Estimating.** A combination's latency is estimated as the unit's reference
   latency times each of its knobs' measured factors (a unit is an NN alone or a
   merged group). The estimate only orders the walk; trials measure the real figure.
3. **Walking.** Combinations, sorted by estimate, are built with the run's full
   fine-tuning budget and bisected for the cheapest one inside the region (the whole
   configuration is judged; the agnostic baseline seeds its per-unit studies itself,
   :mod:`qaopt.agnostic`). At most :data:`WALK_BUILDS` builds per walk; every candidate built here is cached and
   reused by the trials.

The informed configuration is enqueued right after the reference; a probe the
screening found slower than the reference on every unit is not tried as a trial.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qaopt.approx import Candidate, Knobs
from qaopt.calibrate import ErrorRegion
from qaopt.plan import MergePlan

if TYPE_CHECKING:
    from qaopt.search import SearchContext

WALK_BUILDS = 6
"""Candidate configurations a walk builds at most (bisection: enough for 64 combinations)."""

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


def walk(options: Sequence[tuple[float, Any]], feasible: Callable[[Any], bool], budget: int = WALK_BUILDS) -> Any | None:
    """The cheapest of ``options`` (``(estimated ms, option)``) that ``feasible`` accepts, found by bisection over
    the options sorted by estimate, trying at most ``budget``; ``None`` when none tried is.

    Bisection assumes what costs less errs more (the cheaper, the more aggressive the knobs), so the feasible
    options form the dearer end of the list; where that does not hold exactly it still returns a feasible
    option, if not always the cheapest one.
    """
    ordered = [option for _, option in sorted(options, key=lambda o: o[0])]
    best, lo, hi = None, 0, len(ordered) - 1
    for _ in range(budget):
        if lo > hi:
            break
        mid = (lo + hi) // 2
        if feasible(ordered[mid]):
            best, hi = ordered[mid], mid - 1
        else:
            lo = mid + 1
    return best


def merged_units(nns: Sequence[str], groups: Sequence[MergePlan], leads: Mapping[MergePlan, str],
                 merged: bool) -> list[Unit]:
    """The units of a configuration in which every group is merged (``merged``) or every NN runs alone."""
    if not merged:
        return [Unit(n) for n in nns]
    grouped = {n for g in groups for n in g.nns}
    return [Unit(leads[g], g) for g in groups] + [Unit(n) for n in nns if n not in grouped]


def knobs_of(base: Knobs, combination: Sequence[Probe]) -> Knobs:
    """``base`` with every probe of ``combination`` applied."""
    settings: dict[str, Any] = {}
    for probe in combination:
        settings.update(probe)
    return Knobs.model_validate({**base.model_dump(), **settings})


# ---------------------------------------------------------------- a study's informed trial


def informed_trial(ctx: SearchContext, region: ErrorRegion, note: Callable[[str], None]) -> dict[str, Any] | None:
    """The trial parameters of the cheapest configuration of reference, probes and merges found inside the
    region (``None``: no probe in the space, or nothing inside within the walk's budget)."""
    plan = ctx.plan
    nns = list(ctx.nns)
    layouts = [False, True] if plan.merge_groups else [False]
    units = list(dict.fromkeys(u for merged in layouts for u in merged_units(nns, plan.merge_groups, ctx.merge_leads,
                                                                                merged)))
    probes = {u: plan.knob_spaces[u.nn].probes() for u in units}
    if not any(probes.values()) and not plan.merge_groups:
        return None
    base = {u: plan.knob_spaces[u.nn].base(seed=plan.seed) for u in units}
    full = {u: knobs_of(base[u], [{"finetune_steps": max(plan.knob_spaces[u.nn].choices("finetune_steps") or [0])}])
            for u in units}

    def latency(unit: Unit, probe: Probe) -> float:
        return ctx.quick(ctx.build_unit(unit, knobs_of(base[unit], [probe] if probe else [])))[0]

    note(f"aware: timing {sum(len(p) for u, p in probes.items() if u.group is None)} probes on the reference NNs "
         "(untuned, no fine-tuning) to choose the first trial")
    screening = screen(units, probes, latency)

    def feasible(choice: Mapping[Unit, tuple[Probe, ...]]) -> bool:
        candidates: dict[str, Candidate] = {}
        for unit, combo in choice.items():
            candidates.update(ctx.build_unit(unit, knobs_of(full[unit], combo)))
        if any(c.nonfinite_outputs for c in candidates.values()):
            return False
        return ctx.violation("aware", ctx.errors_of(candidates), candidates, region) <= 0

    found: list[tuple[float, dict[Unit, tuple[Probe, ...]]]] = []
    for merged in layouts:
        layout = merged_units(nns, plan.merge_groups, ctx.merge_leads, merged)
        options = {u: [(screening.estimate(u, c), c) for c in combinations(probes[u])] for u in layout}
        joint = [(sum(e for e, _ in parts), {u: c for u, (_, c) in zip(layout, parts, strict=True)})
                 for parts in itertools.product(*options.values())]
        chosen = walk(joint, feasible)
        if chosen is not None:
            found.append((sum(screening.estimate(u, c) for u, c in chosen.items()), chosen))
    if not found:
        note(f"aware: no combination of probes inside the study's bounds within {WALK_BUILDS} builds; "
             "the search starts from the reference")
        return None
    estimate, best = min(found, key=lambda f: f[0])
    params: dict[str, Any] = {"schedule": "sequential", **{g.param: False for g in plan.merge_groups}}
    described = []
    for unit, combo in best.items():
        knobs = knobs_of(full[unit], combo)
        params.update(plan.knob_spaces[unit.nn].params_of(knobs, unit.nn))
        if unit.group is not None:
            params[unit.group.param] = True
        described.append(f"{'+'.join(unit.serves) if unit.group else unit.nn}: "
                         f"{', '.join(f'{k} {v}' for p in combo for k, v in p.items()) or 'as the reference'}")
    note(f"aware: informed first trial {'; '.join(described)} (estimated {estimate:.2f} ms untuned, "
         f"reference {sum(screening.reference_ms[u] for u in merged_units(nns, (), {}, False)):.2f} ms)")
    return params
