"""The one place where a spec's sections become :mod:`qaopt.calibrate`'s domain objects.

``app.yaml`` describes the application in the spec's terms (:mod:`qaopt.app_spec`:
plain, validated data with YAML locations for its errors); calibration, closed-loop
validation and the search work with objects that have behaviour (an
:class:`~qaopt.calibrate.ErrorSpace`, a :class:`~qaopt.calibrate.QoSGoal`, an
:class:`~qaopt.calibrate.AcceptanceTest`, error models, the simulator). Every
command builds them here, so the two can never drift apart:

========================================  ==========================================
spec                                      domain object
========================================  ==========================================
``evaluator.simulator``                   :func:`make_evaluator`: the application
``calibration.space`` (``schema.Axis``)   :func:`space_of`: ``ErrorSpace`` of ``calibrate.Axis``
``qos`` (metric, max, min)                :func:`goal_of`: ``QoSGoal``
``qos.acceptance`` (``Acceptance``)       :func:`acceptance_of`: ``AcceptanceTest``
``calibration.error_model`` + ``nns``     :func:`error_models_of`: one ``ErrorModel`` per NN
``evaluator.simulator`` + its code        :func:`simulator_key`: the key of its cached runs
``output.cache_dir``                      :func:`cache_dir_of`: the cache root
========================================  ==========================================
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from qaopt.app_spec import AppSpec, QaoptError, content_hash, file_hash, load_entry_point, store
from qaopt.application import ApplicationError, check_application, check_methods
from qaopt.calibrate import (
    AcceptanceTest,
    Axis,
    CalibrationError,
    ErrorModel,
    ErrorSpace,
    QoSEvaluator,
    QoSGoal,
    make_error_model,
)


def cache_dir_of(spec: AppSpec) -> Path:
    """The cache root for this spec (see :func:`qaopt.app_spec.store.cache_root` for the precedence)."""
    return store.cache_root(configured=spec.output.cache_dir)


def space_of(spec: AppSpec) -> ErrorSpace:
    return ErrorSpace(Axis(a.nn, a.max, a.component, a.min) for a in spec.calibration.space)


def goal_of(spec: AppSpec) -> QoSGoal:
    return QoSGoal(spec.qos.metric, spec.qos.max, spec.qos.min)


def acceptance_of(spec: AppSpec) -> AcceptanceTest:
    """The spec's acceptance test; one seed block is ``min_trials`` runs (the first look)."""
    a = spec.qos.acceptance
    return AcceptanceTest(a.max_failure_rate, a.confidence, a.min_trials, a.max_trials, block=a.min_trials)


def make_evaluator(spec: AppSpec, *, check_runs: bool = False) -> QoSEvaluator:
    """The spec's simulator: its entry point called with its params.

    Its methods are checked against :class:`~qaopt.calibrate.QoSEvaluator` (no run is
    made); ``check_runs`` checks the whole application protocol with a few short runs
    instead (:func:`qaopt.check_application`, what ``qaopt validate`` does). An
    :class:`~qaopt.calibrate.Application` is returned as it is, so closed-loop
    validation can use it.
    """
    where = spec.source or "spec"
    sim = spec.evaluator.simulator
    if sim is None:
        raise CalibrationError(
            f"{where}: evaluator.simulator is missing; calibration injects errors into a "
            "simulator (field runs refine a region, see `qaopt field`); add evaluator.simulator.entry_point"
        )
    if sim.entry_point is None:
        raise CalibrationError(
            f"{where}: evaluator.simulator.env_id is not supported by calibration yet; "
            "give an entry_point (module:Class) implementing qaopt.calibrate.Application"
        )
    factory = load_entry_point(sim.entry_point)
    try:
        evaluator = factory(**sim.params)
    except QaoptError:
        raise
    except Exception as exc:
        raise ApplicationError(
            f"{where}: evaluator.simulator: {sim.entry_point}(**params) raised {type(exc).__name__}: {exc}; "
            "fix evaluator.simulator.params"
        ) from exc
    try:
        if check_runs:
            check_application(evaluator, spec)
        else:
            check_methods(evaluator, QoSEvaluator)
    except ApplicationError as exc:
        raise ApplicationError(f"{where}: evaluator.simulator.entry_point {sim.entry_point!r}: {exc}") from None
    return evaluator


def simulator_key(spec: AppSpec, evaluator: object) -> str:
    """The key of the simulator's cached runs: its spec section and the hash of its package's sources.

    Editing the simulator never reuses stale runs, while changing the QoS threshold,
    the acceptance test, the strategy or the budget reuses every run already made.
    """
    src = inspect.getsourcefile(type(evaluator))
    code = "unknown"
    if src is not None:
        code = content_hash([[f.name, file_hash(f)] for f in sorted(Path(src).parent.glob("*.py"))])
    return content_hash(spec.evaluator.simulator, code)


def reference_residuals(spec: AppSpec, nn: str, cache_dir: Path) -> list[np.ndarray]:
    """The spec's reference NN's residual sequences on its validation data (built/cached by approx)."""
    from qaopt.approx import Knobs, TargetNN, build  # heavy (torch): only for the empirical model

    return list(build(TargetNN.from_spec(nn, spec.nns[nn]), Knobs(), cache_dir=cache_dir).residuals)


def error_models_of(
    spec: AppSpec,
    residuals: Mapping[str, Sequence[np.ndarray]] | None = None,
    cache_dir: Path | None = None,
) -> dict[str, ErrorModel]:
    """The spec's error model for every calibrated NN, in the metric its ``error_metric`` declares.

    ``residuals`` (NN -> residual sequences) fit the models to real NNs; the
    ``empirical`` model without them uses the spec's reference NNs' residuals.
    """
    residuals = dict(residuals or {})
    models: dict[str, ErrorModel] = {}
    for nn in space_of(spec).nns:
        res = residuals.get(nn)
        if res is None and spec.calibration.error_model == "empirical":
            res = reference_residuals(spec, nn, cache_dir if cache_dir is not None else cache_dir_of(spec))
        models[nn] = make_error_model(spec.calibration.error_model, spec.nns[nn].error_metric.kind, res)
    return models
