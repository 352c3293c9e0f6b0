"""What an approximation pass is, and the registry that lists the passes in order.

A pass (pruning, low-rank factorization, quantization, fine-tuning, or one a team
adds) is one class that declares everything qaopt needs to know about it, in the
spirit of Olive's passes and Optuna's distributions:

- ``name``: its key under ``approximations.<nn>`` in the spec;
- ``Config``: the pydantic model of that spec section (its validation and defaults);
- ``Knobs``: the pydantic model of the knobs it sets on one candidate, each field's
  default being the setting that leaves the NN as it is;
- :meth:`~ApproximationPass.space`: what a trial searches, as Optuna distributions
  (and fixed values), derived from the config and the run's :class:`SearchLimits`;
- :meth:`~ApproximationPass.apply`: how it changes the model;
- :meth:`~ApproximationPass.identity`: what it adds to a candidate's cache key,
  only when it really changes the model.

Passes run in registration order within their stage: ``"float"`` passes reshape
the fp32 model (cached apart, so that every dtype of a pruned NN shares it), then
``"export"`` passes turn it into what runs (a dtype, an int8 graph).
"""

from __future__ import annotations

import math

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from pydantic import AfterValidator, BaseModel, ConfigDict

from qaopt.app_spec.errors import QaoptError

from ..toolchain import OnnxToolchain

if TYPE_CHECKING:
    from torch import nn

    from ..finetune import Distiller
    from ..knobs import Knobs as CandidateKnobs
    from ..target import TargetNN

Stage = Literal["float", "export"]


class PassConfig(BaseModel):
    """Base of a pass's spec section: unknown fields are errors, values never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class PassKnobs(BaseModel):
    """Base of a pass's knobs: every default leaves the NN unchanged."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def Range(kind: type, low: float, high: float | None = None, *, low_open: bool = False, high_open: bool = False) -> Any:
    """A config field ``[lo, hi]`` with ``low <= lo <= hi <= high`` (an open end excludes its bound)."""
    text = f"{low} {'<' if low_open else '<='} lo <= hi" + (f" {'<' if high_open else '<='} {high}" if high is not None else "")

    def check(value: tuple) -> tuple:
        lo, hi = value
        above = lo > low if low_open else lo >= low
        below = high is None or (hi < high if high_open else hi <= high)
        if not (above and lo <= hi and below):
            raise ValueError(f"must be [lo, hi] with {text}, got [{lo}, {hi}]")
        return value

    return Annotated[tuple[kind, kind], AfterValidator(check)]


def grid(distribution: Any) -> list[Any]:
    """The values a searched knob takes: a categorical's choices, a stepped range's points (a range without a step:
    its ends); a fixed knob (not a distribution) takes none."""
    d = distribution
    if isinstance(d, CategoricalDistribution):
        return list(d.choices)
    if isinstance(d, (FloatDistribution, IntDistribution)):
        if d.step is None:
            return [d.low, d.high]
        return [round(d.low + k * d.step, 6) for k in range(int(round((d.high - d.low) / d.step)) + 1)]
    return []


def span(lo: float, hi: float, step: float | None = None) -> Any:
    """The Optuna distribution over ``[lo, hi]`` (integers for integer bounds), or ``lo`` itself when the range is one point.

    A ``step`` that does not divide the range (a profile's cap cuts a spec's range: fine-tuning steps [50, 160] in
    quarters of 27) is made the nearest finer one that does, so both ends stay on the grid; Optuna would otherwise
    move ``hi`` and print a warning on every study it opens.
    """
    if hi <= lo:
        return lo
    if isinstance(lo, int) and isinstance(hi, int):
        width, want = hi - lo, max(1, int(step or 1))
        return IntDistribution(lo, hi, step=max(d for d in range(1, want + 1) if width % d == 0))
    if step is not None:
        step = (hi - lo) / math.ceil((hi - lo) / step - 1e-9)
    return FloatDistribution(lo, hi, step=step)


