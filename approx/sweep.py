"""Sweeping one knob of one NN: the candidates of a table or a plot, built (or loaded) in turn."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .builder import Progress, build
from .candidate import Candidate
from .finetune import FinetuneRecipe
from .knobs import Knobs
from .passes import OnnxToolchain
from .space import vary
from .target import TargetNN


def sweep(
    nn_: TargetNN,
    base: Knobs,
    knob: str,
    values: Sequence[Any],
    *,
    cache_dir: str | Path | None = None,
    recipe: FinetuneRecipe = FinetuneRecipe(),
    backend: str | None = None,
    onnx: OnnxToolchain | None = None,
    device: str = "cpu",
    progress: Progress = lambda message: None,
) -> Iterator[Candidate]:
    """Yield the candidate for each value of ``knob`` (every value is checked before the first build).

    ``device`` is where fine-tuning (and a ladder's rungs) train. ``base`` is usually ``KnobSpace.from_section(spec.knobs_for(nn)).base(...)``: the spec's fixed settings.
    """
    settings = [vary(base, knob, v, nn_.name) for v in values]
    for knobs in settings:
        knobs.check(nn_.name, backend)
    for knobs in settings:
        yield build(nn_, knobs, cache_dir=cache_dir, recipe=recipe, backend=backend, onnx=onnx, device=device,
                    progress=progress)
