"""The validation stage: the fastest configurations of the aware front run closed-loop with their real NNs.

Each configuration's validation is cached under the key of its candidates and their bytes, the
number of runs, the application and the seeds, so a resumed run, or the agnostic
study proposing the same NNs, spends nothing on it again, while NNs rebuilt into other
bytes under the same knobs (GPU fine-tuning is not bitwise reproducible) run again: a
verdict is about the bytes that ran. A configuration that
fails closed-loop becomes evidence against its error point (``closed_loop.json``,
see :mod:`qaopt.stages.region`): the region this run uses is rebuilt with it, and
once the runs at that point decide it invalid, by monotonicity every front configuration
with errors at least as large is skipped without spending runs on it.

The in-search closed-loop checks (:mod:`qaopt.stages.checks`) run configurations through
:func:`validate_configuration` too, with fewer runs, and record what failed with
:func:`with_validation`, the one place closed-loop runs become evidence.

Selection and acceptance use different seeds. The checks and the front's validation run on the
selection seeds (:data:`~qaopt.closed_loop.VALIDATION_SEED_BASE` on) and choose a configuration;
the chosen one then runs again on fresh seeds (:data:`~qaopt.closed_loop.ACCEPTANCE_SEED_BASE` on)
that nothing before used, and that verdict accepts it (``Result.acceptance``). A configuration
chosen because it passed some seeds is never accepted on those same seeds. The agnostic
configuration, which no closed-loop run chose, runs on the acceptance seeds as well.

The runs of a configuration go through the run's executor (:mod:`qaopt.executor`):
its NNs are shipped to the workers by value (:class:`~qaopt.executor.ShippedNN`) and
each worker builds the application from the spec; the verdict is the same for any
number of workers. After each block a :class:`~qaopt.events.RunBlock` event says the runs
done of those planned and the verdict so far; each finished block is kept on disk
(:class:`~qaopt.closed_loop.ValidationBlocks`), so a killed validation resumes after it.
"""

from __future__ import annotations

from collections.abc import Collection
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qaopt.app_spec import content_hash, store
from qaopt.calibrate import SequentialTest
from qaopt.closed_loop import (
    ACCEPTANCE_SEED_BASE,
    VALIDATION_SEED_BASE,
    BlockProgress,
    ValidationBlocks,
    validate_closed_loop,
)
from qaopt.events import RunBlock, StageEvents
from qaopt.executor import ShippedNN
from qaopt.pipeline import BaseStage, StageRun, register_stage
from qaopt.result import Configuration, RanNN, Validation
from qaopt.search import SearchContext
from qaopt.stages.reference import Reference
from qaopt.stages.region import CalibratedRegion, ClosedLoopEvidence, ClosedLoopRun

if TYPE_CHECKING:
    from qaopt.stages.studies import AwareSearch

VALIDATION_VERSION = 2
"""2: per-metric means, worst run and counts' totals; a version-1 file (every metric summed) is read as means."""


@dataclass(frozen=True)
class FrontValidation:
    """What validating the front produced: every validation in order (selection runs, and fresh-seed runs of the
    configurations they rejected), the chosen configuration, its fresh-seed verdict, and the evidence."""

    validations: list[Validation]
    chosen: Configuration | None
    evidence: ClosedLoopEvidence
    acceptance: Validation | None = None


@dataclass(frozen=True)
class Candidate:
    """A configuration of the front to validate: an aware trial, or the agnostic choice where the region holds it
    (so the aware choice is never slower than the agnostic one), named by ``label``."""

    config: Configuration
    label: str | None = None

    @property
    def name(self) -> str:
        return self.label or ("reference" if self.config.trial is None else f"trial {self.config.trial}")


