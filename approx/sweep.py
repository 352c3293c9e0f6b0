"""Sweeping one knob of one NN: the candidates of a table or a plot, built (or loaded) in turn."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .build import Progress, build
from .candidate import Candidate
from .errors import ApproxError
from .finetune import FinetuneRecipe
from .knobs import Knobs, check_backend
from .target import TargetNN


def knobs_from_space(space: Any, **overrides: Any) -> Knobs:
    """Knobs with the fixed settings of a spec's knob space (importance, round_to, steps, per_layer), then ``overrides``.

    ``space`` is an ``approximations.<nn>`` section (:class:`qaopt.app_spec.KnobSpace`).
    """
    values: dict[str, Any] = {}
    if space is not None and space.pruning is not None:
        p = space.pruning
        values.update(importance=p.importance, round_to=p.round_to, prune_steps=p.steps, per_layer=dict(p.per_layer))
    return Knobs(**{**values, **overrides})


def vary(base: Knobs, knob: str, value: Any, nn_name: str) -> Knobs:
    """``base`` with ``knob`` set to ``value`` (validated: strings from a command line become numbers)."""
    if knob not in Knobs.model_fields:
        raise ApproxError(nn_name, knob, f"no such knob; sweepable knobs are {', '.join(Knobs.model_fields)}")
    try:
        return Knobs.model_validate({**base.model_dump(), knob: value})
    except ValidationError as exc:
        raise ApproxError(nn_name, knob, f"bad value {value!r}: {exc.errors()[0]['msg']}") from exc


def sweep(
    nn_: TargetNN,
    base: Knobs,
    knob: str,
    values: Sequence[Any],
    *,
    cache_dir: str | Path | None = None,
    recipe: FinetuneRecipe = FinetuneRecipe(),
    backend: str | None = None,
    progress: Progress = lambda message: None,
) -> Iterator[Candidate]:
    """Yield the candidate for each value of ``knob`` (every value is checked before the first build)."""
    settings = [vary(base, knob, v, nn_.name) for v in values]
    for knobs in settings:
        knobs.check(nn_.name)
        if backend is not None:
            check_backend(nn_.name, knobs, backend)
    for knobs in settings:
        yield build(nn_, knobs, cache_dir=cache_dir, recipe=recipe, backend=backend, progress=progress)
