"""``qaopt.optimize``: one spec in, a validated, faster NN configuration and its artifacts out.

The stages, each cached so that a killed run resumes where it stopped:

1. the reference NNs (trained or loaded) and their error and latency on the target;
2. the error region: calibrated, or loaded when ``region.json`` of this spec exists;
3. two Optuna studies over per-NN knobs and the schedule: application-aware (inside
   the region) and application-agnostic (each NN within its reference error);
4. closed-loop validation of the aware Pareto front with the real approximated NNs;
5. ``result.json``, ``report.md`` with its plots, and ``artifacts/``.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from qaopt import kernels
from qaopt.app_spec import AppSpec, content_hash, load
from qaopt.approx import Candidate, Knobs, TargetNN, build
from qaopt.calibrate import ErrorRegion, Evidence
from qaopt.calibration import cache_dir_of, calibrate_spec, make_evaluator
from qaopt.field.evidence import spec_evidence
from qaopt.pipeline import compile_nn
from qaopt.profiles import Profile, get_profile
from qaopt.report import format_errors, write_report
from qaopt.result import Configuration, Result, Speedups, Validation
from qaopt.search import OptimizeError, SearchContext, feasible_configurations, open_storage, run_study, summarize
from qaopt.validation import VALIDATION_SEED_BASE, validate_closed_loop

AGNOSTIC_TOLERANCE = 0.02
"""Accuracy-preserving compression may lose this much relative NN error (measurement noise)."""


def optimize(
    spec: AppSpec | str | Path,
    *,
    profile: str | Profile = "default",
    out: str | Path | None = None,
    storage: str | None = None,
    trials: int | None = None,
    console: Console | None = None,
) -> Result:
    """Optimize the application ``spec`` describes; returns what ``result.json`` holds.

    ``profile`` caps the budgets ("quick" or "default"); ``out`` overrides the
    spec's ``output.dir``; ``storage`` (an SQLAlchemy URL) shares the studies
    between workers; ``trials`` overrides the number of trials per study.
    """
    spec = spec if isinstance(spec, AppSpec) else load(spec, check_entry_points=True)
    prof = profile if isinstance(profile, Profile) else get_profile(profile)
    if trials is not None:
        prof = prof.model_copy(update={"trials": trials})
    console = console or Console(stderr=True)
    run_dir = (Path(out) if out is not None else Path(spec.output.dir)).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = cache_dir_of(spec)
    stages: dict[str, float] = {}

    # Fail fast on the storage before any expensive work.
    study_storage = open_storage(storage or spec.search.storage or f"sqlite:///{run_dir.resolve() / 'study.db'}")

    with _stage(console, stages, "reference NNs"):
        nns = {name: TargetNN.from_spec(name, nn) for name, nn in spec.nns.items()}
        reference_knobs = {name: Knobs(seed=spec.search.seed) for name in nns}
        reference = {name: build(nns[name], reference_knobs[name], cache_dir=cache_dir) for name in nns}

    with _stage(console, stages, "calibration"):
        region = _region(spec, prof, run_dir)

    target = kernels.Target.from_spec(spec.target)
    if prof.tuning_trials is not None:
        tuning = target.tuning
        capped = (kernels.TuningBudget(0, None, tuning.database) if prof.tuning_trials == 0 else
                  kernels.TuningBudget(min(tuning.trials or prof.tuning_trials, prof.tuning_trials), tuning.seconds, tuning.database))
        target = replace(target, tuning=capped)
    ctx = SearchContext(
        spec=spec,
        profile=prof,
        nns=nns,
        target=target,
        cache_dir=cache_dir,
        region=region,
        reference_errors={n: c.error for n, c in reference.items()},
        agnostic_tolerance=AGNOSTIC_TOLERANCE,
    )
    reference_errors = ctx.errors_of(reference)
    if not region.contains(reference_errors):
        raise OptimizeError(
            f"{spec.source}: the error region is empty for these NNs: even the reference NNs "
            f"(errors {format_errors(reference_errors)}) fail the QoS goal '{spec.qos.metric}' at the spec's confidence, so no "
            f"approximation can be valid. See the calibration plot {run_dir / 'region.png'}; loosen qos or improve the NNs."
        )

    with _stage(console, stages, "reference latency"):
        measured, ref_latency, ref_memory = ctx.measure(reference, "sequential")
        reference_config = Configuration(
            nns={n: m.choice for n, m in measured.items()},
            schedule="sequential",
            latency_ms=ref_latency,
            memory_bytes=ref_memory,
            errors=reference_errors,
            in_region=True,
        )

    n_trials = prof.trials or spec.search.trials
    studies = {}
    for mode in ("aware", "agnostic"):
        with _stage(console, stages, f"{mode} search ({n_trials} trials)"):
            studies[mode] = run_study(
                ctx, mode, study_storage, n_trials, reference_knobs,
                on_trial=lambda message: console.log(message),
            )

    # Speedups compare measurements of one epoch: the reference as the studies measured it
    # (their enqueued first trial), not a re-measurement in a later, differently loaded process.
    reference_config = _as_measured(studies["aware"], reference_config)

    with _stage(console, stages, "closed-loop validation"):
        front = feasible_configurations(studies["aware"])
        validations, aware = _validate(spec, prof, ctx, front, cache_dir, reference=reference_config)
        if any(v.failures for v in validations):
            region.save(run_dir / "region.json")  # closed-loop evidence is kept with the region
            region.plot(run_dir / "region.png")
        agnostic_front = feasible_configurations(studies["agnostic"])
        agnostic = agnostic_front[0] if agnostic_front else None
        # Today's practice deploys the agnostic choice unvalidated; its closed-loop runs say whether that was safe
        # (free when the aware study validated the same NNs).
        agnostic_validation = _validation(spec, prof, ctx, agnostic, cache_dir) if agnostic is not None else None

    with _stage(console, stages, "artifacts and report"):
        artifacts = _export(aware, ctx, run_dir / "artifacts") if aware is not None else {}
        matched = [v.accepted == v.region_predicted_valid for v in validations if v.verdict != "undecided"]
        result = Result(
            app=spec.app.name,
            spec=str(spec.source),
            spec_hash=spec.content_hash(),
            profile=prof.name,
            run_dir=run_dir.resolve(),
            reference=reference_config,
            aware=aware,
            agnostic=agnostic,
            agnostic_tolerance=AGNOSTIC_TOLERANCE,
            speedups=Speedups(
                aware=reference_config.latency_ms / aware.latency_ms if aware else None,
                agnostic=reference_config.latency_ms / agnostic.latency_ms if agnostic else None,
                aware_over_agnostic=agnostic.latency_ms / aware.latency_ms if aware and agnostic else None,
            ),
            validations=validations,
            agnostic_validation=agnostic_validation,
            fidelity=sum(matched) / len(matched) if matched else None,
            fidelity_note=_fidelity_note(spec, validations),
            studies={mode: summarize(s) for mode, s in studies.items()},
            tuning={"trials_per_candidate": target.tuning.trials, "seconds_per_candidate": target.tuning.seconds},
            region=(run_dir / "region.json").resolve(),
            report=(run_dir / "report.md").resolve(),
            artifacts=artifacts,
            seconds=stages,
        )
        write_report(result, studies, region, run_dir)
        result.save(run_dir / "result.json")
    return result


def _as_measured(study, reference: Configuration) -> Configuration:
    """The study's own measurement of the reference configuration, if it holds one."""
    keys = {n: c.candidate for n, c in reference.nns.items()}
    for config in feasible_configurations(study):
        if config.schedule == reference.schedule and {n: c.candidate for n, c in config.nns.items()} == keys:
            return config.model_copy(update={"trial": None})
    return reference


