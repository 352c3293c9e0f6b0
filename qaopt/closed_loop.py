"""Closed-loop validation: the approximated NNs themselves drive the application.

The region was charted with *injected* errors; a real pruned or quantized NN errs
in its own way (bias, correlation over frames, failure on particular scenes). So a
configuration is accepted only after the application ran with the real NNs in the
loop (:meth:`qaopt.calibrate.Application.evaluate_perception`) over many seeds and
met its QoS goal at the spec's confidence, and the report says how often the
region's prediction agreed.

The runs go in blocks through the seed-block engine that calibration uses
(:func:`qaopt.calibrate.blocks.run_blocks`); on an executor (:mod:`qaopt.executor`) several
blocks run at once and are consumed in block order with the same stopping rule, so the
verdict and the runs counted are those of one worker. With a :class:`ValidationBlocks`
cache each finished block is kept on disk: a killed validation resumes after its last
finished block, and a longer validation of the same NNs (the validation stage after an
in-search check) reuses the blocks a shorter one ran.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from qaopt.app_spec import content_hash, store
from qaopt.application import check_method
from qaopt.calibrate import AcceptanceTest, Application, Perception, QoSGoal, SequentialTest, Verdict
from qaopt.calibrate.app_calls import ApplicationFault, Outcome, RunLimits
from qaopt.calibrate.blocks import BlockCache, Given, run_blocks, workers_of
from qaopt.calibrate.protocols import records_problem
from qaopt.executor import run_perception_block, run_perception_seeds
from qaopt.result import RunMetric, Validation, ValidationPower

VALIDATION_SEED_BASE = 5_000_000
"""The seeds that select: the closed-loop checks during the search and the validation of the front, which
picks the configuration. They are disjoint from calibration's and from the seeds simulators use for their
NNs' training and validation data (CropFollow's validation drives use 1,000,000 + ...), so a validation
run never replays a field the NNs were measured on."""
ACCEPTANCE_SEED_BASE = 10_000_000
"""The seeds that accept: the chosen configuration (and the agnostic one) run again on seeds that no check
or validation of the run used, so the verdict a user reads is not the one that chose (a configuration
picked because it passed some seeds is not tested on those same seeds). Past the selection seeds by more
than any run count allows (2,000,000 runs), and past the fields of the error data's drives (on-policy
7,000,000 on, stress strata 8,000,000 on), so an accepting run never replays a field an NN's error was
measured on."""


@dataclass(frozen=True)
class BlockProgress:
    """Reported after every block of validation runs: runs done of those planned, failures, the verdict so far."""

    runs: int
    planned: int
    failures: int
    verdict: str


POWER_RATES = (0.01, 0.02)
"""True failure rates, beside the test's powered rate and the goal's, at which a run's report gives validation's
chance of acceptance (reference-like NNs fail 1-2 % of CropFollow's runs)."""


def validation_power(test: AcceptanceTest, runs: int, rates: Sequence[float] = POWER_RATES) -> ValidationPower:
    """How strict validation capped at ``runs`` is at ``test``'s goal (:class:`~qaopt.result.ValidationPower`)."""
    sequential = SequentialTest.of(test, runs)
    at = sorted({*rates, sequential.powered_rate, sequential.max_failure_rate})
    return ValidationPower(runs=sequential.cap, tolerated=sequential.tolerated,
                           max_failure_rate=test.max_failure_rate, confidence=test.confidence,
                           powered_rate=sequential.powered_rate, line=sequential.power_line(),
                           accept_probability={f"{r:g}": round(sequential.operating(r)[0], 4) for r in at},
                           expected_runs={f"{r:g}": round(sequential.operating(r)[2], 1) for r in at})


def replay(passed: Sequence[bool], test: AcceptanceTest, runs: int,
           first: Collection[int] = ()) -> tuple[int, int, Verdict]:
    """What :func:`validate_closed_loop` decides on recorded runs (``passed``, in seed order), without running them:
    the runs it would spend, their failures, the verdict; ``first`` are run indices whose blocks run first (its
    ``first_seeds``). Scores the closed-loop checks offline on recorded ground truth (``benchmarks/fidelity.py``)."""
    sequential = SequentialTest.of(test, min(runs, len(passed)))
    done = failures = 0
    verdict = Verdict.UNDECIDED
    for seeds in validation_blocks(sequential, 0, first=first):
        done += len(seeds)
        failures += sum(not passed[s] for s in seeds)
        verdict, stop = sequential.decide(failures, done)
        if stop:
            break
    return done, failures, verdict


def validate_closed_loop(
    evaluator: Application,
    nns: Mapping[str, Perception],
    goal: QoSGoal,
    test: AcceptanceTest,
    runs: int,
    *,
    trial: int | None,
    region_predicted_valid: bool,
    seed_base: int = VALIDATION_SEED_BASE,
    threads: int = 1,
    executor: Executor | None = None,
    workers: int | None = None,
    remote: Callable[[], Application] | None = None,
    on_block: Callable[[BlockProgress], None] | None = None,
    cache: BlockCache[list[Mapping[str, float]]] | None = None,
    limits: RunLimits = RunLimits(),
    first_seeds: Collection[int] = (),
) -> Validation:
    """Run seeded closed-loop episodes with ``nns`` until the sequential test decides, at most ``runs`` of them.

    ``test`` is the spec's acceptance statistics; the closed-loop test is :class:`~qaopt.calibrate.SequentialTest`
    at its goal, capped at ``runs`` (at most ``test.max_trials``). Episodes run in blocks, one between two looks of
    that test: it accepts, rejects, or stops once accepting is out of reach within the cap, so a clean
    configuration stops at the fewest runs that accept and a failure ends a configuration only when no later run
    could accept it. ``threads`` is the evaluator's ``render_threads``.

    With ``executor``, up to ``workers`` tasks (default: the executor's) run at once, each a slice of a block
    (:data:`RUN_CHUNK` runs in lock-step, one ``evaluate_perception`` call) on a worker that builds the
    application with ``remote()`` (a picklable factory; default: ``evaluator`` pickled) and receives ``nns``
    pickled (:class:`qaopt.executor.ShippedNN`); outcomes are consumed in block order, so the result does not depend
    on the workers. ``on_block`` sees the progress after every block. ``cache`` (a :class:`ValidationBlocks` of
    these NNs) keeps every finished block and serves those it holds without running them. ``limits`` bound each
    call of the application; one that raises, hangs or returns garbage stops the validation with
    :class:`~qaopt.calibrate.app_calls.ApplicationFault` and its block is not stored. The blocks holding any of
    ``first_seeds`` (seeds on which other configurations failed) run first: a configuration that fails the same
    scene stops sooner. Running hard scenes first can only make acceptance rarer (the runs seen before a verdict
    hold more of them than a random sample), so the test's bound on accepting a bad configuration still holds.
    """
    check_method(evaluator, "evaluate_perception")
    sequential = SequentialTest.of(test, runs)
    records: list[Mapping[str, float]] = []
    seeds_run: list[int] = []
    failures = 0
    verdict = Verdict.UNDECIDED
    where = f"closed-loop validation of {'the reference NNs' if trial is None else f'trial {trial}'}"
    planned = validation_blocks(sequential, seed_base, first=first_seeds)
    blocks = run_blocks(
        planned,
        partial(run_perception_seeds, evaluator, dict(nns), limits, goal.metric, render_threads=threads),
        partial(_joined, where), executor=executor, width=workers_of(executor, workers), chunk=RUN_CHUNK,
        remote=partial(run_perception_block, remote if remote is not None else Given(evaluator), dict(nns), limits,
                       goal.metric, render_threads=threads), cache=cache)
    try:
        for seeds, block in zip(planned, blocks):
            records += block
            seeds_run += seeds
            failures += sum(not goal.passes(r[goal.metric]) for r in block)
            verdict, stop = sequential.decide(failures, len(records))
            if on_block is not None:
                on_block(BlockProgress(len(records), sequential.cap, failures, verdict.value))
            if stop:
                break
    finally:
        blocks.close()
    return Validation(
        trial=trial,
        runs=len(records),
        passes=len(records) - failures,
        failures=failures,
        verdict=verdict.value,
        accepted=verdict == Verdict.VALID,
        region_predicted_valid=region_predicted_valid,
        qos_metric_mean=float(np.mean([r[goal.metric] for r in records])),
        seed_base=seed_base,
        **run_metrics(records, seeds_run, goal),
    )


RUN_CHUNK = 1
"""Closed-loop runs per task. The acceptance test decides a block of ``min_trials`` runs at a time, but a
block of 8 on 16 workers would leave half of them idle: each block is split into tasks of this many
runs, the same split whatever the number of workers, so runs and verdicts do not depend on it. One run
per task costs no more CPU than a batch of them (``benchmarks/validation_chunking.py``)."""


def validation_blocks(test: SequentialTest, seed_base: int, first: Collection[int] = ()) -> list[list[int]]:
    """The seeds of ``test``'s runs in blocks, one between two of its looks, those holding any seed of ``first``
    moved ahead of the others. Blocks keep their seeds whatever their order, so each block's cached runs are found
    again."""
    edges = (0, *test.looks)
    blocks = [list(range(seed_base + a, seed_base + b)) for a, b in zip(edges[:-1], edges[1:])]
    early = set(first)
    return sorted(blocks, key=lambda seeds: early.isdisjoint(seeds))


VALIDATION_BLOCKS_VERSION = 1
"""Version of a stored block of validation runs (its records, one per seed)."""


@dataclass(frozen=True)
class ValidationBlocks:
    """Blocks of closed-loop runs of one configuration on disk: :func:`validate_closed_loop`'s ``cache``.

    One closed-loop run costs seconds, so a block is kept as soon as it finishes, under the
    key of a whole validation (:func:`qaopt.stages.validation.validate_configuration`) with the
    block's seeds in place of the number of runs: what ran is reused by a resumed validation or
    one with more runs. A stored block without one finite QoS ``metric`` per seed reads as absent.
    """

    folder: Path
    context: str
    metric: str

    @classmethod
    def of(cls, cache_dir: str | Path, candidates: Mapping[str, str], evaluation_key: str,
           goal: QoSGoal) -> ValidationBlocks:
        """The blocks of the NNs ``candidates`` (NN name -> candidate key) in the application whose simulator and
        QoS goal hash to ``evaluation_key`` (:attr:`qaopt.plan.BoundApplication.evaluation_key`)."""
        return cls(Path(cache_dir) / "optimize" / "validation" / "blocks",
                   content_hash("validation", dict(candidates), evaluation_key), goal.metric)

    def _path(self, seeds: Sequence[int]) -> Path:
        return self.folder / f"{content_hash(self.context, list(seeds))}.json"

    def get(self, seeds: Sequence[int]) -> list[Mapping[str, float]] | None:
        records = store.read_json(self._path(seeds), type(self).__name__, VALIDATION_BLOCKS_VERSION)
        return None if records_problem(records, seeds, self.metric) else records

    def put(self, seeds: Sequence[int], result: list[Mapping[str, float]]) -> None:
        """Stores the records with numpy scalars as plain numbers: an integer stays one (a count, for the report)."""
        plain = [{k: v.item() if isinstance(v, np.generic) else v for k, v in r.items()} for r in result]
        store.write_json(self._path(seeds), type(self).__name__, VALIDATION_BLOCKS_VERSION, plain)


def _joined(where: str, _seeds: list[int], tasks: list[Outcome]) -> list[Mapping[str, float]]:
    """A block's records: its tasks' records in seed order; :class:`ApplicationFault` for the first task that failed."""
    for task in tasks:
        if task.failure is not None:
            raise ApplicationFault.raised(task.failure, where)
    return [r for task in tasks for r in task.result]


def run_metrics(records: list[Mapping[str, float]], seeds: Sequence[int], goal: QoSGoal) -> dict:
    """Each metric's mean, its value in the worst run, and a total for counts; the worst run's seed and the failed
    runs' seeds (``seeds``: each record's).

    A metric is a count when the evaluator reports it as an integer (collisions), or it is
    the QoS metric with a ``max`` and whole, non-negative values in every run (crashes as
    0/1): their totals say how many events the runs had. Other metrics (distances, gaps,
    rates) are averaged: a sum of them means nothing. The worst run is the one whose QoS
    metric is furthest past (or nearest to) the goal.
    """
    if not records:
        return {"metrics": {}, "worst_seed": None, "failed_seeds": []}

    def shortfall(r: Mapping[str, float]) -> float:
        v = float(r[goal.metric])
        return max(v - goal.max if goal.max is not None else -np.inf, goal.min - v if goal.min is not None else -np.inf)

    worst = max(range(len(records)), key=lambda i: shortfall(records[i]))

    def is_count(name: str) -> bool:
        values = [r[name] for r in records]
        if all(isinstance(v, (int, np.integer)) for v in values):
            return True
        return name == goal.metric and goal.max is not None and all(float(v).is_integer() and v >= 0 for v in values)

    metrics = {
        name: RunMetric(mean=float(np.mean([r[name] for r in records])), worst_run=float(records[worst][name]),
                        total=float(sum(r[name] for r in records)) if is_count(name) else None)
        for name in records[0]
    }
    failed = [seed for seed, r in zip(seeds, records) if not goal.passes(r[goal.metric])]
    return {"metrics": metrics, "worst_seed": seeds[worst], "failed_seeds": failed}
