"""The stage contract of ``qaopt optimize`` and the small runner that drives it.

A stage is one class in one file: its ``name`` (the key its artifact is handed on under),
the names of the stages whose artifacts it reads (``inputs``), what it writes
(``artifact``, for the docs and ``docs/architecture.md``), and two methods:

- ``load(run, inputs)``: the stage's stored artifact when it is there and still valid
  for this plan, else ``None`` (most stages keep their expensive parts in content-keyed
  caches and return ``None`` here: running them again reads those back);
- ``run(run, inputs)``: compute the artifact.

:func:`register_stage` adds a stage (a plugin module named in the spec's ``plugins`` may
register its own, as backends and passes do); :func:`run_stages` orders the registered
stages by their inputs, loads or runs each, and brackets each with
:class:`~qaopt.events.StageStarted` / :class:`~qaopt.events.StageFinished` events. A stage
never sees the spec: it gets the :class:`~qaopt.plan.RunPlan`, its inputs, and the run's
shared services (:class:`StageRun`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
from typing import Any, ClassVar, Protocol

from optuna.storages import BaseStorage

from qaopt.app_spec import QaoptError
from qaopt.events import Events, StageEvents, StageFinished, StageStarted, StageTimes
from qaopt.plan import RunPlan


@dataclass(frozen=True)
class StageRun:
    """What every stage of one run shares: the plan, the event stream (and the stage times it collected so far),
    the executor of simulator runs, the study storage."""

    plan: RunPlan
    events: Events
    times: StageTimes
    executor: Executor | None
    storage: BaseStorage

    def emitter(self, stage: str) -> StageEvents:
        return self.events.for_stage(stage)


class Stage(Protocol):
    """One step of a run with one artifact (see the module docstring)."""

    name: ClassVar[str]
    inputs: ClassVar[tuple[str, ...]]
    artifact: ClassVar[str]

    def wanted(self, run: StageRun, inputs: Mapping[str, Any]) -> bool:
        """Whether this run needs the stage at all (pruning ladders: only when an NN has one); if not, its
        artifact is ``None`` and it emits nothing."""
        ...

    def total(self, run: StageRun, inputs: Mapping[str, Any]) -> float | None:
        """How many steps its progress bar counts (``None``: not known before it starts)."""
        ...

    def load(self, run: StageRun, inputs: Mapping[str, Any]) -> Any | None:
        ...

    def run(self, run: StageRun, inputs: Mapping[str, Any]) -> Any:
        ...


class BaseStage:
    """Defaults for a stage: always wanted, no known total, nothing to load (its caches make ``run`` cheap on resume)."""

    inputs: ClassVar[tuple[str, ...]] = ()
    artifact: ClassVar[str] = "none"

    def wanted(self, run: StageRun, inputs: Mapping[str, Any]) -> bool:
        return True

    def total(self, run: StageRun, inputs: Mapping[str, Any]) -> float | None:
        return None

    def load(self, run: StageRun, inputs: Mapping[str, Any]) -> Any | None:
        return None


class PipelineError(QaoptError):
    """The registered stages do not form a pipeline (a missing input, a cycle, a name taken twice)."""


_STAGES: dict[str, type[Stage]] = {}


def register_stage(stage: type[Stage]) -> type[Stage]:
    """Add a stage class to every later run (usable as a class decorator); a name may be registered once."""
    name = getattr(stage, "name", None)
    if not isinstance(name, str) or not name:
        raise PipelineError(f"{stage.__qualname__}: a stage needs a non-empty class attribute 'name'")
    if name in _STAGES and _STAGES[name] is not stage:
        raise PipelineError(f"stage {name!r} is registered already (by {_STAGES[name].__module__}); choose another "
                            "name")
    _STAGES[name] = stage
    return stage


def unregister_stage(name: str) -> None:
    """Remove a stage (tests, a plugin undoing itself)."""
    _STAGES.pop(name, None)


def registered_stages() -> dict[str, type[Stage]]:
    return dict(_STAGES)


def order(stages: Sequence[type[Stage]]) -> list[type[Stage]]:
    """``stages`` in an order where every stage follows its inputs: the earliest registered ready stage first,
    so the order is the same on every run."""
    by_name = {s.name: s for s in stages}
    for s in stages:
        missing = [i for i in s.inputs if i not in by_name]
        if missing:
            raise PipelineError(f"stage {s.name!r} ({s.__module__}) reads {', '.join(map(repr, missing))}, which no "
                                f"registered stage makes; registered: {', '.join(by_name)}")
    try:
        TopologicalSorter({s.name: s.inputs for s in stages}).prepare()
    except CycleError as exc:
        raise PipelineError(f"stages depend on each other in a circle: {' -> '.join(exc.args[1])}") from None
    placed: set[str] = set()
    out: list[type[Stage]] = []
    pending = list(stages)
    while pending:
        ready = next(s for s in pending if placed.issuperset(s.inputs))
        pending.remove(ready)
        placed.add(ready.name)
        out.append(ready)
    return out


def run_stages(run: StageRun, stages: Sequence[type[Stage]] | None = None) -> dict[str, Any]:
    """Load or run every stage (default: all registered) in dependency order; each stage's artifact by name."""
    artifacts: dict[str, Any] = {}
    for cls in order(list(registered_stages().values()) if stages is None else list(stages)):
        stage = cls()
        inputs = {name: artifacts[name] for name in cls.inputs}
        if not stage.wanted(run, inputs):
            artifacts[cls.name] = None
            continue
        run.events.emit(StageStarted(cls.name, stage.total(run, inputs)))
        start = time.perf_counter()
        artifact = stage.load(run, inputs)
        resumed = artifact is not None
        if not resumed:
            artifact = stage.run(run, inputs)
        artifacts[cls.name] = artifact
        run.events.emit(StageFinished(cls.name, time.perf_counter() - start, resumed))
    return artifacts
