"""The application spec: the YAML schema of a multi-NN application, its loading and its errors.

>>> from qaopt.app_spec import load
>>> spec = load("examples/cropfollow.yaml")      # doctest: +SKIP
>>> spec.nns["heading"].error_metric.kind        # doctest: +SKIP
'l1'
"""

from typing import TYPE_CHECKING

# The light part is imported now: errors and hashes, which the field log on a robot uses
# without PyYAML. The spec's loader and schema load on first use (PEP 562), so that
# `import qaopt.app_spec.errors` never pulls in the YAML loader.
from .errors import Problem, QaoptError, SpecError
from .hashing import content_hash, file_hash
from .lazy import lazy_exports

_LAZY = {
    "EntryPointError": ".entrypoints",
    "load_entry_point": ".entrypoints",
    "load": ".loader",
    "AppSpec": ".schema",
    "Axis": ".schema",
    "CalibrationSpec": ".schema",
    "NNSpec": ".schema",
    "PassSections": ".schema",
    "QoSSpec": ".schema",
    "TargetSpec": ".schema",
}

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from .entrypoints import EntryPointError, load_entry_point
    from .loader import load
    from .schema import AppSpec, Axis, CalibrationSpec, NNSpec, PassSections, QoSSpec, TargetSpec


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "AppSpec",
    "Axis",
    "CalibrationSpec",
    "EntryPointError",
    "NNSpec",
    "PassSections",
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
