"""Per-configuration summaries and their exact Poisson intervals."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from scipy.stats import chi2, poisson

from qaopt.field import RunRecord
from qaopt.field.summary import poisson_rate, summarize


@pytest.mark.parametrize("k", [0, 1, 3, 17, 400, 25_000])
def test_poisson_interval_matches_chi_square_form(k):
    rate = poisson_rate(k, 250.0, confidence=0.9)
    scale = 100.0 / 250.0
    low = chi2.ppf(0.05, 2 * k) / 2 if k else 0.0
    assert rate.low == pytest.approx(low * scale, rel=1e-9)
    assert rate.high == pytest.approx(chi2.ppf(0.95, 2 * k + 2) / 2 * scale, rel=1e-9)
    assert rate.value == pytest.approx(k * scale)


@pytest.mark.parametrize("k", [0, 2, 9])
def test_interval_bounds_have_the_exact_tail_probabilities(k):
    """At the upper bound, seeing <= k events has probability alpha/2 (Garwood's definition)."""
    rate = poisson_rate(k, 100.0, confidence=0.95)
    assert poisson.cdf(k, rate.high) == pytest.approx(0.025, abs=1e-9)
    if k:
        assert poisson.sf(k - 1, rate.low) == pytest.approx(0.025, abs=1e-9)


def test_zero_collisions_still_bounds_the_rate():
    r = poisson_rate(0, 300.0)
    assert r.value == 0.0 and r.low == 0.0 and r.high == pytest.approx(1.2296, abs=1e-4)
    assert poisson_rate(0, 0.0).high == float("inf")


def _rec(i, *, cfg="a", point=None, distance=100.0, collisions=0, status="complete"):
    t0 = datetime(2026, 6, 1, tzinfo=timezone.utc) + timedelta(hours=i)
    return RunRecord(
        id=f"r{i}", application="app", config={"hash": cfg, "nn_errors": {"heading": 2.0}},
        error_point=point, started_at=t0, status=status,
        ended_at=None if status == "incomplete" else t0 + timedelta(minutes=6),
        distance_m=None if status == "incomplete" else distance,
        events=[{"kind": "progress", "distance_m": distance / 2}]
        + [{"kind": "collision", "distance_m": 5.0}] * collisions,
    )


def test_summarize_groups_by_configuration_and_error_point():
    recs = [_rec(0, collisions=1), _rec(1, distance=50.0), _rec(2, cfg="b", collisions=2),
            _rec(3, point={"heading": 10.0}, collisions=4), _rec(4, status="incomplete", collisions=1),
            _rec(5, status="aborted", distance=30.0, collisions=1)]
    rows = {(r.config_hash, r.point_label): r for r in summarize(recs)}
    a = rows[("a", "-")]
    assert (a.runs, a.left_out, a.distance_m, a.collisions.count) == (3, 1, 180.0, 2)
    assert a.collisions.value == pytest.approx(2 / 1.8)
    assert rows[("b", "-")].collisions.count == 2
    assert rows[("a", "heading=10")].collisions.value == pytest.approx(4.0)
    with_open = {(r.config_hash, r.point_label): r for r in summarize(recs, include_incomplete=True)}
    assert with_open[("a", "-")].distance_m == 180.0 + 50.0  # up to its last odometer reading
    assert with_open[("a", "-")].collisions.count == 3
