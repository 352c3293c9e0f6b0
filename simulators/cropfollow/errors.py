"""Errors of the CropFollow simulator, each naming the parameter or NN at fault."""

from __future__ import annotations

from qaopt.app_spec.errors import QaoptError


class CropFollowParamError(QaoptError, ValueError):
    """A simulator, world, camera or controller parameter is out of its valid range."""

    def __init__(self, param: str, message: str):
        self.param = param
        super().__init__(f"cropfollow parameter '{param}': {message}")


class PerceptionError(QaoptError, ValueError):
    """An injector or perception NN returned something the controller cannot use."""

    def __init__(self, nn: str, message: str):
        self.nn = nn
        super().__init__(f"cropfollow NN '{nn}': {message}")
