"""LaneKeep's closed loop: the protocol, determinism, and that NN errors cause the failures they should."""

from __future__ import annotations

import numpy as np
import pytest

import qaopt
from qaopt.simulators.lanekeep import LaneKeepEvaluator, LaneKeepParamError, PerceptionError
from qaopt.simulators.lanekeep.evaluator import QOS_METRICS
from qaopt.simulators.lanekeep.world import Route
from qaopt.simulators.lanekeep.config import RoadParams

SEEDS = list(range(8))


def _gauss(sigma):
    def inject(truth, rng, t):
        return truth + sigma * rng.standard_normal(truth.shape)
    return inject


@pytest.fixture(scope="module")
def app():
    return LaneKeepEvaluator()


def test_keeps_the_application_protocol():
    qaopt.check_application(LaneKeepEvaluator(route_m=120.0), metric="violations")


def test_perfect_perception_has_no_violations(app):
    records = app.evaluate({}, SEEDS)
    assert [set(r) for r in records] == [set(QOS_METRICS)] * len(SEEDS)
    assert all(r["violations"] == 0 and r["time_ratio"] == 1.0 and r["distance_m"] == 300.0 for r in records)


def test_evaluate_is_deterministic_and_independent_of_the_batch(app):
    inj = {"lane": _gauss(0.2), "lead": _gauss(2.0)}
    assert app.evaluate(inj, SEEDS) == app.evaluate(inj, SEEDS)
    stop_only = {"stop": lambda t, rng, s: np.zeros_like(t)}
    assert app.evaluate(stop_only, [3]) == app.evaluate(stop_only, [5, 3])[1:]


def test_routes_keep_stops_apart_and_away_from_the_lead():
    road = RoadParams()
    for seed in range(200):
        r = Route.from_seed(road, 300.0, seed)
        stops = r.stops[np.isfinite(r.stops)]
        assert 1 <= len(stops) <= 2 and np.all(stops >= 60.0) and np.all(stops <= 285.0)
        assert np.all(np.diff(stops) >= 80.0)
        if r.has_lead:
            assert r.lead[1] + road.stop_approach_m <= stops[0] + 1e-9


def test_large_lane_errors_depart_the_lane(app):
    records = app.evaluate({"lane": _gauss(1.0)}, SEEDS)
    assert sum(r["lane_departures"] for r in records) > 0
    assert all(r["collisions"] == 0 and r["missed_stops"] == 0 for r in records)


def test_a_blind_stop_detector_misses_every_stop(app):
    records = app.evaluate({"stop": lambda t, rng, s: np.zeros_like(t)}, SEEDS)
    assert all(r["missed_stops"] >= 1 for r in records)
    assert all(r["collisions"] == 0 and r["lane_departures"] == 0 for r in records)


def test_false_alarms_make_phantom_stops_and_cost_time(app):
    def flicker(t, rng, s):
        return np.where(rng.random(t.shape) < 0.3, 1.0 - t, t)

    records = app.evaluate({"stop": flicker}, SEEDS)
    assert all(r["phantom_stops"] >= 1 for r in records)
    assert np.mean([r["time_ratio"] for r in records]) > 1.3
    assert all(r["violations"] >= 1 for r in records)


def test_a_lead_seen_30m_too_far_is_hit_when_it_brakes(app):
    records = app.evaluate({"lead": lambda t, rng, s: t + 30.0}, SEEDS)
    assert sum(r["collisions"] > 0 for r in records) >= len(SEEDS) // 2


def test_bad_params_name_the_param():
    with pytest.raises(LaneKeepParamError, match="'route_m'"):
        LaneKeepEvaluator(route_m=-3)
    with pytest.raises(LaneKeepParamError, match="'stack.debounce_frames'"):
        LaneKeepEvaluator(stack={"debounce_frames": 0})
    with pytest.raises(LaneKeepParamError, match="'camera.hfov_deg'"):
        LaneKeepEvaluator(camera={"hfov_deg": "wide"})
    with pytest.raises(LaneKeepParamError, match="'road.bogus'"):
        LaneKeepEvaluator(road={"bogus": 1})
    with pytest.raises(LaneKeepParamError, match="'seeds'"):
        LaneKeepEvaluator().evaluate({}, [-1])
    with pytest.raises(PerceptionError, match="'steer'"):
        LaneKeepEvaluator().evaluate({"steer": _gauss(1.0)}, [0])
    with pytest.raises(PerceptionError, match="'lead'.*not finite"):
        LaneKeepEvaluator(route_m=50.0).evaluate({"lead": lambda t, rng, s: t * np.nan}, [0])


def test_perception_runs_are_deterministic_and_perfect_nns_change_nothing():
    app = LaneKeepEvaluator(route_m=40.0)
    seen = []

    def oracle(images):  # an NN that outputs a constant lane offset of 0: reads frames, drives straight-ish
        seen.append(images.shape)
        return np.zeros(len(images), dtype=np.float32)

    a = app.evaluate_perception({"lane": oracle}, [0, 1])
    b = app.evaluate_perception({"lane": oracle}, [0, 1], render_threads=2)
    assert a == b
    assert seen[0] == (2, 3, 120, 160)
    assert app.evaluate_perception({}, [0, 1]) == app.evaluate({}, [0, 1])


def test_record_perception_keeps_frames_and_truth_in_time_order():
    app = LaneKeepEvaluator(route_m=60.0)
    rec = app.record_perception({}, [0, 1], steps=5)
    assert set(rec) == {"lane", "stop", "lead"}
    r = rec["lead"]
    assert r.truth.shape == (10, 1) and r.truth.dtype == np.float32
    assert [list(s) for s in r.sequences] == [list(range(5)), list(range(5, 10))]
    assert r.inputs[0].shape == (3, 120, 160) and r.inputs[0].dtype == np.float32
    assert set(np.unique(rec["stop"].truth)) <= {0.0, 1.0}
    with pytest.raises(LaneKeepParamError, match="'steps'"):
        app.record_perception({}, [0], steps=1)


def test_the_shipped_spec_validates(capsys):
    """`qaopt validate examples/lanekeep.yaml`: schema, entry points, and the simulator's protocol check."""
    from pathlib import Path

    from qaopt.cli import main

    spec = Path(__file__).resolve().parents[1] / "examples" / "lanekeep.yaml"
    with pytest.raises(SystemExit) as exit_:  # --no-shapes: the NNs' data would be rendered; the reference tests load them
        main(["validate", str(spec), "--no-shapes"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "NNs lane, stop, lead; error space (lane, stop, lead)" in out and "keeps the application protocol" in out
