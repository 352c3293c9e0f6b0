"""CropFollow: an under-canopy robot following a crop row with two perception NNs.

``CropFollowEvaluator`` runs it closed-loop (error injection or NNs in the loop)
and reports QoS per seed.
"""

from .config import CameraParams, ControllerParams, FieldParams, RobotParams, SimConfig
from .errors import CropFollowParamError, PerceptionError
from .evaluator import NN_NAMES, CropFollowEvaluator

__all__ = [
    "NN_NAMES",
    "CameraParams",
    "ControllerParams",
    "CropFollowEvaluator",
    "CropFollowParamError",
    "FieldParams",
    "PerceptionError",
    "RobotParams",
    "SimConfig",
]
