"""LaneKeep: a camera-driven car that keeps its lane, stops at stop signs and follows a lead vehicle.

Three perception NNs read one front camera (160x120): ``lane`` (lateral offset of
the lane centre 8 m ahead), ``stop`` (probability that a stop line is within 25 m)
and ``lead`` (distance to the lead vehicle). Between them and the actuators sit the
parts a real stack has: pure-pursuit steering, an alpha-beta tracker and adaptive
cruise control, and a debounced stop state machine. The second shipped example
application of qaopt, beside CropFollow:

- :class:`LaneKeepEvaluator`: closed-loop runs and their QoS, with injected errors
  (``evaluate``: batched, compiled, no rendering) or with NNs reading rendered
  frames (``evaluate_perception``, ``record_perception``);
- :func:`reference_nn` and :func:`reference_dataset`: the trained perception NNs and
  their labelled frames;
- the Gymnasium environment ``qaopt/LaneKeep-v0`` (registered on import).

Importing it does not import torch.
"""

from .config import NN_NAMES, CameraParams, CarParams, RoadParams, SimConfig, StackParams
from .dataset import ReferenceDataset, reference_dataset
from .env import ENV_ID, LaneKeepEnv, register
from .errors import LaneKeepParamError, PerceptionError
from .evaluator import LaneKeepEvaluator, run_episode
from ..perception import torch_perception
from .reference import reference_nn, reference_report

register()

__all__ = [
    "ENV_ID",
    "NN_NAMES",
    "CameraParams",
    "CarParams",
    "LaneKeepEnv",
    "LaneKeepEvaluator",
    "LaneKeepParamError",
    "PerceptionError",
    "ReferenceDataset",
    "RoadParams",
    "SimConfig",
    "StackParams",
    "reference_dataset",
    "reference_nn",
    "reference_report",
    "run_episode",
    "torch_perception",
]