def validate_front(
    ctx: SearchContext, front: list[Configuration], calibrated: CalibratedRegion, evidence: ClosedLoopEvidence,
    reference: Configuration, *, agnostic: Configuration | None = None, executor: Executor | None = None,
    events: StageEvents | None = None,
) -> FrontValidation:
    """Validate the aware front fastest-first, each configuration until the sequential test decides it; the first
    accepted on the selection seeds and then on fresh ones wins.

    Each step validates the fastest configuration not yet validated that the region, with every closed-loop run so
    far, holds (:func:`_fastest_inside`): one a failure ruled out is passed over only while the region rules it out.
    ``agnostic`` (the agnostic choice, already re-checked), where the region holds it, is one more candidate at its
    latency: the aware choice is then never slower than it.

    A configuration accepted on the selection seeds runs again on fresh ones (:data:`ACCEPTANCE_SEED_BASE`); one
    those reject does not end the pass: its failures become evidence and the next configuration is validated, until
    one is accepted on both or the front (``validate_top`` selection validations) is spent.

    Each configuration is re-checked first (:meth:`SearchContext.rechecked`): NNs rebuilt into other bytes than
    the search measured are validated with their own errors, or skipped when those leave the region.
    When none is accepted (a quick profile's cap is too low to accept any), the fastest one with no failing
    selection run is chosen, unaccepted, and run on the fresh seeds once; where the cap could not accept any
    configuration, the slower ones are not validated once that one is found (they could change nothing). When none
    is even that, the ``reference`` configuration is validated too, so the report can tell an application that
    fails with any approximation from one that fails anyway.
    A configuration whose NNs this pass already validated (the same NNs under another schedule: the closed loop
    does not see the schedule) is skipped and does not count against the profile's ``validate_top``: its verdict
    is known.
    ``executor`` and ``events`` are :func:`validate_configuration`'s.
    """
    run = dict(executor=executor, events=events)
    note = events.note if events is not None else lambda line: None
    region = calibrated.searched(evidence)
    validations: list[Validation] = []
    chosen = fallback = acceptance = None
    can_accept = SequentialTest.of(ctx.plan.application.acceptance, ctx.plan.validation_runs).can_accept
    validated: dict[str, str] = {}  # each NN set validated in this pass -> the configuration that ran it
    # Scenes that failed a configuration run first for the next: NNs of one lineage tend to fail the same scene
    # (a real NN's error on a particular frame, which the region's injected errors cannot show).
    failed_seeds: dict[int, None] = {}
    pending = [Candidate(c) for c in front]
    if (agnostic is not None and region.contains(agnostic.errors)
            and all(c.candidate_keys() != agnostic.candidate_keys() for c in front)):
        # Before the first aware configuration measurably slower: a near tie keeps the aware one first, so the order
        # does not follow timing noise (the agnostic frame is measured again on a resumed run).
        at = next((i for i, c in enumerate(front) if _slower(c, agnostic)), len(front))
        pending.insert(at, Candidate(agnostic, AGNOSTIC_LABEL))
    selected = 0

    def learn(config: Configuration, validation: Validation) -> None:
        nonlocal evidence, region
        validations.append(validation)
        failed_seeds.update(dict.fromkeys(validation.failed_seeds))
        grown = with_validation(evidence, calibrated.application, config, validation)
        if grown is not evidence:
            evidence = grown
            region = calibrated.searched(evidence)

    while pending and selected < ctx.plan.validate_top:
        candidate = _fastest_inside(ctx, pending, region, note)
        if candidate is None:
            break
        config = candidate.config
        nns = content_hash(_candidates(config))
        if nns in validated:
            note(f"{candidate.name}: the NNs of {validated[nns]} in another schedule, whose verdict stands for it: "
                 "not validated again")
            continue
        validated[nns] = candidate.name
        selected += 1
        validation = validate_configuration(ctx, config, first_seeds=list(failed_seeds), configuration=candidate.label,
                                            **run)
        learn(config, validation)
        if validation.accepted:
            fresh = validate_configuration(ctx, config, seed_base=ACCEPTANCE_SEED_BASE,
                                           configuration=candidate.label, **run)
            if fresh.accepted:
                chosen, acceptance = config, fresh
                break
            learn(config, fresh)
            note(f"{candidate.name} rejected on fresh seeds ({fresh.failures} of {fresh.runs} runs failed): the next "
                 "configuration of the front is validated")
            continue
        if fallback is None and not validation.failures:
            fallback = config
            if not can_accept:
                note(f"{candidate.name} chosen unaccepted: a cap of {ctx.plan.validation_runs} runs cannot accept a "
                     "configuration, so the slower ones are not validated")
                break
    if chosen is None and fallback is not None:
        chosen = fallback
        acceptance = validate_configuration(ctx, fallback, seed_base=ACCEPTANCE_SEED_BASE,
                                            configuration=AGNOSTIC_LABEL if fallback is agnostic else None, **run)
        evidence = with_validation(evidence, calibrated.application, fallback, acceptance)
    if chosen is None and validations:
        validations.append(validate_configuration(ctx, reference, first_seeds=list(failed_seeds), **run))
    return FrontValidation(validations, chosen, evidence, acceptance)


def _slower(config: Configuration, than: Configuration) -> bool:
    """Whether ``config`` is measurably slower than ``than``: their 95 % intervals apart (medians where one has none)."""
    if config.latency is None or than.latency is None:
        return config.latency_ms > than.latency_ms
    return config.latency.ci_ms[0] > than.latency.ci_ms[1]


