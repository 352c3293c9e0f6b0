"""The application spec: the YAML schema of a multi-NN application, its loading and its errors.

>>> from qaopt.app_spec import load
>>> spec = load("examples/cropfollow.yaml")      # doctest: +SKIP
>>> spec.nns["heading"].error_metric.kind        # doctest: +SKIP
'l1'
"""

from .entrypoints import EntryPointError, load_entry_point
from .errors import Problem, QaoptError, SpecError
from .hashing import content_hash, file_hash
from .loader import load
from .schema import (
    AppSpec,
    Axis,
    CalibrationSpec,
    KnobSpace,
    NNSpec,
    QoSSpec,
    TargetSpec,
)

__all__ = [
    "AppSpec",
    "Axis",
    "CalibrationSpec",
    "EntryPointError",
    "KnobSpace",
    "NNSpec",
    "Problem",
    "QaoptError",
    "QoSSpec",
    "SpecError",
    "TargetSpec",
    "content_hash",
    "file_hash",
    "load",
    "load_entry_point",
]
