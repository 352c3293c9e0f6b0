"""Errors of the LaneKeep simulator, each naming the parameter or NN at fault."""

from __future__ import annotations

from ..errors import AppParamError, AppPerceptionError


class LaneKeepParamError(AppParamError):
    """A simulator, road, car, camera or driving-stack parameter is out of its valid range."""

    app = "lanekeep"


class PerceptionError(AppPerceptionError):
    """An injector or perception NN returned something the driving stack cannot use."""

    app = "lanekeep"
