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

The names below are imported on first use, so an application that declares the
protocols of :mod:`qaopt.calibrate.protocols` does not pay for scipy and scikit-learn.

Error models, region strategies and certifiers are open registries
(``register_error_model``, ``register_strategy``, ``register_certifier``): a spec names
what they hold, and a plugin module adds to them (docs/extending.md).
"""

from __future__ import annotations

from qaopt.app_spec.lazy import lazy_exports

_EXPORTS = {
    "acceptance": ("AcceptanceTest", "QoSGoal", "SequentialTest", "Verdict"),
    "app_calls": ("AppFailure", "ApplicationFault", "RunLimits", "call_application"),
    "blocks": ("BlockCache", "run_blocks"),
    "calibration": ("Calibration", "Progress"),
    "certifiers": ("CERTIFIERS", "Certifier", "ValidityModel", "register_certifier", "unregister_certifier"),
    "error_models": ("AR1", "AR1Profile", "ERROR_MODELS", "Empirical", "ErrorModel", "ErrorModelType", "Gaussian", "make_error_model",
                     "register_error_model", "unregister_error_model"),
    "errors": ("CalibrationError",),
    "protocols": ("Application", "Injector", "Perception", "QoSEvaluator", "Recorder", "Recording"),
    "region": ("ErrorRegion", "Evidence", "Observation"),
    "space": ("Axis", "ErrorSpace"),
    "strategies": ("STRATEGIES", "Strategy", "StrategyFactory", "make_strategy", "register_strategy",
                   "unregister_strategy"),
}
_MODULE_OF = {name: f".{module}" for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)
