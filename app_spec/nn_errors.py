"""An NN's error: its per-frame errors, the metrics a spec may declare, and the coordinates of an error space.

This is the one definition every component uses: :mod:`qaopt.approx` measures a
candidate's error metric on its validation data with it, :mod:`qaopt.calibrate`
scales injected errors to a target metric and places measured errors in the
error space with it, and the spec's ``error_metric.kind`` accepts exactly
:data:`METRIC_KINDS`.

Regression NNs (:data:`REGRESSION_METRICS`):

- ``residuals``: the signed errors ``prediction - truth`` of one output, in its unit.
- ``l1``: mean absolute residual; ``mse``: mean squared residual; ``rmse``: its
  square root; ``max_abs``: the largest absolute residual.
- An error-space axis bounds one coordinate of an NN's error (:data:`COMPONENTS`):
  its declared ``metric``, or the ``bias`` (|mean residual|) or ``sigma`` (standard
  deviation) of its residuals.

NNs with a discrete output, detectors and binary classifiers (:data:`CLASS_METRICS`):
the output is a score (a probability) that the application compares with a decision
``threshold``; the truth is a 0/1 label (positive when ``>= 0.5``).

- Per-frame errors are *confusion codes* (:func:`confusion_codes`):
  :data:`TRUE_NEGATIVE` 0, :data:`TRUE_POSITIVE` 1, :data:`MISS` 2 (truth positive,
  output below the threshold), :data:`FALSE_ALARM` 3 (truth negative, output at or
  above it). They are floats like residuals, so every place that stores or passes an
  NN's per-drive errors (candidates, on-policy recordings, error-model fits) keeps working;
  :func:`frame_errors` gives either kind of per-frame error for a metric.
- ``miss_rate``: P(output < threshold | truth positive) = misses / (misses + true
  positives); ``false_alarm_rate``: P(output >= threshold | truth negative) = false
  alarms / (false alarms + true negatives). A rate whose conditioning class has no
  frame at all is 0.0 (no positive frame, no miss): frames of that class never
  occurred, so the NN made no error on them.
- Only the ``metric`` component exists for them (:data:`CLASS_COMPONENTS`): a bias or
  sigma of codes means nothing.

numpy is imported where used, so that reading a spec stays light.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, get_args

from .errors import QaoptError

if TYPE_CHECKING:
    import numpy as np

MetricKind = Literal["l1", "rmse", "mse", "max_abs", "miss_rate", "false_alarm_rate"]
METRIC_KINDS: tuple[str, ...] = get_args(MetricKind)
"""The NN error metrics, as ``nns.<name>.error_metric.kind`` names them."""

REGRESSION_METRICS: tuple[str, ...] = ("l1", "rmse", "mse", "max_abs")
"""Metrics of residuals ``prediction - truth``."""
CLASS_METRICS: tuple[str, ...] = ("miss_rate", "false_alarm_rate")
"""Metrics of a thresholded output against 0/1 labels, computed from confusion codes."""

SCALE_DEGREE = {"l1": 1, "rmse": 1, "mse": 2, "max_abs": 1}
"""``metric(s * residuals) == s ** degree * metric(residuals)`` for a scale ``s >= 0`` (regression metrics only:
a rate of codes does not scale)."""

Component = Literal["metric", "bias", "sigma"]
COMPONENTS: tuple[str, ...] = get_args(Component)
"""The coordinates of an NN's error that an error-space axis can bound."""
CLASS_COMPONENTS: tuple[str, ...] = ("metric",)
"""The coordinates a class metric's NN has: its rate (a bias or sigma of confusion codes means nothing)."""

TRUE_NEGATIVE, TRUE_POSITIVE, MISS, FALSE_ALARM = 0, 1, 2, 3
"""The confusion codes, a class NN's per-frame errors."""
CODES = (TRUE_NEGATIVE, TRUE_POSITIVE, MISS, FALSE_ALARM)
LABEL_THRESHOLD = 0.5
"""A truth is positive when ``>= LABEL_THRESHOLD`` (labels are 0/1)."""


def check_metric(kind: str) -> None:
    if kind not in METRIC_KINDS:
        raise QaoptError(f"error metric {kind!r} is unknown; use one of {', '.join(METRIC_KINDS)}")


def is_class_metric(kind: str) -> bool:
    """Whether ``kind`` is a detector/classifier metric (its per-frame errors are confusion codes)."""
    return kind in CLASS_METRICS


def confusion_codes(pred: np.ndarray, truth: np.ndarray, column: int = 0, threshold: float = 0.5) -> np.ndarray:
    """Confusion codes of output ``column`` (arrays of shape ``(N, outputs)``), in float64.

    The output says "positive" when ``>= threshold``; the truth is positive when ``>= 0.5``.
    """
    import numpy as np

    said = np.asarray(pred)[:, column] >= threshold
    true = np.asarray(truth)[:, column] >= LABEL_THRESHOLD
    codes = np.where(true, np.where(said, TRUE_POSITIVE, MISS), np.where(said, FALSE_ALARM, TRUE_NEGATIVE))
    return codes.astype(np.float64)


