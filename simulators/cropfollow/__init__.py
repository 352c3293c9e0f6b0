"""CropFollow: an under-canopy robot that keeps to the centre of a crop row.

Two perception NNs (heading in degrees; lateral position as d_left / (d_left +
d_right)) feed a model-predictive controller. This package is the shipped example
application of qaopt:

- :class:`CropFollowEvaluator`: closed-loop runs and their QoS, with injected
  errors (``evaluate``: fast, batched, no rendering) or with NNs reading rendered
  frames (``evaluate_perception``); :func:`run_episode` for one run;
- :func:`reference_nn` and :func:`reference_dataset`: the trained perception NNs
  and their labelled frames;
- the Gymnasium environment ``qaopt/CropFollow-v0`` (registered on import).

Importing it does not import torch.
"""

from .config import NN_NAMES, CameraParams, ControllerParams, FieldParams, RobotParams, SimConfig
from .dataset import ReferenceDataset, reference_dataset
from .env import ENV_ID, CropFollowEnv, register
from .errors import CropFollowParamError, PerceptionError
from .evaluator import CropFollowEvaluator, run_episode
from ..perception import torch_perception
from .reference import reference_nn, reference_report

register()

__all__ = [
    "ENV_ID",
    "NN_NAMES",
    "CameraParams",
    "ControllerParams",
    "CropFollowEnv",
    "CropFollowEvaluator",
    "CropFollowParamError",
    "FieldParams",
    "PerceptionError",
    "ReferenceDataset",
    "RobotParams",
    "SimConfig",
    "reference_dataset",
    "reference_nn",
    "reference_report",
    "run_episode",
    "torch_perception",
]
