"""Field trials: log real QoS runs from the robot, keep them safe, feed them to calibration.

The logging API is light on purpose (standard library, pydantic, SQLAlchemy; never
torch or TVM) so that it runs on the robot's own computer::

    from qaopt.field import Run

    with Run("field.db", "cropfollow", conditions={"crop": "corn"}) as run:
        run.progress(10.0)
        run.event("collision", distance_m=12.4)

Summaries, import/export and calibration evidence live in submodules that the CLI
(``qaopt field ...``) imports when it needs them.
"""

from .errors import (
    FieldDataWarning,
    FieldError,
    FieldValueError,
    ImportRowsError,
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

__all__ = [
    "COLLISION",
    "EXCLUDED",
    "INTERVENTION",
    "NOTE",
    "PROGRESS",
    "Attachment",
    "Conditions",
    "Configuration",
    "Event",
    "FieldDataWarning",
    "FieldError",
    "FieldValueError",
    "ImportRowsError",
    "RowProblem",
    "Run",
    "RunRecord",
    "Store",
    "StoreVersionError",
]
