"""Field trials: log real QoS runs from the robot, keep them safe, feed them to calibration.

The logging API is light on purpose (standard library, pydantic, SQLAlchemy; never
torch or TVM) so that it runs on the robot's own computer::

    from qaopt.field import Run

    with Run("field.db", "cropfollow", conditions={"crop": "corn"}) as run:
        run.progress(10.0)
        run.event("collision", distance_m=12.4)

Summaries, import/export and calibration evidence live in submodules that the CLI
(``qaopt field ...``) imports when it needs them. Reading ROS 2 bags (``import_bag``,
``import_spec_bag``, ``read_bag``, :mod:`qaopt.field.bag`) loads on first use, with the MCAP
reader, so that logging never pays for it.
"""

from typing import TYPE_CHECKING

from qaopt.app_spec.lazy import lazy_exports

from .errors import (
    FieldDataWarning,
    FieldError,
    FieldValueError,
    ImportRowsError,
    MessageProblem,
    RowProblem,
    StoreVersionError,
)
from .records import (
    COLLISION,
    EXCLUDED,
    INTERVENTION,
    NOTE,
    PROGRESS,
    Attachment,
    Conditions,
    Configuration,
    Event,
    RunRecord,
)
from .run import Run
from .store import Store

_LAZY = {
    "BagMappingError": ".bag",
    "import_bag": ".bag",
    "import_spec_bag": ".bag",
    "read_bag": ".bag",
}

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from .bag import BagMappingError, import_bag, import_spec_bag, read_bag

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "COLLISION",
    "EXCLUDED",
    "INTERVENTION",
    "NOTE",
    "PROGRESS",
    "Attachment",
    "BagMappingError",
    "Conditions",
    "Configuration",
    "Event",
    "FieldDataWarning",
    "FieldError",
    "FieldValueError",
    "ImportRowsError",
    "MessageProblem",
    "RowProblem",
    "Run",
    "RunRecord",
    "Store",
    "StoreVersionError",
    "import_bag",
    "import_spec_bag",
    "read_bag",
]
