"""qaopt: quality-aware optimization of applications that chain several neural networks.

It finds how much error each NN may make before the application fails its QoS goal
(:mod:`qaopt.calibrate`), then searches pruning and quantization inside that region
(:mod:`qaopt.approx`), judged by latency measured on the target (:mod:`qaopt.kernels`).

- :func:`optimize`: the whole pipeline on a spec;
- :func:`load_artifacts`: the chosen NNs of a finished run as torch modules, in one call;
- :func:`check_application`: whether an application (your simulator) keeps the
  protocol qaopt runs it through (:class:`qaopt.calibrate.Application`).

Importing :mod:`qaopt` is light on purpose: the field-logging API runs on a robot's
small computer without torch or TVM, so heavy modules are imported where used.
"""

from qaopt.app_spec import dtype_runners
from qaopt.app_spec.lazy import lazy_exports

__version__ = "0.3.0"
__all__ = ["check_application", "load_artifacts", "optimize"]


# qaopt.check_application and qaopt.load_artifacts, imported on first use.
__getattr__, __dir__ = lazy_exports(__name__, {"check_application": "qaopt.application",
                                               "load_artifacts": "qaopt.stages.export"})


def _backends_running(dtype: str) -> tuple[str, ...]:
    """The backends whose declarations say they run ``dtype`` (:func:`qaopt.kernels.backends_running`).

    Imported on the first question (a search's, a build's), so that ``import qaopt`` stays light.
    """
    from qaopt.kernels import backends_running  # registers the built-in backends

    return backends_running(dtype)


# approx's quantization pass asks which backends run a dtype; the backends of kernels declare it.
dtype_runners.provide(_backends_running)


def optimize(spec, **overrides):
    """Run the whole pipeline on ``spec`` (an :class:`~qaopt.app_spec.AppSpec` or a YAML path).

    Returns a :class:`~qaopt.result.Result`, the content of ``result.json``; see
    :func:`qaopt.optimizer.optimize` for the overrides (``profile``, ``out``, ``storage``,
    ``trials``). Imported on call, so that ``import qaopt`` stays light.
    """
    from qaopt.optimizer import optimize as run

    return run(spec, **overrides)
