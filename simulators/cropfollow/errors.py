"""Errors of the CropFollow simulator, each naming the parameter or NN at fault."""

from __future__ import annotations

from ..errors import AppParamError, AppPerceptionError


class CropFollowParamError(AppParamError):
    """A simulator, world, camera or controller parameter is out of its valid range."""

    app = "cropfollow"


class PerceptionError(AppPerceptionError):
    """An injector or perception NN returned something the controller cannot use."""

    app = "cropfollow"
