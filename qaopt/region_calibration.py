"""Calibrating a spec's error region: the glue from ``app.yaml`` to :class:`qaopt.calibrate.Calibration`.

``qaopt calibrate`` and ``qaopt optimize`` both start here: the spec names the
simulator (an entry point called with its params), the QoS goal and its
acceptance test, the error space and the error model; :mod:`qaopt.spec_adapter`
turns those sections into calibration's objects, and this module binds them into
a :class:`~qaopt.calibrate.Calibration`, runs it and writes the region.

Simulator runs are cached under :func:`qaopt.spec_adapter.simulator_key`, so
editing the simulator never reuses stale runs, while changing the QoS threshold,
the acceptance test, the strategy or the budget reuses every run already made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from qaopt.app_spec import AppSpec
from qaopt.app_spec.nn_errors import CLASS_METRICS
from qaopt.calibrate import (
    ERROR_MODELS,
    Calibration,
    CalibrationError,
    ErrorModel,
    ErrorRegion,
    Evidence,
    Progress,
    QoSEvaluator,
    make_error_model,
)
from qaopt.calibrate.plot import plotted_axes, slice_levels
from qaopt.on_policy import reference_residuals
from qaopt.spec_adapter import (acceptance_of, cache_dir_of, goal_of, limits_of, make_evaluator, simulator_key,
                                  space_of)


def error_models_of(
    spec: AppSpec,
    residuals: Mapping[str, Sequence[np.ndarray]] | None = None,
    cache_dir: Path | None = None,
) -> dict[str, ErrorModel]:
    """The spec's error model for every calibrated NN, in the metric its ``error_metric`` declares.

    ``residuals`` (NN -> residual sequences) fit the models to real NNs; a model that
    declares ``needs_residuals`` (:class:`qaopt.calibrate.ErrorModelType`) without them
    uses the spec's reference NNs' residuals and true values, and so does every model of
    a detector (a class metric), for the ratio of its false alarms to its misses.
    """
    residuals = dict(residuals or {})
    models: dict[str, ErrorModel] = {}
    name = spec.calibration.error_model
    try:
        fitted = ERROR_MODELS.lookup(name).needs_residuals
    except CalibrationError as exc:
        raise CalibrationError(f"{spec.source}: {exc}") from exc
    for nn in space_of(spec).nns:
        res, truths = residuals.get(nn), None
        # A detector's false alarms follow its misses at the reference NN's ratio under every model (codes are cheap).
        if res is None and (fitted or spec.nns[nn].error_metric.kind in CLASS_METRICS):
            res, truths = reference_residuals(spec, nn, cache_dir if cache_dir is not None else cache_dir_of(spec))
        try:
            models[nn] = make_error_model(name, spec.nns[nn].error_metric.kind, res, truths)
        except CalibrationError as exc:
            raise CalibrationError(f"{spec.source}: calibration.error_model {name} for nns.{nn}: {exc}") from exc
    return models


def build_calibration(
    spec: AppSpec,
    residuals: Mapping[str, Sequence[np.ndarray]] | None = None,
    evaluator: QoSEvaluator | None = None,
    cache_dir: str | Path | None = None,
    executor: Executor | None = None,
) -> Calibration:
    """The :class:`Calibration` a spec describes.

    ``residuals`` (NN -> residual sequences) fit the error model to real NNs; a fitted
    model (``empirical``, ``shaped``) without them uses the spec's reference NNs' residuals.
    ``evaluator`` replaces the spec's simulator (tests, a custom harness). ``executor``
    (:func:`qaopt.executor.open_executor`) runs the seed blocks; a worker builds the
    spec's simulator itself (:class:`qaopt.executor.SpecEvaluator`), or receives
    ``evaluator`` pickled when one is given.
    """
    from qaopt.executor import SpecEvaluator

    cache = Path(cache_dir) if cache_dir is not None else cache_dir_of(spec)
    models = error_models_of(spec, residuals, cache)
    remote = SpecEvaluator(spec) if evaluator is None else None
    evaluator = evaluator if evaluator is not None else make_evaluator(spec)
    # The simulator alone keys its runs: adding a field store must not discard them.
    return Calibration(evaluator, space_of(spec), models, goal_of(spec), acceptance_of(spec), cache,
                       simulator_key(spec, evaluator), seed=spec.calibration.seed,
                       certifier=spec.calibration.certifier, executor=executor, remote_evaluator=remote,
                       limits=limits_of(spec))


def calibrate_spec(
    spec: AppSpec,
    strategy: str | None = None,
    budget: int | None = None,
    out: str | Path | None = None,
    evidence: Sequence[Evidence] = (),
    progress: Callable[[Progress], None] | None = None,
    calibration: Calibration | None = None,
    info: Mapping[str, Any] | None = None,
    plot_axes: Sequence[str] | None = None,
    plot_at: Mapping[str, float] | None = None,
) -> tuple[ErrorRegion, Path]:
    """Run the spec's calibration (strategy/budget overridable) and write region.json + region.png to ``out``.

    Returns the region and the folder. Re-running resumes: every finished seed
    block is read back from the cache. ``region.json`` is written atomically, once,
    with ``info`` (e.g. the key ``optimize`` reuses it under) among its details:
    this is its only writer. ``plot_axes`` and ``plot_at`` choose the plot's axes and
    the levels of the others (:func:`qaopt.calibrate.plot.plot_region`); they are
    checked before any run, so a typo costs no simulation.
    """
    cal = calibration or build_calibration(spec)
    slice_levels(cal.space, plotted_axes(cal.space, plot_axes), plot_at)  # the plot options, checked before any run
    region = cal.search(strategy or spec.calibration.strategy, spec.calibration.budget if budget is None else budget,
                        evidence=evidence, progress=progress, runs=spec.calibration.runs)
    region.info.update({"app": spec.app.name, "spec": str(spec.source or ""), **(info or {})})
    folder = Path(out) if out is not None else Path(spec.output.dir)
    region.save(folder / "region.json")
    region.plot(folder / "region.png", plot_axes, plot_at)
    return region, folder


def plot_spec_region(
    spec: AppSpec,
    out: str | Path | None = None,
    axes: Sequence[str] | None = None,
    fixed: Mapping[str, float] | None = None,
) -> Path:
    """Redraw ``region.png`` from the ``region.json`` already in ``out`` (default: the spec's output.dir).

    Runs no simulator: choosing other axes or levels should not cost a calibration.
    """
    folder = Path(out) if out is not None else Path(spec.output.dir)
    path = folder / "region.json"
    if not path.exists():
        raise CalibrationError(f"{path}: no region to plot; run `qaopt calibrate {spec.source or 'SPEC'}` first, "
                               "or give --out the folder that holds region.json")
    return ErrorRegion.load(path).plot(folder / "region.png", axes, fixed)
