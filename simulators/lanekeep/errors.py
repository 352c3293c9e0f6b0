"""Errors of the LaneKeep simulator, each naming the parameter or NN at fault."""

from __future__ import annotations

from qaopt.app_spec.errors import QaoptError


class LaneKeepParamError(QaoptError, ValueError):
    """A simulator, road, car, camera or driving-stack parameter is out of its valid range."""

    def __init__(self, param: str, message: str):
        self.param = param
        super().__init__(f"lanekeep parameter '{param}': {message}")


class PerceptionError(QaoptError, ValueError):
    """An injector or perception NN returned something the driving stack cannot use."""

    def __init__(self, nn: str, message: str):
        self.nn = nn
        super().__init__(f"lanekeep NN '{nn}': {message}")
