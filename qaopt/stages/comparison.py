"""The comparison stage: the reference, application-aware and agnostic configurations timed side by side (and the
agnostic baseline by point error, where the tolerance test's data held the agnostic one back).

A study measures a configuration when a trial first samples it, so the three figures a
run reports may have been taken minutes apart under different load, or, in a run resumed
on another machine, on different hardware. A ratio of such figures carries whatever changed
in between, and :class:`qaopt.result.SpeedupInterval` calls measurements of different
processes "not comparable". So before the report, the three are compiled again on the
backends their measurements chose and timed in interleaved rounds, in a fresh process
(:func:`qaopt.kernels.compare_frames_fresh`): the run's own process, after training,
calibration and closed-loop validation, timed two-model frames up to 1.9x the sum of their
models. A frame of several NNs is timed on every schedule the target allows and runs on the
fastest (:func:`side_by_side`). The latencies and speedups in ``result.json`` are these, each
NN's of a sequential frame included. Nothing is cached: the stage costs seconds, and a figure
read back from an earlier process would defeat it. It first
waits for the closed-loop runs still in flight on the run's local pool and ends its idle
workers (:func:`qaopt.executor.quiesce`): validation's last blocks go on after its verdict,
and frames timed beside them are not the target's.

When the trials were timed on a stand-in (``target.search_backend``), the three configurations
are first measured on ``target.backend`` (:func:`on_target_backend`; ``auto``: every backend of
the device, the fastest kept per NN), so each side of the comparison runs on its own best backend
and the exported NNs are those compiled there. Those outcomes are cached like any trial's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from qaopt import kernels
from qaopt.executor import quiesce
from qaopt.kernels import schedules_for, threads_of
from qaopt.measuring import frame_models, latency_of, measure_configuration, workload_of
from qaopt.pipeline import BaseStage, StageRun, register_stage
from qaopt.result import Configuration
from qaopt.search import SearchContext
from qaopt.stages.reference import Reference
from qaopt.stages.validation import Validated

BY_POINT = "agnostic by point error"
"""The agnostic baseline by point error (:attr:`qaopt.agnostic.AgnosticSearch.by_point`), timed beside the others."""
ROUNDS = 3
"""Interleaved rounds; each frame's figure pools the samples of all of them."""


MEASURED_FIELDS = ("backend", "latency_ms", "memory_bytes", "backends_measured", "latency")
"""What a measurement on another backend changes in an :class:`~qaopt.result.NNChoice` (its NN and error stay)."""


def on_target_backend(ctx: SearchContext, config: Configuration) -> Configuration:
    """``config`` measured on the deployment target's backend (:attr:`qaopt.plan.RunPlan.target`): each NN's
    backend and figures, and the frame's, are those of that measurement."""
    measured = measure_configuration(ctx.candidates(config), config.schedule, ctx.plan.target, ctx.cache_dir)
    nns = {n: c.model_copy(update={key: getattr(measured.nns[n].choice, key) for key in MEASURED_FIELDS})
           for n, c in config.nns.items()}
    return config.model_copy(update={"nns": nns, "latency_ms": measured.latency_ms,
                                     "memory_bytes": measured.memory_bytes, "latency": measured.latency})


