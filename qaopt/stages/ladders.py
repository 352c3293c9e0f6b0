"""The pruning-ladders stage: every NN's ladder built before the first trial asks for one of its rungs.

Artifact: ``ladders.json`` in the run folder, each NN's rungs (ratio, error, MACs,
parameters, fine-tuning steps and seconds), the run's ladder table. The rungs
themselves live in the cache under their content key (:mod:`qaopt.approx.ladder`),
shared by both studies, every worker and later runs; a killed stage resumes at the
last stored rung.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from qaopt.app_spec.store import write_json
from qaopt.approx import Knobs, Rung, ladder_of
from qaopt.approx.passes.pruning import PruningConfig
from qaopt.search import SearchContext, knob_space

from . import StageBar

LADDERS_FILE = "ladders.json"
LADDERS_KIND, LADDERS_VERSION = "qaopt.ladders", 1


def ladder_tops(ctx: SearchContext) -> dict[str, Knobs]:
    """Each laddered NN's knobs at the deepest rung its search space reaches (NNs pruned from scratch are left out)."""
    tops = {}
    for name in ctx.nns:
        space = knob_space(ctx, name)
        config = space.configs.get("pruning")
        if isinstance(config, PruningConfig) and config.ladder is not None and config.ratios()[1] > 0:
            tops[name] = space.base(prune_ratio=config.ratios()[1], seed=ctx.spec.search.seed)
    return tops


def build_ladders(ctx: SearchContext, run_dir: Path, bar: StageBar, say: Callable[[str], None]) -> dict[str, list[Rung]]:
    """Build (or find) every rung of every laddered NN on the training device, and write the run's ladder table."""
    tops = ladder_tops(ctx)
    plan = {name: round(k.prune_ratio / k.ladder_step) for name, k in tops.items()}
    bar.update(completed=0, total=sum(plan.values()))
    tables: dict[str, list[Rung]] = {}
    for name, knobs in tops.items():
        ladder = ladder_of(ctx.nns[name], knobs, cache_dir=ctx.cache_dir, device=ctx.train_device,
                           progress=lambda message, _name=name: bar.update(description=f"{_name}: {message}"))
        for k in range(1, plan[name] + 1):
            if ladder.stored(k) is None:
                ladder.model(k)
                say(f"{name}: ladder rung {k} of {plan[name]} built on {ctx.train_device} "
                    f"(error {ladder.stored(k).error:.4g})")
            bar.update(advance=1)
        tables[name] = ladder.rungs()[: plan[name]]
    if tables:
        write_json(run_dir / LADDERS_FILE, LADDERS_KIND, LADDERS_VERSION,
                   {name: [asdict(r) for r in rungs] for name, rungs in tables.items()})
    return tables
