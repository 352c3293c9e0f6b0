"""Spec texts shared by several test files (a small `qaopt calibrate` spec on the synthetic app)."""

CALIBRATE_SPEC = """
app: {name: synthetic}
evaluator:
  simulator:
    entry_point: qaopt.calibrate.synthetic:SuperellipseApp
    params: {limits: {LIMITS}, steps: 300}
qos:
  metric: failed
  max: 0.0
  acceptance: {max_failure_rate: 0.05, confidence: 0.9, min_trials: 8, max_trials: 96}
nns:
  heading:
    model: qaopt.simulators.cropfollow:reference_nn
    input_shape: [1, 3, 240, 320]
    outputs: [{name: heading, unit: deg}]
    error_metric: {kind: l1, output: heading}
    data: {source: qaopt.simulators.cropfollow:reference_dataset}
  distance:
    model: qaopt.simulators.cropfollow:reference_nn
    input_shape: [1, 3, 240, 320]
    outputs: [{name: distance, unit: ratio}]
    error_metric: {kind: l1, output: distance}
    data: {source: qaopt.simulators.cropfollow:reference_dataset}
calibration:
  strategy: monotone
  budget: 6
  space:
    - {nn: heading, max: 15.0}
    - {nn: distance, max: 0.15}
"""
