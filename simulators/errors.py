"""The two errors every example application raises, each naming the parameter or NN at fault.

An application subclasses both and sets ``app``, its name in the messages, so a
user catches its own ``...ParamError`` / ``PerceptionError`` and reads which
application refused what.
"""

from __future__ import annotations

from qaopt.app_spec.errors import QaoptError


class AppParamError(QaoptError, ValueError):
    """A simulator parameter is out of its valid range."""

    app = "application"

    def __init__(self, param: str, message: str):
        self.param = param
        super().__init__(f"{self.app} parameter '{param}': {message}")


class AppPerceptionError(QaoptError, ValueError):
    """An injector or perception NN returned something the application cannot use."""

    app = "application"

    def __init__(self, nn: str, message: str):
        self.nn = nn
        super().__init__(f"{self.app} NN '{nn}': {message}")
