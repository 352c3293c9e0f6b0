"""Tuning-cost control: survey tuning into a shared database, hits for repeated shapes, cold candidates skipped.

One tiny model and a handful of trials: the point is the bookkeeping, not the speed-up
(benchmarks/kernels_tuning.py measures that on the CropFollow NNs).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qaopt import kernels
from qaopt.kernels import Target, TuningBudget
from qaopt.kernels.tuning import stop_reason


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1),
                               torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 1)).eval()


X = torch.rand(1, 3, 24, 24)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One survey-tuned build (8 trials), shared by the tests of this module."""
    cache = tmp_path_factory.mktemp("tuning-cache")
    model = _net(0)
    target = Target(backend="tvm", threads=1, tuning=TuningBudget(trials=8))
    return cache, model, kernels.compile(model, [X], target, cache_dir=cache)


def test_survey_tuning_reports_rounds_and_never_returns_the_slower_build(tuned):
    _, model, compiled = tuned
    report = compiled.tuning
    assert report.tasks >= 2 and report.hits == 0
    assert report.trials <= 8 and report.rounds and report.rounds[-1].trials == report.trials
    assert report.tuning_s > 0 and report.flops > 2 * 24 * 24 * 8 * 27
    assert report.stopped
    if report.chosen == "tuned":
        assert min(r.latency_ms for r in report.rounds) < report.untuned_ms
    else:
        assert min(r.latency_ms for r in report.rounds) >= report.untuned_ms
    with torch.no_grad():
        np.testing.assert_allclose(compiled.run()[0], model(X).numpy(), rtol=1e-4, atol=1e-5)


def test_shared_database_serves_a_candidate_with_the_same_shapes(tuned):
    cache, _, _ = tuned
    other = _net(1)  # other weights, same layer shapes: nothing left to tune
    compiled = kernels.compile(other, [X], Target(backend="tvm", threads=1, tuning=TuningBudget(trials=8)), cache_dir=cache)
    report = compiled.tuning
    assert report.hits == report.tasks and report.hit_rate == 1.0
    assert report.trials == 0 and report.stopped == "all tasks found in the shared database"
    with torch.no_grad():
        np.testing.assert_allclose(compiled.run()[0], other(X).numpy(), rtol=1e-4, atol=1e-5)


def test_cold_candidate_is_measured_untuned(tmp_path):
    big = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU()).eval()
    compiled = kernels.compile(big, [X], Target(backend="tvm", threads=1, tuning=TuningBudget(trials=8)),
                               cache_dir=tmp_path, incumbent_ms=1e-6)  # no kernel can beat a nanosecond
    report = compiled.tuning
    assert report.stopped.startswith("skipped: even at") and report.trials == 0 and report.chosen == "untuned"
    assert not (tmp_path / "tvm-tuning").exists() or not any((tmp_path / "tvm-tuning").rglob("*.log"))


@pytest.mark.parametrize("latencies, stops", [
    ([10.0, 9.0], False),             # too few rounds to judge
    ([10.0, 5.0, 4.0], False),        # the first round after the defaults gained 50 %: go on
    ([10.0, 5.0, 4.9, 4.85], True),   # 2 % then 1 %: stop
    ([10.0, 5.0, 4.9, 4.0], False),   # one slow round, then 18 %: go on
    ([10.0, 5.0, 6.0, 5.1], True),    # noise, no new best
    ([10.08, 7.47, 7.32, 6.97], True),  # BENCHMARKS.md run 2: 2.0 % then 4.8 %, stops at 37 % of the time
])
def test_survey_early_stop_rule(latencies, stops):
    assert bool(stop_reason(latencies, min_gain=0.05)) is stops


def test_meta_schedule_logger_set_up_survives_a_handler_without_a_name(tmp_path):
    """TVM's logger set-up failed on an unnamed handler (pytest's log capture put two there), ending tuning runs."""
    import logging

    from tvm.s_tir.meta_schedule.logging import create_loggers

    from qaopt.kernels.tuning import _meta_schedule_console

    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    handler = logging.NullHandler()  # an application's own handler: no name
    logger.addHandler(handler)
    try:
        with _meta_schedule_console(logging.WARNING):
            create_loggers(str(tmp_path), [{"log_dir": str(tmp_path), "logger_name": "tvm.s_tir.meta_schedule.x"}])
        assert handler in logger.handlers  # given back afterwards
    finally:
        logger.removeHandler(handler)


def test_native_warnings_go_to_the_tuning_log_and_python_output_to_the_console(tmp_path, capfd):
    """TVM's C++ warnings (written to descriptor 2) flooded optimize's console; Python's own lines must stay there."""
    import os
    import sys

    from qaopt.kernels.tuning import native_log

    log = tmp_path / "logs" / "native.log"
    with native_log(log):
        os.write(2, b"rewrite_tensorize.cc:50: Warning: Tensorize failed\n")
        print("the run's own line", file=sys.stderr)
    print("after", file=sys.stderr)
    err = capfd.readouterr().err
    assert "Tensorize" not in err and "the run's own line" in err and "after" in err
    assert "Tensorize failed" in log.read_text()