def side_by_side(ctx: SearchContext, configurations: Mapping[str, Configuration | None],
                 note: Callable[[str], None] = lambda line: None) -> dict[str, Configuration | None]:
    """``configurations`` with their latencies measured again, together, in a fresh process (``None`` stays
    ``None``): each frame's, and each NN's; a frame of several models on every schedule the target allows, the
    fastest kept.

    The schedule is how the NNs share the cores, not what they compute, so it is the comparison's to choose: each
    side runs as it would be deployed fastest now. The schedule a search chose was the faster one when its trial was
    timed, possibly under other load: the real result's agnostic frame, parallel when its units were combined, took
    11.5 ms in this stage, while its two NNs had just measured 3.8 and 3.9 ms each alone on its one core; the ratio
    against the parallel frame credited the aware side with about 1.5x that the application's headroom had not
    bought. ``note`` hears each configuration whose schedule changed here, with both figures.

    Configurations that run the same NNs under the same schedule are timed once and share the figure. Each NN of
    a frame of several is also timed alone in the same rounds (the same compiled model), so the NN figures of a
    sequential frame that result.json and the report show are of the frame's epoch: a study times an NN when a trial
    first samples it, which on a GPU host may be beside the search's closed-loop runs (a GPU frame at batch 1 is
    launch-bound, so a busy host slows it: a quick run's chosen NN read 0.236 ms at its trial, with the host's
    reference kernel 51 % slow, and 0.217 ms here). An NN of a parallel frame keeps its search figure: alone
    with its share of the threads is not how the frame runs it.
    """
    shared: dict[tuple[str, str], kernels.FrameModel] = {}  # (candidate, backend): one object, compiled once there

    def model_of(candidate, backend: str) -> kernels.FrameModel:
        return shared.setdefault((candidate.key, backend), kernels.FrameModel(workload_of(candidate), backend))

    frames: dict[tuple, tuple[dict[str, kernels.FrameModel], kernels.Schedule]] = {}
    labels: dict[tuple, str] = {}  # what a figure's untrusted note names: the configuration, or the NN and backend
    options: dict[str, dict[kernels.Schedule, tuple]] = {}  # configuration -> each schedule allowed -> frame key
    alone: dict[tuple, tuple[str, str]] = {}  # a frame of one NN -> (candidate, backend) it times
    threads = threads_of(ctx.plan.target)
    for name, config in configurations.items():
        if config is None:
            continue
        models = {n: model_of(candidate, config.nns[n].backend)
                  for n, candidate in frame_models(ctx.candidates(config)).items()}
        nns = tuple(sorted((n, c.candidate, c.backend) for n, c in config.nns.items()))
        schedules = schedules_for(len(models), threads)
        options[name] = {schedule: (schedule, nns) for schedule in schedules}
        for schedule, key in options[name].items():
            if key not in frames:
                frames[key] = (models, schedule)
                labels[key] = name if len(schedules) == 1 else f"{name} ({schedule})"
        if len(models) == 1:  # the frame is its NN's figure (a merged NN serves all of them)
            (n, model), = models.items()
            alone[options[name]["sequential"]] = (config.nns[n].candidate, model.backend)
            continue
        for n, model in models.items():
            nn_key = ("sequential", ((n, config.nns[n].candidate, model.backend),))
            frames.setdefault(nn_key, ({n: model}, "sequential"))
            labels.setdefault(nn_key, f"{name}.{n} on {model.backend}")
            alone[nn_key] = (config.nns[n].candidate, model.backend)
    measured = kernels.compare_frames_fresh({labels[key]: frame for key, frame in frames.items()},
                                            ctx.plan.target, rounds=ROUNDS, cache_dir=ctx.cache_dir,
                                            imports=ctx.plan.application.plugins)
    by_key = {key: measured[labels[key]] for key in frames}
    by_nn = {nn: by_key[key] for key, nn in alone.items()}
    out: dict[str, Configuration | None] = {}
    for name, config in configurations.items():
        if config is None:
            out[name] = None
            continue
        timed = {schedule: by_key[key].median_ms for schedule, key in options[name].items()}
        schedule = min(timed, key=timed.__getitem__)
        m = by_key[options[name][schedule]]
        if schedule != config.schedule:
            figures = ", ".join(f"{s} {ms:.3g} ms" for s, ms in timed.items())
            note(f"{name}: {schedule} here, not {config.schedule} as when it was searched ({figures}): each side "
                 "is compared on the schedule that runs it fastest now")
        nns = dict(config.nns)
        if schedule == "sequential":
            for n, choice in nns.items():
                nn_m = by_nn[choice.candidate, choice.backend]
                nns[n] = choice.model_copy(update={"latency_ms": nn_m.median_ms, "latency": latency_of([nn_m])})
        out[name] = config.model_copy(update={"nns": nns, "schedule": schedule, "latency_ms": m.median_ms,
                                              "latency": latency_of([m]),
                                              "schedules_ms": timed if len(timed) > 1 else {}})
    return out


@register_stage
class ComparisonStage(BaseStage):
    """The reference, aware and agnostic frames timed again side by side in a fresh process."""

    name = "side-by-side measurement"
    inputs = ("reference NNs", "agnostic search", "closed-loop validation")
    artifact = "none (the latencies and speedups of result.json)"

    def run(self, run: StageRun, inputs) -> dict[str, Configuration | None]:
        reference: Reference = inputs["reference NNs"]
        validated: Validated = inputs["closed-loop validation"]
        waited = quiesce(run.executor)
        if waited:
            run.emitter(self.name).note(f"waited for {waited} task(s) of closed-loop runs still in flight, so that "
                                        "nothing else runs while the frames are timed")
        configurations = {"reference": reference.configuration, "aware": validated.front.chosen,
                          "agnostic": validated.agnostic, BY_POINT: inputs["agnostic search"].by_point}
        plan = run.plan
        if plan.search_backend is not None:
            run.emitter(self.name).note(
                f"trials were timed on {plan.search_backend} (target.search_backend): compiling the reference "
                f"and the chosen configurations on {plan.target.backend} (target.backend)")
            configurations = {name: None if c is None else on_target_backend(reference.ctx, c)
                              for name, c in configurations.items()}
        return side_by_side(reference.ctx, configurations, note=run.emitter(self.name).note)