@dataclass(frozen=True)
class SearchLimits:
    """Caps a run puts on every NN's space (from its profile), and the dtypes its target cannot run.

    ``None`` keeps the spec's own value.
    """

    max_prune_steps: int | None = None
    max_finetune_steps: int | None = None
    max_adapt_steps: int | None = None
    """Cap on the steps that adapt an NN once to a setting every candidate with it shares (:meth:`ApproximationPass.shared`)."""
    excluded_dtypes: tuple[str, ...] = ()
    """Dtypes no backend of the target runs on its device, or that it would only emulate: never searched. The
    composing run decides them, from the backends' declarations (``qaopt.target_fit``)."""


@dataclass
class BuildContext:
    """What a pass may use while it changes a model: the NN, its training data, fine-tuning, progress lines.

    ``recover(model, what)`` runs the next share of the fine-tuning budget after a
    pass damaged the model (a pass that damages declares how often with
    :meth:`ApproximationPass.damage_phases`); ``training_loss(model)`` is the
    distillation loss on one training batch (for gradient-based importance);
    ``ladder(recipe)`` is this NN's :class:`~qaopt.approx.ladder.Ladder` for a recipe,
    shared by every candidate that takes a rung of it.
    """

    nn: TargetNN
    knobs: CandidateKnobs
    distiller: Distiller
    progress: Callable[[str], None]
    phases: int = 0
    onnx: OnnxToolchain | None = None
    recovery: Iterator[int] | None = None
    ladder: Callable[[Any], Any] | None = None

    def recover(self, model: nn.Module, what: str) -> None:
        steps = next(self.recovery, 0) if self.recovery is not None else 0
        self.progress(f"{what}: fine-tuning {steps} steps")
        self.distiller.run(model, steps)

    def training_loss(self, model: nn.Module):
        return self.distiller.loss(model, self.distiller.batch())


@dataclass
class Runnable:
    """What an export pass hands on: the torch module in its dtype, and the ONNX graph that runs instead, if any."""

    module: Any
    onnx_path: Path | None = None


