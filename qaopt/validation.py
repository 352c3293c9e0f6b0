"""Closed-loop validation: the approximated NNs themselves drive the application.

The region was charted with *injected* errors; a real pruned or quantized NN errs
in its own way (bias, correlation over frames, failure on particular scenes). So a
configuration is accepted only after the application ran with the real NNs in the
loop over many seeds and met its QoS goal at the spec's confidence, and the report
says how often the region's prediction agreed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from qaopt.app_spec import AppSpec, QaoptError
from qaopt.calibrate import AcceptanceTest, QoSGoal, Verdict
from qaopt.result import Validation

VALIDATION_SEED_BASE = 1_000_000
"""Validation seeds are disjoint from calibration's, so no run is reused across the two."""


class PerceptionEvaluator(Protocol):
    """An application that can run with real NNs reading its sensor frames.

    ``nns`` maps NN names to callables from a batch of inputs to a batch of outputs;
    NNs left out get perfect perception. Returns one metrics mapping per seed.
    """

    def evaluate_perception(
        self, nns: Mapping[str, Callable[[np.ndarray], np.ndarray]], seeds: Sequence[int]
    ) -> list[dict[str, float]]: ...


def validate_closed_loop(
    evaluator: object,
    nns: Mapping[str, Callable[[np.ndarray], np.ndarray]],
    spec: AppSpec,
    runs: int,
    *,
    trial: int | None,
    region_predicted_valid: bool,
    seed_base: int = VALIDATION_SEED_BASE,
) -> Validation:
    """Run ``runs`` seeded closed-loop episodes with ``nns`` and judge them with the spec's acceptance test."""
    if not hasattr(evaluator, "evaluate_perception"):
        raise QaoptError(
            f"evaluator.simulator: {type(evaluator).__name__} has no evaluate_perception(nns, seeds); closed-loop "
            "validation needs the application to run with real NNs in the loop"
        )
    goal = QoSGoal(spec.qos.metric, spec.qos.max, spec.qos.min)
    a = spec.qos.acceptance
    test = AcceptanceTest(a.max_failure_rate, a.confidence, a.min_trials, a.max_trials)
    records = evaluator.evaluate_perception(dict(nns), [seed_base + i for i in range(runs)])
    passed = [goal.passes(r[spec.qos.metric]) for r in records]
    failures = passed.count(False)
    verdict = test.decide_fixed(failures, len(records))
    return Validation(
        trial=trial,
        runs=len(records),
        passes=len(records) - failures,
        failures=failures,
        verdict=verdict.value if isinstance(verdict, Verdict) else str(verdict),
        accepted=verdict == Verdict.VALID,
        region_predicted_valid=region_predicted_valid,
        qos_metric_mean=float(np.mean([r[spec.qos.metric] for r in records])),
        totals={k: float(sum(r[k] for r in records)) for k in records[0]} if records else {},
    )
