"""Speedups with their uncertainty: no gain is claimed that the samples do not show."""

from __future__ import annotations

import numpy as np

from qaopt.report import format_latency
from qaopt.result import NO_DIFFERENCE, Configuration, Latency, NNChoice, Speedups, SpeedupInterval


def _samples(median: float, jitter: float, n: int = 15, seed: int = 0) -> list[float]:
    return list(median + np.random.default_rng(seed).uniform(-jitter, jitter, n))


def _config(candidate: str, samples: list[float], epoch: str = "e1", trusted: bool = True) -> Configuration:
    ms = float(np.median(samples))
    nn = NNChoice(knobs={}, candidate=candidate, error=0.1, metric="l1", backend="onnxruntime", latency_ms=ms,
                  memory_bytes=None, macs=1, params=1)
    latency = Latency(ci_ms=(min(samples), max(samples)), samples_ms=[samples], trusted=trusted,
                      untrusted="" if trusted else "other processes took 60 % of the measured cores", epoch=epoch)
    return Configuration(nns={"nn": nn}, schedule="sequential", latency_ms=ms, memory_bytes=None, errors={},
                         in_region=True, latency=latency)


def test_an_interval_that_includes_one_is_no_measurable_difference():
    slow = _config("a", _samples(1.00, 0.10, seed=1))
    fast = _config("b", _samples(0.98, 0.10, seed=2))
    interval = SpeedupInterval.of(slow, fast)
    assert interval.ci[0] <= 1.0 <= interval.ci[1]
    assert interval.verdict == NO_DIFFERENCE


def test_a_clear_difference_is_a_gain_with_its_interval():
    interval = SpeedupInterval.of(_config("a", _samples(2.0, 0.05)), _config("b", _samples(1.0, 0.05)))
    assert interval.verdict == "faster"
    assert 1.0 < interval.ci[0] <= 2.0 <= interval.ci[1]


def test_the_same_nns_on_both_sides_are_never_a_gain():
    # The case: the agnostic configuration was the reference itself, yet reported 1.12x faster.
    reference = _config("ref", _samples(0.50, 0.001))
    agnostic = _config("ref", _samples(0.45, 0.001))
    speedups = Speedups.of(reference, aware=None, agnostic=agnostic)
    assert speedups.intervals["agnostic"].verdict == NO_DIFFERENCE
    assert speedups.describe("agnostic").startswith(NO_DIFFERENCE)
    assert "same NNs" in speedups.describe("agnostic")


def test_figures_of_different_epochs_are_not_compared():
    interval = SpeedupInterval.of(_config("a", _samples(2.0, 0.01), epoch="e1"),
                                  _config("b", _samples(1.0, 0.01), epoch="e2"))
    assert interval.verdict == "not comparable"
    assert interval.ci is None


def test_the_aware_over_agnostic_figure_carries_its_interval():
    reference = _config("ref", _samples(3.0, 0.05))
    agnostic = _config("int8", _samples(1.5, 0.05, seed=3))
    aware = _config("pruned", _samples(1.0, 0.05, seed=4))
    speedups = Speedups.of(reference, aware, agnostic)
    text = speedups.describe("aware_over_agnostic")
    assert speedups.intervals["aware_over_agnostic"].verdict == "faster"
    assert "95 % interval" in text and text.startswith(f"{speedups.aware_over_agnostic:.2f}x")


def test_an_untrusted_side_is_said_so():
    interval = SpeedupInterval.of(_config("a", _samples(2.0, 0.05), trusted=False), _config("b", _samples(1.0, 0.05)))
    assert "untrusted" in interval.note


def test_a_result_without_intervals_still_reads_and_formats():
    config = Configuration.model_validate({
        "nns": {}, "schedule": "sequential", "latency_ms": 1.5, "memory_bytes": None, "errors": {}, "in_region": True})
    assert config.latency is None and format_latency(config.latency_ms, config.latency) == "1.50"
    assert Speedups(aware=1.2).describe("aware") == "1.20x"


def test_the_report_flags_an_untrusted_latency():
    config = _config("a", _samples(1.0, 0.05), trusted=False)
    assert format_latency(config.latency_ms, config.latency).endswith("(untrusted)")


def test_the_gain_over_the_baseline_by_point_error_is_reported_beside_the_tested_one(tmp_path):
    """Where the tolerance test's data held an agnostic NN back, the report gives aware over the baseline that admits
    it too, with its interval, and shows that baseline's row and NNs, said to be unvalidated."""
    from qaopt.report import write_report
    from qaopt.result import Fidelity, Result, StudySummary

    reference = _config("ref", _samples(3.0, 0.05))
    agnostic = _config("bf16", _samples(1.5, 0.05, seed=3))
    by_point = _config("int8", _samples(1.2, 0.05, seed=5))
    aware = _config("merged", _samples(1.0, 0.05, seed=4))
    speedups = Speedups.of(reference, aware, agnostic, by_point)
    assert speedups.aware_over_agnostic_by_point < speedups.aware_over_agnostic
    assert speedups.intervals["aware_over_agnostic_by_point"].verdict == "faster"
    assert Speedups.of(reference, aware, agnostic).aware_over_agnostic_by_point is None

    result = Result(app="tiny", spec="tiny.yaml", spec_hash="0", profile="quick", run_dir=tmp_path,
                    reference=reference, aware=aware, agnostic=agnostic, agnostic_by_point=by_point,
                    speedups=speedups, validations=[], fidelity=Fidelity.of(None, []),
                    studies={"aware": StudySummary(name="aware", trials_complete=0, trials_failed=0,
                                                   trials_feasible=0)},
                    region=tmp_path / "region.json", report=tmp_path / "report.md")
    text = write_report(result, tmp_path).read_text()
    assert f"awareness gains {speedups.describe('aware_over_agnostic_by_point')}" in text
    assert "| application-agnostic by point error (each NN inside its bound by its point error) |" in text
    assert f"{reference.latency_ms / by_point.latency_ms:.2f}x (not validated)" in text
    assert "### application-agnostic by point error" in text
    assert Result.model_validate_json(result.model_dump_json()).agnostic_by_point == by_point
