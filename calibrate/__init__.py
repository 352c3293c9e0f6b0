"""Calibration: how much error may each NN make before the application fails its QoS goal?

Errors are injected into the NN outputs of the running application (an
:class:`QoSEvaluator`), each point of the NN-error space is accepted or rejected
by a sequential statistical test, and a search strategy charts the valid region
(:class:`ErrorRegion`) in few evaluations::

    cal = Calibration(evaluator, ErrorSpace([Axis("heading", 30.0), Axis("distance", 0.25)]),
                      {"heading": Gaussian(), "distance": Gaussian()},
                      QoSGoal("collisions_per_100m", max=0.0), AcceptanceTest(), cache_dir, app_key)
    region = cal.search("monotone", budget=20)
    region.contains({"heading": 4.0, "distance": 0.05})
"""

from qaopt.calibrate.acceptance import AcceptanceTest, QoSGoal, Verdict
from qaopt.calibrate.calibration import Calibration, Progress
from qaopt.calibrate.error_models import AR1, Empirical, ErrorModel, Gaussian, error_metric, make_error_model
from qaopt.calibrate.errors import CalibrationError
from qaopt.calibrate.protocols import Injector, QoSEvaluator
from qaopt.calibrate.region import ErrorRegion, Evidence, Observation
from qaopt.calibrate.space import Axis, ErrorSpace
from qaopt.calibrate.strategies import STRATEGIES, Strategy, make_strategy

__all__ = [
    "AR1", "AcceptanceTest", "Axis", "Calibration", "CalibrationError", "Empirical", "ErrorModel",
    "ErrorRegion", "ErrorSpace", "Evidence", "Gaussian", "Injector", "Observation", "Progress",
    "QoSEvaluator", "QoSGoal", "STRATEGIES", "Strategy", "Verdict", "error_metric", "make_error_model",
    "make_strategy",
]
