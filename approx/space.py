"""An NN's knob space: its ``approximations.<nn>`` section read by the registered passes.

Everything about the search that depends on the approximations is derived here
from the registry, so a new pass needs no edit elsewhere: validating the spec
section (:func:`validate_section`), sampling one trial's knobs with Optuna
(:meth:`KnobSpace.sample`), the trial parameters of a known setting
(:meth:`KnobSpace.params_of`), the settings worth probing first
(:meth:`KnobSpace.probes`), and the fixed base of a sweep (:meth:`KnobSpace.base`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from pydantic import ValidationError

from qaopt.app_spec.loader import fields_at

from .errors import ApproxError
from .knobs import Knobs
from .passes import PassConfig, SearchLimits, get_pass, knob_owners, passes

Section = Mapping[str, Any]
"""One ``approximations.<nn>`` section as the spec holds it: pass name -> its raw settings (``None``: off)."""


def validate_section(section: Section | None) -> tuple[dict[str, PassConfig], list[dict[str, Any]]]:
    """Each named pass's config, and pydantic-style errors (``loc`` starts at the pass name) for the rest."""
    configs: dict[str, PassConfig] = {}
    errors: list[dict[str, Any]] = []
    names = [p.name for p in passes()]
    for name, raw in (section or {}).items():
        if name not in names:
            errors.append({"type": "extra_forbidden", "loc": (name,), "msg": "unknown approximation pass", "input": raw})
            continue
        if raw is None:
            continue
        try:
            configs[name] = get_pass(name).Config.model_validate(raw)
        except ValidationError as exc:
            errors += [{**e, "loc": (name, *e["loc"])} for e in exc.errors()]
    return configs, errors


def section_fields(loc: tuple) -> list[str]:
    """For 'did you mean': the valid names at ``loc`` in a section (the pass names at its top)."""
    if not loc:
        return [p.name for p in passes()]
    owner = {p.name: p for p in passes()}.get(str(loc[0]))
    return fields_at(owner.Config, loc[1:]) if owner is not None else []


def canonical_section(configs: Mapping[str, PassConfig]) -> dict[str, dict[str, Any] | None]:
    """The section in full: every registered pass, its settings with defaults filled, ``None`` for one left out."""
    return {p.name: configs[p.name].model_dump(mode="json") if p.name in configs else None for p in passes()}


def suggest(trial: Any, name: str, distribution: BaseDistribution) -> Any:
    """``trial.suggest_*`` for one distribution (stepped floats rounded: 0.35000000000000003 and 0.35 share a candidate)."""
    d = distribution
    if isinstance(d, FloatDistribution):
        value = trial.suggest_float(name, d.low, d.high, step=d.step, log=d.log)
        return round(value, 6) if d.step is not None else value
    if isinstance(d, IntDistribution):
        return trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
    if isinstance(d, CategoricalDistribution):
        return trial.suggest_categorical(name, list(d.choices))
    raise TypeError(f"unsupported distribution {type(d).__name__}")