def frame_errors(kind: str, pred: np.ndarray, truth: np.ndarray, column: int = 0, threshold: float = 0.5) -> np.ndarray:
    """Per-frame errors for metric ``kind``: :func:`residuals` for a regression metric, :func:`confusion_codes` for a
    class metric (``threshold`` is the decision threshold on the output; regression metrics ignore it)."""
    check_metric(kind)
    if is_class_metric(kind):
        return confusion_codes(pred, truth, column, threshold)
    return residuals(pred, truth, column)


def _codes(values: np.ndarray, kind: str) -> np.ndarray:
    import numpy as np

    c = np.asarray(values, dtype=np.float64).ravel()
    if c.size and not np.isin(c, CODES).all():
        raise QaoptError(f"error metric {kind!r} is computed from confusion codes (0 true negative, 1 true positive, "
                         "2 miss, 3 false alarm), but got other values; measure the NN's errors with frame_errors")
    return c


def class_codes(kind: str) -> tuple[int, int]:
    """``(error, correct)``: the confusion codes of the frames a class metric is conditioned on (a miss rate counts
    misses among misses and true positives; a false-alarm rate, false alarms among them and true negatives)."""
    return (MISS, TRUE_POSITIVE) if kind == "miss_rate" else (FALSE_ALARM, TRUE_NEGATIVE)


def class_rate(kind: str, codes: np.ndarray) -> float:
    """``miss_rate`` or ``false_alarm_rate`` of confusion codes (any shape); 0.0 when no frame has the conditioning class."""
    import numpy as np

    c = _codes(codes, kind)
    err, ok = class_codes(kind)
    errors, n = int(np.count_nonzero(c == err)), int(np.count_nonzero((c == err) | (c == ok)))
    return errors / n if n else 0.0


def residuals(pred: np.ndarray, truth: np.ndarray, column: int = 0) -> np.ndarray:
    """Signed errors ``pred - truth`` of output ``column`` (arrays of shape ``(N, outputs)``), in float64."""
    import numpy as np

    return np.asarray(pred)[:, column].astype(np.float64) - np.asarray(truth)[:, column].astype(np.float64)


def error_metric(kind: str, residuals: np.ndarray) -> float:
    """The error metric ``kind`` of residuals, or of confusion codes for a class metric (any shape; every value
    counts once)."""
    import numpy as np

    check_metric(kind)
    if is_class_metric(kind):
        return class_rate(kind, residuals)
    r = np.asarray(residuals, dtype=np.float64)
    if kind == "l1":
        return float(np.mean(np.abs(r)))
    if kind == "max_abs":
        return float(np.max(np.abs(r)))
    mse = float(np.mean(r**2))
    return mse if kind == "mse" else math.sqrt(mse)


def other_class_metric(kind: str) -> str:
    """The class metric of the other error kind: ``false_alarm_rate`` for ``miss_rate`` and back."""
    check_metric(kind)
    return "false_alarm_rate" if kind == "miss_rate" else "miss_rate"


def class_coordinate(rate: float, other_rate: float, ratio: float | None) -> float:
    """A detector's place on its class-metric axis: the least declared rate ``m`` whose injected errors
    (``m`` of the declared kind and ``ratio * m`` of the other, :class:`qaopt.calibrate.confusion.Confusion`)
    are at least the detector's own of both kinds.

    A region charted with injected errors certifies a detector only where the injected detector errs at least as
    much in each direction. One whose declared rate is small but whose other kind's rate is far above
    ``ratio`` times it (LaneKeep's stop detector at input 0.9: misses 0.9 %, false alarms 33 times the
    reference's, all of them just before a sign comes into range, where they move the stop) erred more than any
    point the calibration ran at its declared rate, and sits where its other rate puts it. ``ratio`` 0 (the
    calibration injected none of the other kind): any such error is outside what was charted, at rate 1.
    ``None`` (no calibrated ratio known): the declared rate alone.
    """
    if ratio is None or other_rate <= 0:
        return rate
    return max(rate, 1.0 if ratio <= 0 else min(1.0, other_rate / ratio))


def error_coordinate(component: str, kind: str, residuals: np.ndarray, ratio: float | None = None) -> float:
    """One coordinate of an error space for these residuals (codes, for a class metric): the metric ``kind``, the
    bias or the sigma (regression metrics only). For a class metric, ``ratio`` is the calibrated error model's
    other-kind rate per declared one (:func:`class_coordinate`; ``None``: the declared rate alone)."""
    import numpy as np

    r = np.asarray(residuals, dtype=np.float64).ravel()
    if component == "metric":
        if is_class_metric(kind):
            return class_coordinate(class_rate(kind, r), class_rate(other_class_metric(kind), r), ratio)
        return error_metric(kind, r)
    if is_class_metric(kind) and component in COMPONENTS:
        raise QaoptError(f"error component {component!r} means nothing for the class metric {kind!r} (its per-frame "
                         "errors are confusion codes); use component 'metric'")
    if component == "bias":
        return abs(float(r.mean()))
    if component == "sigma":
        return float(r.std())
    raise QaoptError(f"error component {component!r} is unknown; use one of {', '.join(COMPONENTS)}")


def axis_name(nn: str, component: str) -> str:
    """An error-space axis' name in regions and reports: ``heading`` for the NN's metric, else ``heading.sigma``."""
    return nn if component == "metric" else f"{nn}.{component}"
