"""An NN's error: its residuals, the metrics a spec may declare, and the coordinates of an error space.

This is the one definition every component uses: :mod:`qaopt.approx` measures a
candidate's error metric on its validation data with it, :mod:`qaopt.calibrate`
scales injected errors to a target metric and places measured residuals in the
error space with it, and the spec's ``error_metric.kind`` accepts exactly
:data:`METRIC_KINDS`.

- ``residuals``: the signed errors ``prediction - truth`` of one output, in its unit.
- ``l1``: mean absolute residual; ``mse``: mean squared residual; ``rmse``: its
  square root; ``max_abs``: the largest absolute residual.
- An error-space axis bounds one coordinate of an NN's error (:data:`COMPONENTS`):
  its declared ``metric``, or the ``bias`` (|mean residual|) or ``sigma`` (standard
  deviation) of its residuals.

numpy is imported where used, so that reading a spec stays light.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, get_args

from .errors import QaoptError

if TYPE_CHECKING:
    import numpy as np

MetricKind = Literal["l1", "rmse", "mse", "max_abs"]
METRIC_KINDS: tuple[str, ...] = get_args(MetricKind)
"""The NN error metrics, as ``nns.<name>.error_metric.kind`` names them."""

SCALE_DEGREE = {"l1": 1, "rmse": 1, "mse": 2, "max_abs": 1}
"""``metric(s * residuals) == s ** degree * metric(residuals)`` for a scale ``s >= 0``."""

Component = Literal["metric", "bias", "sigma"]
COMPONENTS: tuple[str, ...] = get_args(Component)
"""The coordinates of an NN's error that an error-space axis can bound."""


def check_metric(kind: str) -> None:
    if kind not in METRIC_KINDS:
        raise QaoptError(f"error metric {kind!r} is unknown; use one of {', '.join(METRIC_KINDS)}")


def residuals(pred: np.ndarray, truth: np.ndarray, column: int = 0) -> np.ndarray:
    """Signed errors ``pred - truth`` of output ``column`` (arrays of shape ``(N, outputs)``), in float64."""
    import numpy as np

    return np.asarray(pred)[:, column].astype(np.float64) - np.asarray(truth)[:, column].astype(np.float64)


def error_metric(kind: str, residuals: np.ndarray) -> float:
    """The error metric ``kind`` of residuals (any shape; every value counts once)."""
    import numpy as np

    check_metric(kind)
    r = np.asarray(residuals, dtype=np.float64)
    if kind == "l1":
        return float(np.mean(np.abs(r)))
    if kind == "max_abs":
        return float(np.max(np.abs(r)))
    mse = float(np.mean(r**2))
    return mse if kind == "mse" else math.sqrt(mse)


def error_coordinate(component: str, kind: str, residuals: np.ndarray) -> float:
    """One coordinate of an error space for these residuals: the metric ``kind``, the bias or the sigma."""
    import numpy as np

    r = np.asarray(residuals, dtype=np.float64).ravel()
    if component == "metric":
        return error_metric(kind, r)
    if component == "bias":
        return abs(float(r.mean()))
    if component == "sigma":
        return float(r.std())
    raise QaoptError(f"error component {component!r} is unknown; use one of {', '.join(COMPONENTS)}")


def axis_name(nn: str, component: str) -> str:
    """An error-space axis' name in regions and reports: ``heading`` for the NN's metric, else ``heading.sigma``."""
    return nn if component == "metric" else f"{nn}.{component}"
