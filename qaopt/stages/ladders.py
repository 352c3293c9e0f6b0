"""The pruning-ladders stage: every NN's ladder built before the first trial asks for one of its rungs.

Artifact: ``ladders.json`` in the run folder, each NN's rungs (ratio, error, MACs,
parameters, fine-tuning steps and seconds), the run's ladder table. The rungs
themselves live in the cache under their content key (:mod:`qaopt.approx.ladder`),
shared by both studies, every worker and later runs; a killed stage resumes at the
last stored rung.

A run resumed past the agnostic search (every unit's study holds its trials) reads the
table back instead: building every rung up front serves the first search, which walks
the ladders; the rungs were all built once for this run, and what is left (the aware
study's remaining trials, validation) builds the few rungs it takes when it takes them.
On a fresh machine, where the cache is empty, that is the difference between training
every rung of every ladder again and training the ones the run still uses (on the
ResNet-18 spec's device runs, the ladders took about four minutes of a thirty-minute
session).
"""

from __future__ import annotations

from dataclasses import asdict

from qaopt.agnostic import units_finished
from qaopt.app_spec.store import read_json, write_json
from qaopt.approx import Knobs, Rung, ladder_of
from qaopt.approx.passes.pruning import PruningConfig
from qaopt.events import StageEvents
from qaopt.pipeline import BaseStage, StageRun, register_stage
from qaopt.plan import RunPlan
from qaopt.search import SearchContext
from qaopt.stages.reference import Reference

LADDERS_FILE = "ladders.json"
LADDERS_KIND, LADDERS_VERSION = "qaopt.ladders", 1


def ladder_tops(plan: RunPlan) -> dict[str, Knobs]:
    """Each laddered NN's knobs at the deepest rung its search space reaches (NNs pruned from scratch are left out)."""
    tops = {}
    for name, space in plan.knob_spaces.items():
        config = space.configs.get("pruning")
        if isinstance(config, PruningConfig) and config.ladder is not None and config.ratios()[1] > 0:
            tops[name] = space.base(prune_ratio=config.ratios()[1], seed=plan.seed)
    return tops


def build_ladders(ctx: SearchContext, events: StageEvents) -> dict[str, list[Rung]]:
    """Build (or find) every rung of every laddered NN on the training device, and write the run's ladder table."""
    plan = ctx.plan
    tops = ladder_tops(plan)
    steps = {name: round(k.prune_ratio / k.ladder_step) for name, k in tops.items()}
    done = 0
    events.progress(completed=0, total=sum(steps.values()))
    tables: dict[str, list[Rung]] = {}
    for name, knobs in tops.items():
        ladder = ladder_of(ctx.nns[name], knobs, cache_dir=ctx.cache_dir, recipe=plan.finetune,
                           device=plan.train_device,
                           progress=lambda message, _name=name: events.progress(description=f"{_name}: {message}"))
        for k in range(1, steps[name] + 1):
            if ladder.stored(k) is None:
                ladder.model(k)
                events.note(f"{name}: ladder rung {k} of {steps[name]} built on {plan.train_device} "
                            f"(error {ladder.stored(k).error:.4g})")
            done += 1
            events.progress(completed=done)
        tables[name] = ladder.rungs()[: steps[name]]
    if tables:
        write_json(plan.run_dir / LADDERS_FILE, LADDERS_KIND, LADDERS_VERSION,
                   {name: [asdict(r) for r in rungs] for name, rungs in tables.items()})
    return tables


@register_stage
class LaddersStage(BaseStage):
    """Every laddered NN's pruning ladder, built before the first trial asks for one of its rungs."""

    name = "pruning ladders"
    inputs = ("reference NNs",)
    artifact = f"{LADDERS_FILE} (run folder); the rungs in the approx cache"

    def wanted(self, run: StageRun, inputs) -> bool:
        return bool(ladder_tops(run.plan))

    def load(self, run: StageRun, inputs) -> dict[str, list[Rung]] | None:
        """The run folder's table, nothing built, once the agnostic search is done (see the module docstring)."""
        table = read_json(run.plan.run_dir / LADDERS_FILE, LADDERS_KIND, LADDERS_VERSION)
        if table is None or set(table) != set(ladder_tops(run.plan)):
            return None
        if not units_finished(inputs["reference NNs"].ctx, run.storage):
            return None
        run.emitter(self.name).note("the agnostic search is done: the ladders are not built again up front; what "
                                    "is left builds the rungs it takes")
        return {name: [Rung(**r) for r in rungs] for name, rungs in table.items()}

    def run(self, run: StageRun, inputs) -> dict[str, list[Rung]]:
        reference: Reference = inputs["reference NNs"]
        return build_ladders(reference.ctx, run.emitter(self.name))