@dataclass(frozen=True)
class KnobSpace:
    """What is searched for one NN: the configs of the passes its spec section names, under a run's limits."""

    configs: Mapping[str, PassConfig] = field(default_factory=dict)
    limits: SearchLimits = SearchLimits()
    held: frozenset[str] = frozenset()
    """Knobs held at their default (the reference's setting) instead of searched (:meth:`holding`)."""

    @classmethod
    def from_section(cls, section: Section | None, limits: SearchLimits = SearchLimits(), nn: str = "-") -> KnobSpace:
        configs, errors = validate_section(section)
        if errors:
            e = errors[0]
            raise ApproxError(nn, ".".join(map(str, e["loc"])), e["msg"])
        return cls(configs, limits)

    def _space(self, p, chosen: Knobs | None) -> dict[str, Any]:
        space = p.space(self.configs.get(p.name), self.limits, chosen)
        if not self.held & space.keys():
            return space
        defaults = Knobs()
        return {k: getattr(defaults, k) if k in self.held else v for k, v in space.items()}

    def holding(self, knobs: Iterable[str]) -> KnobSpace:
        """This space with ``knobs`` held at their defaults: a trial sets them as the reference NN has them, every
        pass's other knobs as before (for a study that knows no setting of a knob can meet its bound,
        :mod:`qaopt.agnostic`)."""
        return replace(self, held=self.held | frozenset(knobs))

    def mildest(self) -> dict[str, dict[str, Any]]:
        """Each damaging pass's least damaging searched setting (pass name -> its knob's value; see
        :meth:`~qaopt.approx.passes.ApproximationPass.mildest`), for the knobs not held."""
        found = {p.name: p.mildest(self.configs[p.name], self.limits) for p in passes() if p.name in self.configs}
        return {name: m for name, m in found.items() if m is not None and not set(m) & self.held}

    def offers(self, knob: str, chosen: Knobs) -> bool:
        """Whether a trial whose other knobs are ``chosen`` sets ``knob``: a pass may offer its knobs only to some
        (fine-tuning only to an NN that another pass damaged), and :meth:`sample` leaves the rest at their defaults."""
        return knob in self._space(get_pass(knob_owners()[knob]), chosen)

    def sample(self, trial: Any, prefix: str, seed: int = 0) -> Knobs:
        """One trial's knobs, each searched knob suggested to ``trial`` as ``<prefix>.<knob>``, pass by pass."""
        chosen: dict[str, Any] = {}
        for p in passes():
            values = {
                knob: suggest(trial, f"{prefix}.{knob}", v) if isinstance(v, BaseDistribution) else v
                for knob, v in self._space(p, Knobs(**chosen, seed=seed)).items()
            }
            chosen.update(p.settle(values))
        return Knobs(**chosen, seed=seed)

    def params_of(self, knobs: Knobs, prefix: str) -> dict[str, Any]:
        """The trial parameters under which :meth:`sample` returns ``knobs`` (to enqueue a known setting)."""
        return {f"{prefix}.{knob}": getattr(knobs, knob) for p in passes()
                for knob, v in self._space(p, knobs).items() if isinstance(v, BaseDistribution)}

    def probes(self, alone: bool = False) -> list[dict[str, Any]]:
        """Settings worth trying on the reference NN before sampling (each dtype, each input scale, ...); ``alone``:
        only those of passes whose probes are worth a trial of their own (``probe_alone``)."""
        return [probe for p in passes() if p.probe_alone or not alone
                for probe in p.probes(self.configs.get(p.name), self.limits)]

    def base(self, **overrides: Any) -> Knobs:
        """Knobs with the spec's fixed settings (importance, round_to, steps, ...) and the rest off, then ``overrides``."""
        fixed: dict[str, Any] = {}
        for p in passes():
            if p.name in self.configs:
                fixed.update({k: v for k, v in self._space(p, None).items() if not isinstance(v, BaseDistribution)})
        return Knobs(**{**fixed, **overrides})

    def choices(self, knob: str) -> list[Any]:
        """The values a sweep of ``knob`` takes by default: its searched range (5 points, 3 for integers),
        its choices, or its one fixed value; its pass's default section stands in for one the spec leaves out."""
        p = get_pass(knob_owners()[knob])
        d = p.space(self.configs.get(p.name) or p.Config(), self.limits, None).get(knob)
        if isinstance(d, CategoricalDistribution):
            return list(d.choices)
        if isinstance(d, FloatDistribution):
            return [round(d.low + (d.high - d.low) * i / 4, 3) for i in range(5)]
        if isinstance(d, IntDistribution):
            return sorted({int(d.low + (d.high - d.low) * i / 2) for i in range(3)})
        return [] if d is None else [d]


def vary(base: Knobs, knob: str, value: Any, nn_name: str) -> Knobs:
    """``base`` with ``knob`` set to ``value`` (validated: strings from a command line become numbers)."""
    if knob not in knob_owners():
        raise ApproxError(nn_name, knob, f"no such knob; sweepable knobs are {', '.join(knob_owners())}")
    try:
        return Knobs.model_validate({**base.model_dump(), knob: value})
    except ValidationError as exc:
        raise ApproxError(nn_name, knob, f"bad value {value!r}: {exc.errors()[0]['msg']}") from exc

