"""Example applications that qaopt optimizes, each runnable closed-loop in simulation.

An application here is a package that offers qaopt the application protocol
(:class:`qaopt.calibrate.Application`): the names of its NNs, runs under injected
NN errors (``evaluate``, what calibration needs) and runs with real NNs in the
loop (``evaluate_perception``, what closed-loop validation needs). Beside it, a
package ships what its NNs are trained and measured on (data generation, the
reference NNs) and, where useful, a Gymnasium environment.

- :mod:`qaopt.simulators.cropfollow`: an under-canopy robot that keeps to the centre
  of a crop row with two perception CNNs and a model-predictive controller (the
  shipped example, ``examples/cropfollow.yaml``);
- :mod:`qaopt.simulators.lanekeep`: a car that keeps its lane, stops at stop signs and
  follows a lead vehicle with three perception NNs of two kinds (a lane regression, a
  stop-sign detector, a lead-distance regression) and a conventional stack between them
  and the actuators (``examples/lanekeep.yaml``).

:mod:`qaopt.simulators.hashrand` (counter-based random numbers and texture noise for compiled
kernels), :mod:`qaopt.simulators.frames` (camera frames stored as uint8, read as the NNs' float32),
:mod:`qaopt.simulators.params` (checked parameters from a spec's mappings),
:mod:`qaopt.simulators.dataset_store` (the reference NNs' cached labelled frames),
:mod:`qaopt.simulators.training` (their training loop and stored weights; imports torch),
:mod:`qaopt.simulators.perception`, :mod:`qaopt.simulators.errors` (the parameter and NN error bases),
:mod:`qaopt.simulators.closed_loop` (the evaluators' injection, perception and recording runs),
:mod:`qaopt.simulators.gym_env` (the Gymnasium envs' skeleton) and :mod:`qaopt.simulators.frenet`
(curvature paths and motion along them) serve both.

An application may use :mod:`qaopt.calibrate`'s protocols and nothing else of
qaopt, so it stays usable on its own; ``qaopt.check_application`` (and ``qaopt
validate`` on a spec that names it) checks that it keeps the protocol.
"""