def _fastest_inside(ctx: SearchContext, pending: list[Candidate], region, note) -> Candidate | None:
    """The first of ``pending`` (fastest first) that ``region`` holds, as its NNs are now, taken out of ``pending``;
    ``None`` when the region holds none of them.

    One the region does not hold stays pending: each step asks the region as the evidence has made it, rather
    than what it was when the pass began, since a certifier (an open registry) need not be monotone in the
    evidence. The agnostic candidate was re-checked against its own tolerance already.
    """
    for i, candidate in enumerate(pending):
        config = (candidate.config if candidate.label == AGNOSTIC_LABEL
                  else ctx.rechecked(candidate.config, "aware", region, note))
        if config is not None and region.contains(config.errors):  # else rebuilt outside, or ruled out for now
            del pending[i]
            return Candidate(config, candidate.label)
    return None


def with_validation(evidence: ClosedLoopEvidence, application: str, config: Configuration,
                    validation: Validation) -> ClosedLoopEvidence:
    """``evidence`` with ``config``'s closed-loop runs on ``application`` (its key) added when any failed (else
    ``evidence`` itself).

    The one place closed-loop runs become evidence against an error point, for the validation
    stage and the in-search checks alike. Runs that all passed are left out: the point is inside
    the region already, and one real NN's passes are no verdict on other NNs below its point.
    The region takes only what the runs at a point decide (:meth:`~qaopt.calibrate.region.ErrorRegion.runs`).
    """
    if not validation.failures:
        return evidence
    return evidence.with_run(ClosedLoopRun(
        application=application, candidates=_candidates(config), errors=config.errors,
        passes=validation.passes, failures=validation.failures,
        note=f"{validation.name}: the approximated NNs in the loop"))


AGNOSTIC_LABEL = "application-agnostic"
"""How the agnostic baseline's validation is named: it is combined from per-NN studies, so no trial names it."""


def validate_configuration(
    ctx: SearchContext, config: Configuration, *, runs: int | None = None, executor: Executor | None = None,
    events: StageEvents | None = None, label: str = "", show_runs: bool = True, seed_base: int = VALIDATION_SEED_BASE,
    configuration: str | None = None, first_seeds: Collection[int] = (),
) -> Validation:
    """The closed-loop validation of one configuration, read from the cache when these NNs already ran on these seeds.

    ``runs`` is the most runs it may spend (default: the plan's ``validation_runs``), on the seeds from
    ``seed_base`` on (selection by default; :data:`~qaopt.closed_loop.ACCEPTANCE_SEED_BASE` to accept);
    ``executor`` runs its blocks of runs (``None``: in this process); ``events`` gets a
    :class:`~qaopt.events.RunBlock` after each block (when ``show_runs``) and one line with the
    outcome, after ``label``. ``configuration`` names a configuration that is no trial (the agnostic baseline).
    ``first_seeds`` are run first (:func:`~qaopt.closed_loop.validate_closed_loop`).
    """
    plan = ctx.plan
    app = plan.application
    runs = plan.validation_runs if runs is None else runs
    device = plan.loop_device
    # Where the NNs run is part of how the application was evaluated (a GPU's fp16 kernels are not the CPU's).
    evaluation = app.evaluation_key if device == "cpu" else f"{app.evaluation_key}@{device}"
    key = content_hash("validation", _candidates(config), runs, evaluation, seed_base)
    path = ctx.cache_dir / "optimize" / "validation" / f"{key}.json"
    labels = {"trial": config.trial, "region_predicted_valid": config.in_region}
    name = configuration or ("reference" if config.trial is None else f"trial {config.trial}")
    if seed_base != VALIDATION_SEED_BASE:
        name += ", fresh seeds"
    cached = store.read_model(path, Validation, VALIDATION_VERSION) or _read_version_1(path)
    if cached is not None:  # the same NNs validated by an earlier run or study: only the labels are this run's
        if events:
            events.note(f"{label}{name}: {cached.verdict} after {cached.runs} runs, {_failed(cached)} (cached)")
        return cached.model_copy(update={**labels, "label": configuration})
    candidates = ctx.candidates(config)

    def show(step: BlockProgress) -> None:
        if events is not None and show_runs:
            events.emit(RunBlock(events.stage, name, step.runs, step.planned, step.failures, step.verdict))

    show(BlockProgress(0, runs, 0, "undecided"))
    if executor is None and device == "cpu":
        nns, parallel = {n: c.predict for n, c in candidates.items()}, {}
    else:
        nns = {n: ShippedNN(c, device) for n, c in candidates.items()}
        parallel = {} if executor is None else {"executor": executor, "remote": app.remote()}
    # Each finished block of runs is kept: a killed validation resumes after it, a longer one of these NNs reuses it.
    blocks = ValidationBlocks.of(ctx.cache_dir, _candidates(config), evaluation, app.goal)
    validation = validate_closed_loop(
        app.evaluator(), nns, app.goal, app.acceptance, runs,
        threads=plan.threads if executor is None else 1, on_block=show, cache=blocks, limits=app.limits,
        seed_base=seed_base, first_seeds=first_seeds, **parallel, **labels,
    )
    validation = validation.model_copy(update={"label": configuration, "nns": _ran(config)})
    store.write_model(path, validation, VALIDATION_VERSION)
    if events:
        events.note(f"{label}{name}: {validation.verdict} after {validation.runs} runs, {_failed(validation)}")
    return validation