class ApproximationPass:
    """One approximation. Subclass it, set the class attributes, override what applies, and :func:`register_pass` it."""

    name: ClassVar[str]
    """Key of the pass's section under ``approximations.<nn>`` in the spec."""
    Config: ClassVar[type[PassConfig]]
    """The spec section's model."""
    Knobs: ClassVar[type[PassKnobs]]
    """The knobs the pass sets on one candidate (flat names, unique across passes); the first one is swept by ``--knob <name>``."""
    stage: ClassVar[Stage] = "float"
    probe_alone: ClassVar[bool] = False
    """Whether each of the pass's probes is also worth a trial of its own on the reference NNs (each dtype: what
    accuracy-preserving compression tries first), besides being a part of the informed first trials."""

    # ---- search
    def space(self, config: PassConfig | None, limits: SearchLimits, chosen: Any | None) -> dict[str, Any]:
        """The pass's knobs for one trial: an Optuna distribution is searched, any other value is fixed.

        ``config`` is the spec section (``None``: not in the spec, the pass is off).
        ``chosen`` is a :class:`~qaopt.approx.Knobs` with what the passes before this one settled (``None``: give the
        unconditional space, e.g. for a sweep's default values). Knobs left out keep their default.
        """
        return {}

    def settle(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """The pass's knobs once sampled (e.g. a setting that only matters when another is on)."""
        return knobs

    def probes(self, config: PassConfig | None, limits: SearchLimits) -> list[dict[str, Any]]:
        """Settings worth trying alone on the reference NNs before the sampler starts (e.g. each dtype)."""
        return []

    def mildest(self, config: PassConfig | None, limits: SearchLimits) -> dict[str, Any] | None:
        """The searched setting of the pass's first knob nearest its default among those that damage the NN (the
        smallest pruning ratio, the largest input scale below 1), or ``None`` where none does. What approximates
        more errs more, so where this setting, fine-tuned as a trial fine-tunes it, errs too much, every setting
        does: the application-agnostic study then holds the knob at its default (:mod:`qaopt.agnostic`)."""
        knob = next(iter(self.Knobs.model_fields))
        default = self.Knobs.model_fields[knob].default
        values = [v for v in grid(self.space(config, limits, None).get(knob))
                  if v != default and self.damage_phases(self.Knobs(**{knob: v})) > 0]
        return {knob: min(values, key=lambda v: abs(v - default))} if values else None

    # ---- candidate
    def active(self, knobs: Any) -> bool:
        """Whether the knobs make this pass change the model."""
        defaults = self.Knobs()
        return any(getattr(knobs, k) != getattr(defaults, k) for k in self.Knobs.model_fields)

    def identity(self, knobs: Any) -> dict[str, Any]:
        """What the pass adds to a candidate's cache key: its knobs when it changes the model, else nothing."""
        return self.knob_values(knobs) if self.active(knobs) else {}

    def knob_values(self, knobs: Any) -> dict[str, Any]:
        return {k: v for k, v in knobs.model_dump(mode="json").items() if k in self.Knobs.model_fields}

    def check(self, knobs: Any, nn: str, backend: str | None) -> None:
        """Raise :class:`ApproxError` for knobs no model could take (before anything is built)."""

    def model_problems(self, config: PassConfig, target: TargetNN) -> list[tuple[tuple, str]]:
        """What in the spec's section no model of this NN could take (e.g. an input size its architecture rejects),
        as ``(loc within the section, message)``; ``qaopt validate`` places each at its line."""
        return []

    def runnable_on(self, knobs: Any) -> tuple[str, ...] | None:
        """The backends that can run a candidate with these knobs; ``None``: the pass does not restrict them."""
        return None

    def describe(self, knobs: Any) -> dict[str, str]:
        """Report columns: a short label per knob and its value as text."""
        return {k.replace("_", " "): _text(v) for k, v in self.knob_values(knobs).items()}

    # ---- building (float stage)
    def shared(self, knobs: Any) -> bool:
        """Whether the change these knobs make is built once per NN and setting, and shared by every candidate that
        makes it, instead of into each candidate: the builder applies the pass alone to the NN, stores the result, and
        the other float passes start from it (a resolution adapted to its scale once: a ladder, a pruning and a trial's
        fine-tuning then build on that adaptation, and pay for it once). A shared change needs no share of a
        candidate's fine-tuning budget: its :meth:`damage_phases` are 0."""
        return False

    def damage_phases(self, knobs: Any) -> int:
        """How many times the pass damages the model; each is followed by a share of the fine-tuning budget."""
        return 0

    def prepare(self, knobs: Any, ctx: BuildContext) -> None:
        """Runs before any float pass applies (e.g. to split the fine-tuning budget)."""

    def apply(self, model: nn.Module, knobs: Any, ctx: BuildContext) -> nn.Module:
        """Change the fp32 model (in place or not) and return it; a no-op when :meth:`active` is false."""
        return model

    # ---- building (export stage)
    def export(self, runnable: Runnable, knobs: Any, ctx: BuildContext, folder: Path) -> Runnable:
        """Turn the float model into what runs, writing any files into the candidate's ``folder``."""
        return runnable

    def restore(self, runnable: Runnable, knobs: Any, folder: Path) -> Runnable:
        """What :meth:`export` returned, from the files it left in ``folder`` (a candidate loaded from the cache)."""
        return runnable


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_text(v)}" for k, v in value.items()) or "-"
    return str(value)


# ---------------------------------------------------------------- the registry

_REGISTRY: dict[str, ApproximationPass] = {}


def register_pass(cls: type[ApproximationPass]) -> type[ApproximationPass]:
    """Register a pass (usable as a class decorator); it is applied after those registered before it."""
    owners = knob_owners()
    taken = [k for k in cls.Knobs.model_fields if owners.get(k, cls.name) != cls.name]
    if taken:
        raise ValueError(f"approximation pass {cls.name!r}: knob names {taken} already belong to other passes")
    _REGISTRY[cls.name] = cls()
    return cls


def unregister_pass(name: str) -> None:
    """Remove a registered pass (tests register passes of their own)."""
    _REGISTRY.pop(name, None)


def get_pass(name: str) -> ApproximationPass:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise QaoptError(f"no approximation pass named {name!r}; registered: {', '.join(_REGISTRY)}") from None


def passes(stage: Stage | None = None) -> list[ApproximationPass]:
    """The registered passes in order (of sampling, and of application within each stage)."""
    return [p for p in _REGISTRY.values() if stage is None or p.stage == stage]


def knob_owners() -> dict[str, str]:
    """Knob name -> the pass that owns it."""
    return {k: p.name for p in _REGISTRY.values() for k in p.Knobs.model_fields}