def _region(spec: AppSpec, prof: Profile, run_dir: Path) -> ErrorRegion:
    """This spec's region: loaded when ``region.json`` was made from the same calibration inputs.

    Field runs logged in the spec's field store are evidence that confirms or overturns
    simulator verdicts; a new field run changes the key, so the region is recomputed
    (from cached simulator runs, in seconds).
    """
    evidence = spec_evidence(spec).evidence
    key = content_hash(spec.content_hash("evaluator", "qos", "calibration", "nns"), prof.calibration_budget,
                       [(dict(e.errors), e.passes, e.failures, e.source) for e in evidence])
    path = run_dir / "region.json"
    if path.exists():
        region = ErrorRegion.load(path)
        if region.info.get("calibration_key") == key:
            return region
    region, _ = calibrate_spec(spec, budget=prof.calibration_budget, out=run_dir, evidence=evidence)
    region.info["calibration_key"] = key
    region.save(path)
    return region


def _validate(
    spec: AppSpec, prof: Profile, ctx: SearchContext, front: list[Configuration], cache_dir: Path,
    reference: Configuration | None = None,
) -> tuple[list[Validation], Configuration | None]:
    """Validate the fastest configurations of the aware front; the first accepted one wins.

    A configuration that fails closed-loop is evidence against the region at its error
    point: it is added to the region (source ``closed-loop``), and by monotonicity every
    front configuration with errors at least as large is skipped without spending runs
    on it. When none is accepted at the spec's confidence (a quick profile runs too few
    runs to prove it), the fastest one with no failing run is reported, unaccepted. When
    none is even that, the ``reference`` configuration is validated too, so the report
    can tell an application that fails with any approximation from one that fails anyway.
    """
    validations: list[Validation] = []
    chosen = fallback = None
    for config in front:
        if len(validations) >= prof.validate_top:
            break
        if not ctx.region.contains(config.errors):
            continue  # ruled out by an earlier closed-loop failure
        validation = _validation(spec, prof, ctx, config, cache_dir)
        validations.append(validation)
        if validation.failures and not _recorded(ctx.region, config.errors, validation):
            ctx.region.add_evidence(Evidence(config.errors, validation.passes, validation.failures, source="closed-loop",
                                             note=f"trial {config.trial}: the approximated NNs in the loop"))
        if validation.accepted:
            chosen = config
            break
        if fallback is None and not validation.failures:
            fallback = config
    if chosen is None and fallback is None and reference is not None and validations:
        validations.append(_validation(spec, prof, ctx, reference, cache_dir))
    return validations, chosen or fallback


