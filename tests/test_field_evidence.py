"""Field runs as calibration evidence, and the plan of the next field trial."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from qaopt.calibrate import AcceptanceTest, Axis, ErrorRegion, ErrorSpace, Observation, QoSGoal, Verdict
from qaopt.calibrate.region import PER_POINT
from qaopt.field import FieldError, RunRecord
from qaopt.field.evidence import apply_evidence, certified_fraction, collect_evidence
from qaopt.field.plan import Candidate, plan, runs_needed

SPACE = ErrorSpace([Axis("heading", 30.0), Axis("distance", 0.25)])
GOAL = QoSGoal("collisions_per_100m", max=0.0)
T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)


def _run(i, *, point=None, nn_errors=None, collisions=0, status="complete", distance=100.0):
    return RunRecord(
        id=f"r{i}", application="cropfollow", config={"nn_errors": nn_errors or {}}, error_point=point,
        started_at=T0 + timedelta(hours=i), status=status,
        ended_at=None if status == "incomplete" else T0 + timedelta(hours=i, minutes=5),
        distance_m=None if status == "incomplete" else distance,
        events=[{"kind": "collision"}] * collisions)


def _sim_region() -> ErrorRegion:
    """A simulator staircase: valid up to heading 15 / distance 0.15 (a rectangle)."""
    region = ErrorRegion(SPACE, AcceptanceTest(), certifier=PER_POINT)
    for h, d, ok in [(15, 0.15, True), (18, 0.05, False), (5, 0.18, False), (10, 0.1, True), (20, 0.2, False)]:
        region.add(Observation({"heading": h, "distance": d}, 8 if ok else 0, 0 if ok else 8,
                               Verdict.VALID if ok else Verdict.INVALID))
    return region


def test_collect_evidence_pools_runs_per_point():
    runs = [_run(i, point={"heading": 12.0, "distance": 0.1}) for i in range(3)]
    runs += [_run(3, point={"heading": 12.0, "distance": 0.1}, collisions=1)]
    runs += [_run(4, nn_errors={"heading": 4.0, "distance": 0.03})]               # a deployed configuration
    runs += [_run(5, nn_errors={"heading": 4.0}, point={"distance": 0.2})]       # injected distance only
    runs += [_run(6, point={"heading": 1.0}),                                      # no distance error known
             _run(7, point={"heading": 1.0, "distance": 0.0}, status="aborted"),
             _run(8, point={"heading": 1.0, "distance": 0.0}, status="incomplete")]
    found = collect_evidence(runs, SPACE, GOAL)
    got = {tuple(e.errors.values()): (e.passes, e.failures, e.source) for e in found.evidence}
    assert got == {(12.0, 0.1): (3, 1, "field"), (4.0, 0.03): (1, 0, "field"), (4.0, 0.2): (1, 0, "field")}
    assert {u.run_id: u.reason.split(" ")[0] for u in found.unused} == {
        "r6": "no", "r7": "aborted", "r8": "incomplete"}
    assert sorted(found.runs[0] + found.runs[1] + found.runs[2]) == ["r0", "r1", "r2", "r3", "r4", "r5"]


def test_a_metric_the_field_does_not_measure_is_named():
    with pytest.raises(FieldError, match="qos.metric 'lap_time_s' is not measured by field runs"):
        collect_evidence([_run(0, point={"heading": 1.0, "distance": 0.0})], SPACE, QoSGoal("lap_time_s", max=3.0))


def test_field_failure_overturns_the_simulator_and_shrinks_the_region():
    region = _sim_region()
    inside = {"heading": 12.0, "distance": 0.12}
    assert region.contains(inside)
    share = certified_fraction(region)
    runs = [_run(0, point={"heading": 9.0, "distance": 0.09}, collisions=1)]  # 1 failure in 1 run: invalid
    changes = apply_evidence(region, collect_evidence(runs, SPACE, GOAL).evidence)
    assert not region.contains(inside)
    assert certified_fraction(region) < share
    overturned = {tuple(c.errors.values()) for c in changes if c.overturned}
    assert (10.0, 0.1) in overturned and (15.0, 0.15) in overturned
    assert all(c.after is False for c in changes)


def test_field_passes_confirm_without_change():
    region = _sim_region()
    runs = [_run(i, point={"heading": 10.0, "distance": 0.1}) for i in range(45)]
    changes = apply_evidence(region, collect_evidence(runs, SPACE, GOAL).evidence)
    assert changes == []  # confirmed, nothing overturned
    assert region.contains({"heading": 10.0, "distance": 0.1})


def test_runs_needed_follows_the_acceptance_test():
    region = ErrorRegion(SPACE, AcceptanceTest(max_failure_rate=0.05, confidence=0.9), certifier=PER_POINT)
    assert runs_needed(region, 0, 0) == (45, 5)  # 0.9 ** (1/45) >= 0.95 > 0.9 ** (1/44)
    assert runs_needed(region, 10, 0)[0] == 35
    more, reject = runs_needed(region, 40, 1)
    assert region.acceptance.decide_fixed(1, 41 + more) is Verdict.VALID
    assert region.acceptance.decide_fixed(1, 41 + more - 1) is not Verdict.VALID
    assert region.acceptance.decide_fixed(1 + reject, 41 + more) is Verdict.INVALID


def test_plan_without_any_evidence_splits_the_space():
    (best,) = plan(ErrorRegion(SPACE, AcceptanceTest(), certifier=PER_POINT), top=1, run_length_m=100.0)
    u = SPACE.to_unit(best.candidate.errors)
    assert 0.1 < u.min() and u.max() < 0.6  # neither the zero corner nor the far corner
    assert 0.0 < best.score < 1.0 and best.runs == 45 and best.distance_m == 4500.0


def test_plan_tests_the_edge_of_the_simulator_region_first():
    region = _sim_region()
    proposals = plan(region, top=3)
    assert len(proposals) == 3
    best = proposals[0]
    # the most informative field trial sits in the simulator-valid region, near its frontier
    assert region.contains(best.candidate.errors)
    u = SPACE.to_unit(best.candidate.errors)
    assert u.max() >= 0.25
    scores = [p.score for p in proposals]
    assert scores == sorted(scores, reverse=True)
    units = [SPACE.to_unit(p.candidate.errors) for p in proposals]
    assert all(np.abs(a - b).max() >= 0.15 for i, a in enumerate(units) for b in units[i + 1:])


def test_plan_never_proposes_what_the_field_has_decided():
    region = _sim_region()
    runs = [_run(i, point={"heading": 12.0, "distance": 0.12}) for i in range(45)]
    apply_evidence(region, collect_evidence(runs, SPACE, GOAL).evidence)
    for p in plan(region, top=5):
        assert not (SPACE.to_unit(p.candidate.errors) <= SPACE.to_unit({"heading": 12.0, "distance": 0.12})).all()


def test_plan_scores_configurations_and_counts_logged_runs():
    region = _sim_region()
    runs = [_run(i, nn_errors={"heading": 11.0, "distance": 0.11}) for i in range(5)]
    apply_evidence(region, collect_evidence(runs, SPACE, GOAL).evidence)
    cfg = Candidate({"heading": 11.0, "distance": 0.11}, "config abc")
    (only,) = plan(region, [cfg], top=1, grid_points=False, run_length_m=100.0)
    assert only.kind == "configuration" and only.logged == (5, 0) and only.runs == 40
    assert only.distance_m == 4000.0


def test_plan_is_empty_when_the_field_decided_everything():
    region = ErrorRegion(SPACE, AcceptanceTest(), certifier=PER_POINT)
    runs = [_run(i, point={"heading": 30.0, "distance": 0.25}) for i in range(45)]
    apply_evidence(region, collect_evidence(runs, SPACE, GOAL).evidence)
    assert plan(region) == []
