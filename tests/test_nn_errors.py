"""One definition of an NN's error (app_spec.nn_errors), shared by the spec, approx and calibrate."""

from __future__ import annotations

import typing

import numpy as np
import pytest

from qaopt.app_spec import QaoptError, schema
from qaopt.app_spec.nn_errors import (
    CLASS_METRICS,
    COMPONENTS,
    METRIC_KINDS,
    REGRESSION_METRICS,
    SCALE_DEGREE,
    confusion_codes,
    error_coordinate,
    error_metric,
    residuals,
)
from qaopt.approx.target import ErrorMetric
from qaopt.calibrate import AcceptanceTest, Axis, ErrorRegion, ErrorSpace


def test_metrics_of_known_residuals():
    r = np.array([1.0, -2.0, 3.0])
    assert [error_metric(k, r) for k in REGRESSION_METRICS] == pytest.approx([2.0, np.sqrt(14 / 3), 14 / 3, 3.0])
    with pytest.raises(QaoptError, match="'huber' is unknown"):
        error_metric("huber", r)


@pytest.mark.parametrize("kind", REGRESSION_METRICS)
def test_scale_degree(kind):
    r = np.random.default_rng(0).standard_normal(100)
    assert error_metric(kind, 3.0 * r) == pytest.approx(3.0 ** SCALE_DEGREE[kind] * error_metric(kind, r))


def test_the_spec_approx_and_calibrate_use_the_same_lists_and_numbers():
    assert typing.get_args(schema.ErrorMetric.model_fields["kind"].annotation) == METRIC_KINDS
    assert typing.get_args(schema.Axis.model_fields["component"].annotation) == COMPONENTS
    pred = np.array([[0.5, 1.0], [2.0, 0.0], [1.0, 4.0]], np.float32)
    truth = np.array([[0.0, 1.5], [1.0, 0.5], [1.0, 1.0]], np.float32)
    r = residuals(pred, truth, column=1)
    assert r.dtype == np.float64 and list(r) == [-0.5, -0.5, 3.0]
    region = ErrorRegion(ErrorSpace([Axis("d", 5.0), Axis("h", 1.0, "sigma")]), AcceptanceTest(), metrics={"d": "rmse"})
    assert METRIC_KINDS == REGRESSION_METRICS + CLASS_METRICS
    for kind in REGRESSION_METRICS:
        assert ErrorMetric(kind, column=1)(pred, truth) == error_metric(kind, r)
    for kind in CLASS_METRICS:  # a detector's metric is a rate of its confusion codes
        codes = confusion_codes(pred, truth, column=1, threshold=0.75)
        assert ErrorMetric(kind, column=1, threshold=0.75)(pred, truth) == error_metric(kind, codes)
    assert region.errors_of({"d": r, "h": r}) == {"d": error_metric("rmse", r), "h.sigma": error_coordinate("sigma", "l1", r)}
    assert schema.Axis(nn="h", component="sigma", max=1.0).key == Axis("h", 1.0, "sigma").name == "h.sigma"