def _recorded(region: ErrorRegion, errors: dict[str, float], validation: Validation) -> bool:
    """Whether the region already holds these closed-loop runs (a resumed run reads them from the cache)."""
    return any(o.source == "closed-loop" and dict(o.errors) == dict(errors) and (o.passes, o.failures) ==
               (validation.passes, validation.failures) for o in region.observations)


def _validation(spec: AppSpec, prof: Profile, ctx: SearchContext, config: Configuration, cache_dir: Path) -> Validation:
    """The closed-loop validation of one configuration (cached by its candidates, runs, simulator and goal)."""
    key = content_hash("validation", {n: c.candidate for n, c in config.nns.items()}, prof.validation_runs,
                       spec.content_hash("evaluator", "qos"), VALIDATION_SEED_BASE)
    cached = cache_dir / "optimize" / "validation" / f"{key}.json"
    if cached.exists():  # the same NNs validated by an earlier run or study: only the labels are this run's
        return Validation.model_validate_json(cached.read_text()).model_copy(
            update={"trial": config.trial, "region_predicted_valid": config.in_region})
    candidates = {n: _candidate(ctx, n, c.knobs) for n, c in config.nns.items()}
    validation = validate_closed_loop(
        make_evaluator(spec), {n: c.predict for n, c in candidates.items()}, spec, prof.validation_runs,
        trial=config.trial, region_predicted_valid=config.in_region, threads=ctx.target.threads or 1,
    )
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(validation.model_dump_json())
    return validation


def _candidate(ctx: SearchContext, nn: str, knobs: dict[str, Any]) -> Candidate:
    return ctx.build(nn, Knobs.model_validate(knobs))


def _export(config: Configuration, ctx: SearchContext, folder: Path) -> dict[str, dict[str, Path]]:
    """Each chosen NN as a state dict, ONNX, and the compiled library of its backend."""
    import torch

    out: dict[str, dict[str, Path]] = {}
    for name, choice in config.nns.items():
        candidate = _candidate(ctx, name, choice.knobs)
        nn_dir = folder / name
        nn_dir.mkdir(parents=True, exist_ok=True)
        files: dict[str, Path] = {}
        files["state_dict"] = nn_dir / "state_dict.pt"
        torch.save(candidate.module.state_dict(), files["state_dict"])
        files["onnx"] = nn_dir / "model.onnx"
        if candidate.onnx_path is not None:
            shutil.copyfile(candidate.onnx_path, files["onnx"])
        else:
            module = candidate.module.float().eval()
            torch.onnx.export(module, (ctx.nns[name].example_input,), files["onnx"], dynamo=False, opset_version=17,
                              input_names=["input"], output_names=["output"])
        target = replace(ctx.target, backend=choice.backend.split("[")[0])
        measured = compile_nn(candidate, ctx.examples()[name], target, ctx.cache_dir)
        files["compiled"] = measured.compiled.export(nn_dir / f"compiled-{choice.backend}")
        out[name] = files
    return out


def _fidelity_note(spec: AppSpec, validations: list[Validation]) -> str:
    wrong = [v for v in validations if v.verdict == "invalid" and v.region_predicted_valid]
    if not wrong:
        return ""
    return (
        f"The region (error model '{spec.calibration.error_model}') predicted {len(wrong)} configuration(s) valid that "
        f"failed closed-loop (trials {', '.join(str(v.trial) for v in wrong)}): the real NNs' errors differ from the "
        "injected model (bias, correlation over frames, scene-dependent failures); consider error_model: empirical."
    )



@contextmanager
def _stage(console: Console, stages: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    with console.status(f"[bold]{name}[/bold]…"):
        yield
    stages[name] = round(time.perf_counter() - start, 2)
    console.log(f"{name}: done in {stages[name]:.1f} s")