def _failed(validation: Validation) -> str:
    """``2 failed (seeds 5000003, 5000029)``: the failures and, where recorded, the scenes that decided them."""
    seeds = validation.failed_seeds
    named = f" (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})" if seeds else ""
    return f"{validation.failures} failed{named}"


def _read_version_1(path) -> Validation | None:
    """A validation cached before version 2: its sums become means (closed-loop runs are too dear to repeat)."""
    data = store.read_json(path, Validation.__name__, 1)
    if not isinstance(data, dict) or not data.get("runs"):
        return None
    totals = data.pop("totals", {})
    try:
        return Validation.model_validate({**data, "metrics": {k: {"mean": v / data["runs"]} for k, v in totals.items()}})
    except (ValueError, TypeError):
        return None


def _candidates(config: Configuration) -> dict[str, str]:
    """The cache identity of ``config``'s NNs: each candidate key, with its bytes' hash where the search recorded one."""
    return {n: c.candidate if c.bytes_hash is None else f"{c.candidate}:{c.bytes_hash}" for n, c in config.nns.items()}


def _ran(config: Configuration) -> dict[str, RanNN]:
    return {n: RanNN(candidate=c.candidate, bytes_hash=c.bytes_hash) for n, c in config.nns.items()}


@dataclass(frozen=True)
class Validated:
    """The validation stage's artifact: the front's validations and choice, the choice's acceptance on fresh seeds,
    and the agnostic choice's runs (on those fresh seeds too)."""

    front: FrontValidation
    acceptance: Validation | None
    agnostic: Configuration | None
    agnostic_validation: Validation | None


@register_stage
class ValidationStage(BaseStage):
    """The aware front's fastest configurations closed-loop with their real NNs; the agnostic choice too."""

    name = "closed-loop validation"
    inputs = ("calibration", "reference NNs", "aware search", "agnostic search")
    artifact = "cache/optimize/validation/<key>.json per configuration; closed_loop.json when one fails"

    def total(self, run: StageRun, inputs) -> float | None:
        return run.plan.validation_runs

    def run(self, run: StageRun, inputs) -> Validated:
        reference: Reference = inputs["reference NNs"]
        aware: AwareSearch = inputs["aware search"]
        calibrated: CalibratedRegion = inputs["calibration"]
        events = run.emitter(self.name)
        options = dict(executor=run.executor, events=events)
        evidence = aware.checks.evidence
        # The agnostic choice, re-checked against its tolerance where its NNs were rebuilt, and placed in the region
        # as the aware study's checks left it (the evidence validation starts from).
        searched = inputs["agnostic search"].chosen
        region = aware.checks.current().region
        agnostic = None if searched is None else reference.ctx.rechecked(searched, "agnostic", region, events.note)
        if agnostic is not None:
            agnostic = agnostic.model_copy(update={"in_region": region.contains(agnostic.errors)})
        front = validate_front(reference.ctx, aware.summary.feasible_configurations(), calibrated, evidence,
                               reference.configuration, agnostic=agnostic, **options)
        if front.evidence is not evidence:
            front.evidence.save(run.plan.run_dir)
        # Today's practice deploys the agnostic choice unvalidated; its closed-loop runs say whether that was safe
        # (free when the front validated its NNs on these seeds already).
        agnostic_validation = (validate_configuration(reference.ctx, agnostic, seed_base=ACCEPTANCE_SEED_BASE,
                                                      configuration=AGNOSTIC_LABEL, **options) if agnostic else None)
        return Validated(front, front.acceptance, agnostic, agnostic_validation)
