"""Example applications that qaopt optimizes, each runnable closed-loop in simulation.

An application here is a package that offers qaopt the application protocol
(:class:`qaopt.calibrate.Application`): the names of its NNs, runs under injected
NN errors (``evaluate``, what calibration needs) and runs with real NNs in the
loop (``evaluate_perception``, what closed-loop validation needs). Beside it, a
package ships what its NNs are trained and measured on (data generation, the
reference NNs) and, where useful, a Gymnasium environment.

- :mod:`qaopt.simulators.cropfollow`: an under-canopy robot that keeps to the centre
  of a crop row with two perception CNNs and a model-predictive controller (the
  shipped example, ``examples/cropfollow.yaml``).

An application may use :mod:`qaopt.calibrate`'s protocols and nothing else of
qaopt, so it stays usable on its own; ``qaopt.check_application`` (and ``qaopt
validate`` on a spec that names it) checks that it keeps the protocol.
"""
