"""Calibration of an application spec: the glue from ``app.yaml`` to :mod:`qaopt.calibrate`.

``qaopt calibrate`` and ``qaopt optimize`` both start here: the spec names the
simulator (an entry point called with its params), the QoS goal and its
acceptance test, the error space and the error model; this module builds the
:class:`~qaopt.calibrate.Calibration` from them and runs it.

Simulator runs are cached under a key made of the spec's ``evaluator`` section and
the simulator's source code, so editing the simulator never reuses stale runs,
while changing the QoS threshold, the acceptance test, the strategy or the budget
reuses every run already made.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from qaopt.app_spec import AppSpec, content_hash, file_hash, load_entry_point
from qaopt.calibrate import (
    AcceptanceTest,
    Axis,
    Calibration,
    CalibrationError,
    ErrorModel,
    ErrorRegion,
    ErrorSpace,
    Evidence,
    Progress,
    QoSGoal,
    make_error_model,
)


def cache_dir_of(spec: AppSpec) -> Path:
    """``$QAOPT_CACHE_DIR`` if set (tests), else the spec's ``output.cache_dir``."""
    return Path(os.environ.get("QAOPT_CACHE_DIR") or spec.output.cache_dir)


def space_of(spec: AppSpec) -> ErrorSpace:
    return ErrorSpace(Axis(a.nn, a.max, a.component, a.min) for a in spec.calibration.space)


def goal_of(spec: AppSpec) -> QoSGoal:
    return QoSGoal(spec.qos.metric, spec.qos.max, spec.qos.min)


def acceptance_of(spec: AppSpec) -> AcceptanceTest:
    """The spec's acceptance test; one seed block is ``min_trials`` runs (the first look)."""
    a = spec.qos.acceptance
    return AcceptanceTest(a.max_failure_rate, a.confidence, a.min_trials, a.max_trials, block=a.min_trials)


def make_evaluator(spec: AppSpec):
    """The spec's simulator: its entry point called with its params."""
    sim = spec.evaluator.simulator
    if sim is None:
        raise CalibrationError(
            f"{spec.source or 'spec'}: evaluator.simulator is missing; calibration injects errors into a "
            "simulator (field runs refine a region, see `qaopt field`); add evaluator.simulator.entry_point"
        )
    if sim.entry_point is None:
        raise CalibrationError(
            f"{spec.source or 'spec'}: evaluator.simulator.env_id is not supported by calibration yet; "
            "give an entry_point (module:Class) implementing qaopt.calibrate.QoSEvaluator"
        )
    evaluator = load_entry_point(sim.entry_point)(**sim.params)
    if not hasattr(evaluator, "evaluate") or not hasattr(evaluator, "nn_names"):
        raise CalibrationError(
            f"evaluator.simulator.entry_point {sim.entry_point!r} did not give a QoS evaluator "
            "(an object with nn_names and evaluate(injectors, seeds))"
        )
    return evaluator


def simulator_code_hash(evaluator) -> str:
    """Hash of the Python sources in the evaluator's package folder (its code version)."""
    src = inspect.getsourcefile(type(evaluator))
    if src is None:
        return "unknown"
    files = sorted(Path(src).parent.glob("*.py"))
    return content_hash([[f.name, file_hash(f)] for f in files])


def reference_residuals(spec: AppSpec, nn: str, cache_dir: Path) -> list[np.ndarray]:
    """The spec's reference NN's residual sequences on its validation data (built/cached by approx)."""
    from qaopt.approx import Knobs, TargetNN, build  # heavy (torch): only for the empirical model

    return list(build(TargetNN.from_spec(nn, spec.nns[nn]), Knobs(), cache_dir=cache_dir).residuals)


def build_calibration(
    spec: AppSpec,
    residuals: Mapping[str, Sequence[np.ndarray]] | None = None,
    evaluator=None,
    cache_dir: str | Path | None = None,
) -> Calibration:
    """The :class:`Calibration` a spec describes.

    ``residuals`` (NN -> residual sequences) fit the error model to real NNs; the
    ``empirical`` model without them uses the spec's reference NNs' residuals.
    ``evaluator`` replaces the spec's simulator (tests, a custom harness).
    """
    cache = Path(cache_dir) if cache_dir is not None else cache_dir_of(spec)
    space = space_of(spec)
    for axis in space.axes:
        if axis.nn not in spec.nns:
            raise CalibrationError(
                f"calibration.space: no NN named '{axis.nn}'; the spec's NNs are {', '.join(spec.nns)}"
            )
    residuals = dict(residuals or {})
    models: dict[str, ErrorModel] = {}
    for nn in space.nns:
        kind = spec.nns[nn].error_metric.kind
        res = residuals.get(nn)
        if res is None and spec.calibration.error_model == "empirical":
            res = reference_residuals(spec, nn, cache)
        models[nn] = make_error_model(spec.calibration.error_model, kind, res)
    evaluator = evaluator if evaluator is not None else make_evaluator(spec)
    # The simulator alone keys its runs: adding a field store must not discard them.
    app_key = content_hash(spec.evaluator.simulator, simulator_code_hash(evaluator))
    return Calibration(evaluator, space, models, goal_of(spec), acceptance_of(spec), cache, app_key)


def calibrate_spec(
    spec: AppSpec,
    strategy: str | None = None,
    budget: int | None = None,
    out: str | Path | None = None,
    evidence: Sequence[Evidence] = (),
    progress: Callable[[Progress], None] | None = None,
    calibration: Calibration | None = None,
) -> tuple[ErrorRegion, Path]:
    """Run the spec's calibration (strategy/budget overridable) and write region.json + region.png to ``out``.

    Returns the region and the folder. Re-running resumes: every finished seed
    block is read back from the cache.
    """
    cal = calibration or build_calibration(spec)
    region = cal.search(strategy or spec.calibration.strategy, spec.calibration.budget if budget is None else budget,
                        evidence=evidence, progress=progress)
    region.info.update({"app": spec.app.name, "spec": str(spec.source or "")})
    folder = Path(out) if out is not None else Path(spec.output.dir)
    region.save(folder / "region.json")
    region.plot(folder / "region.png")
    return region, folder
